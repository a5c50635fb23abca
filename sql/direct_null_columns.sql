-- jobcap.jobs.payload made nullable by a DBA (a service that inserts jobs by hand then leaves
-- it NULL): a direct claim hands the NULL payload to the result as a non-null jsonb, and
-- heap_form_tuple crashes the server. The SQL path raises a clean error.
-- (Last in REGRESS: on the direct path it crashes the server.)
\set VERBOSITY terse
SELECT jobcap.create_queue('null_columns', max_attempts => 3);
SELECT jobcap.enqueue_job('null_columns') > 0 AS enqueued;
ALTER TABLE jobcap.jobs ALTER COLUMN payload DROP NOT NULL;
UPDATE jobcap.jobs SET payload = NULL WHERE queue = 'null_columns';
SELECT count(*) AS claimed FROM jobcap.claim_job('null_columns', 'w');
UPDATE jobcap.jobs SET payload = '{}' WHERE queue = 'null_columns';
ALTER TABLE jobcap.jobs ALTER COLUMN payload SET NOT NULL;
SELECT jobcap.drop_queue('null_columns', force => true);
