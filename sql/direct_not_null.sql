-- A DBA's NOT NULL on a column of jobcap.jobs that the hot path writes NULL to: fail_job and
-- crash_job of a job that retries write finished_at NULL (complete_job and the failures write
-- lease_expires_at NULL, complete_job without an output writes output NULL). The executor
-- refuses such a version (23502), and so must the direct path, or a row it wrote would then make
-- every SQL statement that updates it fail. Expected as the SQL path answers. Everything runs in
-- one transaction that is rolled back: SET NOT NULL needs every row's finished_at set, other
-- suites' rows too.
\set VERBOSITY terse
SELECT jobcap.create_queue('not_null', max_attempts => 3);
BEGIN;
ALTER TABLE jobcap.jobs ALTER COLUMN finished_at SET DEFAULT '2000-01-01 00:00:00+00';
UPDATE jobcap.jobs SET finished_at = '2000-01-01 00:00:00+00' WHERE finished_at IS NULL;
ALTER TABLE jobcap.jobs ALTER COLUMN finished_at SET NOT NULL;
SELECT count(*) AS enqueued FROM unnest(jobcap.enqueue_jobs('not_null',
    ARRAY['{"n": 1}', '{"n": 2}', '{"n": 3}']::jsonb[]));
SELECT job_id AS j1, fence AS f1 FROM jobcap.claim_job('not_null', 'w') \gset
SELECT job_id AS j2, fence AS f2 FROM jobcap.claim_job('not_null', 'w') \gset
SELECT job_id AS j3, fence AS f3 FROM jobcap.claim_job('not_null', 'w') \gset
SELECT jobcap.enqueue_job('not_null', max_attempts => 1) > 0 AS enqueued;
SELECT job_id AS jd, fence AS fd FROM jobcap.claim_job('not_null', 'w') \gset
-- A retry would write finished_at NULL: refused on both paths.
SAVEPOINT retry;
SELECT jobcap.fail_job(:j1, :f1, 'boom');
ROLLBACK TO retry;
SELECT jobcap.crash_job(:j2, :f2, 'gone');
ROLLBACK TO retry;
-- The job is still running, unchanged.
SELECT state, finished_at FROM jobcap.jobs WHERE job_id = :j1;
-- A failure that kills the job (its last attempt) writes finished_at: allowed.
SELECT jobcap.fail_job(:jd, :fd, 'boom');
-- complete_job writes finished_at: allowed.
SELECT jobcap.complete_job(:j3, :f3);
SELECT heartbeat IS NOT NULL AS extended FROM jobcap.heartbeat(:j2, :f2) AS heartbeat;
ROLLBACK;
-- NOT NULL on output: complete_job without an output writes NULL there.
SELECT jobcap.enqueue_job('not_null') > 0 AS enqueued;
BEGIN;
UPDATE jobcap.jobs SET output = '{}' WHERE output IS NULL;
ALTER TABLE jobcap.jobs ALTER COLUMN output SET NOT NULL;
SELECT job_id AS j4, fence AS f4 FROM jobcap.claim_job('not_null', 'w') \gset
SAVEPOINT done;
SELECT jobcap.complete_job(:j4, :f4);
ROLLBACK TO done;
SELECT jobcap.complete_job(:j4, :f4, output => '{"kept": true}');
ROLLBACK;
SELECT jobcap.drop_queue('not_null', force => true);
