-- A DBA re-creates jobcap.job_errors_job as a partial index. The SQL path's DELETE cannot use
-- a partial index whose predicate its WHERE clause does not imply, so it prunes every row of the
-- job. The direct path scans job_errors_job itself and sees only the rows in the index.
\set VERBOSITY terse
SET jobcap.hot_path = direct;
SELECT jobcap.create_queue('partial_prune', max_attempts => 10, backoff_base => '0', backoff_max => '0');
DROP INDEX jobcap.job_errors_job;
CREATE INDEX job_errors_job ON jobcap.job_errors (job_id, seq) WHERE kind <> 'crashed';
SET jobcap.error_history = 2;
SELECT jobcap.enqueue_job('partial_prune', '{}') AS j \gset
SELECT jobcap.crash_job(:j, fence, 'c1') FROM jobcap.claim_job('partial_prune', 'w');
SELECT jobcap.crash_job(:j, fence, 'c2') FROM jobcap.claim_job('partial_prune', 'w');
SELECT jobcap.fail_job(:j, fence, 'e3', retry_in => '0') FROM jobcap.claim_job('partial_prune', 'w');
SELECT jobcap.fail_job(:j, fence, 'e4', retry_in => '0') FROM jobcap.claim_job('partial_prune', 'w');
-- SQL path: e3, e4 only (the newest 2).
SELECT attempt, kind, error FROM jobcap.job_errors WHERE queue = 'partial_prune' ORDER BY seq;
RESET jobcap.error_history;
DROP INDEX jobcap.job_errors_job;
CREATE INDEX job_errors_job ON jobcap.job_errors (job_id, seq);
SELECT jobcap.drop_queue('partial_prune', force => true);
DELETE FROM jobcap.job_errors WHERE queue = 'partial_prune';
