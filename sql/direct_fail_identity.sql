-- jobcap.job_errors is published (updates and deletes) with REPLICA IDENTITY NOTHING; jobcap.jobs
-- is fine. fail_job with a fence that is not current: the SQL statement's history CTE (DELETE
-- FROM jobcap.job_errors) checks the replica identity when the statement starts, whether or not
-- the job fails, and raises 55000. The direct path checks it only in add_history, which runs
-- when the job did fail, and raises JC001 (fence not current) instead.
\set VERBOSITY sqlstate
SELECT jobcap.create_queue('fail_identity');
SELECT jobcap.enqueue_job('fail_identity', '{}') AS j \gset
CREATE PUBLICATION job_errors_pub FOR TABLE jobcap.job_errors;
ALTER TABLE jobcap.job_errors REPLICA IDENTITY NOTHING;
-- The job is pending: fence 0 is not current. SQL path: 55000.
SELECT jobcap.fail_job(:j, 0, 'x');
-- A job that does not exist: SQL path: 55000 too.
SELECT jobcap.fail_job(:j + 1000000, 1, 'x');
ALTER TABLE jobcap.job_errors REPLICA IDENTITY DEFAULT;
DROP PUBLICATION job_errors_pub;
SELECT jobcap.drop_queue('fail_identity', force => true);
