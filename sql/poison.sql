-- A poison job stops at exactly max_attempts, however its attempts end.
\set VERBOSITY terse
SELECT jobcap.create_queue('media', max_attempts => 3, backoff_base => '0', backoff_max => '0');

-- 1. Its worker never reports back (SIGKILL, hard timeout): only the reaper sees it. The claim
-- committed the count before any work, so every silent death still counts.
SELECT jobcap.enqueue_job('media', '{"file": "corrupt.mp4"}') AS poison \gset
SELECT attempt, max_attempts FROM jobcap.claim_job('media', 'decoder-1');
UPDATE jobcap.jobs SET lease_expires_at = now() - interval '1 second' WHERE job_id = :poison;
SELECT job_id = :poison AS poison, outcome FROM jobcap.reap_jobs();
SELECT attempt FROM jobcap.claim_job('media', 'decoder-2');
UPDATE jobcap.jobs SET lease_expires_at = now() - interval '1 second' WHERE job_id = :poison;
SELECT job_id = :poison AS poison, outcome FROM jobcap.reap_jobs();
SELECT attempt FROM jobcap.claim_job('media', 'decoder-3');
UPDATE jobcap.jobs SET lease_expires_at = now() - interval '1 second' WHERE job_id = :poison;
SELECT job_id = :poison AS poison, outcome FROM jobcap.reap_jobs();
SELECT state, attempts FROM jobcap.jobs WHERE job_id = :poison;
-- Dead is quiet: nothing to claim, nothing to reap, however often they run.
SELECT count(*) AS claimed FROM jobcap.claim_job('media', 'decoder-4');
SELECT count(*) AS reaped FROM jobcap.reap_jobs();
SELECT count(*) AS reaped FROM jobcap.reap_jobs();
-- Its history tells a crash from an error.
SELECT attempt, kind, worker, error FROM jobcap.job_errors WHERE job_id = :poison ORDER BY seq;
SELECT attempts, max_attempts, last_outcome FROM jobcap.dead_jobs WHERE job_id = :poison;

-- 2. Its worker reports each failure.
SELECT jobcap.enqueue_job('media', '{"file": "also-corrupt.mp4"}') AS failing \gset
SELECT attempt, fence FROM jobcap.claim_job('media', 'decoder-1') \gset
SELECT :attempt AS attempt, jobcap.fail_job(:failing, :fence, 'decode error');
SELECT attempt, fence FROM jobcap.claim_job('media', 'decoder-1') \gset
SELECT :attempt AS attempt, jobcap.fail_job(:failing, :fence, 'decode error');
SELECT attempt, fence FROM jobcap.claim_job('media', 'decoder-1') \gset
SELECT :attempt AS attempt, jobcap.fail_job(:failing, :fence, 'decode error');
SELECT state, attempts FROM jobcap.jobs WHERE job_id = :failing;
SELECT count(*) AS claimed FROM jobcap.claim_job('media', 'decoder-1');
SELECT count(*) AS reaped FROM jobcap.reap_jobs();

-- 3. Mixed: errors and silent deaths share one budget. A job's own cap beats its queue's.
SELECT jobcap.enqueue_job('media', max_attempts => 2) AS mixed \gset
SELECT attempt, fence FROM jobcap.claim_job('media', 'd') \gset
SELECT jobcap.fail_job(:mixed, :fence, 'once');
SELECT attempt, max_attempts FROM jobcap.claim_job('media', 'd');
UPDATE jobcap.jobs SET lease_expires_at = now() - interval '1 second' WHERE job_id = :mixed;
SELECT job_id = :mixed AS mixed, outcome FROM jobcap.reap_jobs();
SELECT state, attempts FROM jobcap.jobs WHERE job_id = :mixed;

-- 4. However a job gets back to pending, the claim will not run it past its cap: here a hand
-- UPDATE revives a dead job without raising its budget.
UPDATE jobcap.jobs SET state = 'pending', finished_at = NULL WHERE job_id = :poison;
SELECT count(*) AS claimed FROM jobcap.claim_job('media', 'decoder-5');
SELECT job_id = :poison AS poison, outcome FROM jobcap.reap_jobs();

SELECT jobcap.drop_queue('media', force => true);
