-- The direct path finds jobcap.jobs' columns by name. A column whose type is not the one it was
-- written for (here claimed_at changed to text by a DBA) must send the call to the SQL path,
-- which converts or refuses; writing a timestamptz Datum into a text column crashes the server.
-- The expected output is the SQL path's (jobcap.hot_path = sql).
\set VERBOSITY terse
SELECT jobcap.create_queue('column_types', max_attempts => 3);
SELECT jobcap.enqueue_job('column_types') > 0 AS enqueued;
ALTER TABLE jobcap.jobs ALTER COLUMN claimed_at TYPE text;
SELECT count(*) AS claimed FROM jobcap.claim_job('column_types', 'w');
SELECT state, claimed_at IS NOT NULL AS has_claimed_at FROM jobcap.jobs WHERE queue = 'column_types';
ALTER TABLE jobcap.jobs ALTER COLUMN claimed_at TYPE timestamptz USING claimed_at::timestamptz;
SELECT jobcap.drop_queue('column_types', force => true);
