-- jobcap.job_errors published (deletes) with REPLICA IDENTITY NOTHING. The SQL path's DELETE
-- checks the replica identity when the executor opens the table (CheckValidResultRel), so every
-- fail_job raises 55000, even with no history row to prune. The direct path checks only before
-- it deletes a row: the first failure of a job succeeds.
\set VERBOSITY terse
SET jobcap.hot_path = direct;
SELECT jobcap.create_queue('replica_identity', max_attempts => 10, backoff_base => '0', backoff_max => '0');
ALTER TABLE jobcap.job_errors REPLICA IDENTITY NOTHING;
SET client_min_messages = error;  -- wal_level may be below logical
CREATE PUBLICATION job_errors_pub FOR TABLE jobcap.job_errors;
RESET client_min_messages;
SELECT jobcap.enqueue_job('replica_identity', '{}') AS j \gset
SELECT jobcap.fail_job(:j, fence, 'e1', retry_in => '0') FROM jobcap.claim_job('replica_identity', 'w');
SELECT state, attempts FROM jobcap.jobs WHERE queue = 'replica_identity';
SELECT attempt, kind, error FROM jobcap.job_errors WHERE queue = 'replica_identity' ORDER BY seq;
-- error_history = 0: nothing is ever inserted, the DELETE still runs.
SET jobcap.error_history = 0;
SELECT jobcap.crash_job(:j, fence, 'c1') FROM jobcap.claim_job('replica_identity', 'w');
RESET jobcap.error_history;
DROP PUBLICATION job_errors_pub;
ALTER TABLE jobcap.job_errors REPLICA IDENTITY DEFAULT;
SELECT jobcap.drop_queue('replica_identity', force => true);
DELETE FROM jobcap.job_errors WHERE queue = 'replica_identity';
