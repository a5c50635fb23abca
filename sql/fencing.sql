-- Fencing: a worker whose lease was reaped and re-claimed is refused with SQLSTATE JC001 by
-- every fenced call, and what it wrote in the same transaction rolls back.
\set VERBOSITY default
SELECT jobcap.create_queue('charge', backoff_base => '0', backoff_max => '0');
-- Job ids appear in the messages below: start them at a known value.
SELECT setval(pg_get_serial_sequence('jobcap.jobs', 'job_id'), 1000, false) IS NOT NULL AS ids_reset,
       setval('jobcap.fences', 100, false) IS NOT NULL AS fences_reset;
CREATE TABLE charges (job_id bigint, fence bigint, note text);

SELECT jobcap.enqueue_job('charge', '{"amount": 100}') AS job \gset
SELECT fence AS old_fence FROM jobcap.claim_job('charge', 'slow-worker') \gset
-- The slow worker's lease expires; the reaper returns the job; another worker claims it.
UPDATE jobcap.jobs SET lease_expires_at = now() - interval '1 second' WHERE job_id = :job;
SELECT outcome FROM jobcap.reap_jobs();
SELECT fence AS new_fence, attempt FROM jobcap.claim_job('charge', 'fast-worker') \gset
SELECT :new_fence > :old_fence AS fence_bumped, :attempt AS attempt;

-- The slow worker wakes up and tries to finish: every fenced call is refused.
BEGIN;
INSERT INTO charges VALUES (:job, :old_fence, 'charged by the slow worker');
SELECT jobcap.complete_job(:job, :old_fence);
ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
SELECT jobcap.fail_job(:job, :old_fence, 'late failure');
\echo :LAST_ERROR_SQLSTATE
SELECT jobcap.heartbeat(:job, :old_fence);
\echo :LAST_ERROR_SQLSTATE
-- assert_fence in the same transaction as the worker's own write: COMMIT cannot keep it.
BEGIN;
INSERT INTO charges VALUES (:job, :old_fence, 'charged by the slow worker');
SELECT jobcap.assert_fence(:job, :old_fence);
COMMIT;
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS slow_effects FROM charges;

-- The current holder's writes commit with its completion.
BEGIN;
SELECT jobcap.assert_fence(:job, :new_fence);
INSERT INTO charges VALUES (:job, :new_fence, 'charged once');
SELECT jobcap.complete_job(:job, :new_fence);
COMMIT;
SELECT job_id = :job AS same_job, fence = :new_fence AS current_fence, note FROM charges;

-- After success, even the right fence is refused: nothing leaves succeeded.
SELECT jobcap.complete_job(:job, :new_fence);
\echo :LAST_ERROR_SQLSTATE
SELECT jobcap.fail_job(:job, :new_fence, 'too late');
\echo :LAST_ERROR_SQLSTATE
SELECT state, attempts, fence FROM jobcap.jobs WHERE job_id = :job;

-- The fence, not the worker name, decides: one worker re-claiming its own expired job.
SELECT jobcap.enqueue_job('charge') AS job2 \gset
SELECT fence AS first FROM jobcap.claim_job('charge', 'same-worker') \gset
UPDATE jobcap.jobs SET lease_expires_at = now() - interval '1 second' WHERE job_id = :job2;
SELECT count(*) AS reaped FROM jobcap.reap_jobs();
SELECT fence AS second FROM jobcap.claim_job('charge', 'same-worker') \gset
SELECT jobcap.complete_job(:job2, :first);
\echo :LAST_ERROR_SQLSTATE
SELECT jobcap.complete_job(:job2, :second);

-- A reaped but not yet re-claimed job refuses its old holder too, and a fence newer than the
-- job's (never its own, or from a claim that rolled back) is refused like a stale one.
SELECT jobcap.enqueue_job('charge') AS job3 \gset
SELECT fence AS f3 FROM jobcap.claim_job('charge', 'w') \gset
UPDATE jobcap.jobs SET lease_expires_at = now() - interval '1 second' WHERE job_id = :job3;
SELECT count(*) AS reaped FROM jobcap.reap_jobs();
SELECT jobcap.heartbeat(:job3, :f3);
SELECT fence AS f3 FROM jobcap.claim_job('charge', 'w') \gset
SELECT jobcap.complete_job(:job3, :f3 + 100);
SELECT jobcap.complete_job(:job3, :f3);

-- An expired lease that the reaper has not reached yet is still the current one.
SELECT jobcap.enqueue_job('charge') AS job4 \gset
SELECT fence AS f4 FROM jobcap.claim_job('charge', 'w') \gset
UPDATE jobcap.jobs SET lease_expires_at = now() - interval '1 second' WHERE job_id = :job4;
SELECT jobcap.heartbeat(:job4, :f4) > now() AS renewed;
SELECT jobcap.complete_job(:job4, :f4);

DROP TABLE charges;
SELECT jobcap.drop_queue('charge', force => true);
