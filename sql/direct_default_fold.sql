-- A DBA column whose constant default cannot be computed (it overflows). Only an INSERT
-- evaluates a default: on the SQL path enqueues fail (22003) and claims, completions and
-- heartbeats go on. The direct path folds every default while it learns the table's shape,
-- which claim_job, complete_job and heartbeat share with the enqueues, so all of them fail.
-- The expected output is the SQL path's.
\set VERBOSITY terse
SELECT jobcap.create_queue('default_fold', max_attempts => 3);
SELECT jobcap.enqueue_job('default_fold', '{"a": 1}') > 0 AS enqueued;
ALTER TABLE jobcap.jobs ADD COLUMN overflowing_default int;
ALTER TABLE jobcap.jobs ALTER COLUMN overflowing_default SET DEFAULT 2147483647 + 1;
SELECT count(*) AS claimed FROM jobcap.claim_job('default_fold', 'w');
SELECT jobcap.enqueue_job('default_fold', '{"a": 2}') > 0 AS enqueued;
SELECT state FROM jobcap.jobs WHERE queue = 'default_fold' ORDER BY job_id;
ALTER TABLE jobcap.jobs DROP COLUMN overflowing_default;
-- The same through jobcap.job_errors (learn_errors folds its defaults for every call too).
SELECT jobcap.enqueue_job('default_fold', '{"a": 3}') > 0 AS enqueued;
ALTER TABLE jobcap.job_errors ADD COLUMN overflowing_default int;
ALTER TABLE jobcap.job_errors ALTER COLUMN overflowing_default SET DEFAULT 2147483647 + 1;
SELECT count(*) AS claimed FROM jobcap.claim_job('default_fold', 'w');
SELECT state, count(*) FROM jobcap.jobs WHERE queue = 'default_fold' GROUP BY 1 ORDER BY 1;
ALTER TABLE jobcap.job_errors DROP COLUMN overflowing_default;
SELECT jobcap.drop_queue('default_fold', force => true);
