-- A claim must commit before the work: the attempt it counts must survive the work's failure.
-- What jobcap does when the caller's transactions get in the way.
\set VERBOSITY terse
SELECT setval(pg_get_serial_sequence('jobcap.jobs', 'job_id'), 5000, false) IS NOT NULL AS ids_reset,
       setval('jobcap.fences', 500, false) IS NOT NULL AS fences_reset;
SELECT jobcap.create_queue('tx', max_attempts => 3, backoff_base => '0', backoff_max => '0');
SELECT jobcap.enqueue_job('tx') AS job \gset

-- 1. A claim rolled back together with its work: its fence is never handed out again, so the
-- worker that held it cannot complete the job after someone else claims it.
BEGIN;
SELECT fence AS rolled_back FROM jobcap.claim_job('tx', 'a') \gset
ROLLBACK;
SELECT fence AS current FROM jobcap.claim_job('tx', 'b') \gset
SELECT :current > :rolled_back AS new_fence;
SELECT jobcap.complete_job(:job, :rolled_back);
\echo :LAST_ERROR_SQLSTATE
SELECT jobcap.complete_job(:job, :current);

-- 2. Inside a savepoint or an exception block the rollback would undo the count: refused.
SELECT jobcap.enqueue_job('tx') AS job2 \gset
BEGIN;
SAVEPOINT work;
SELECT * FROM jobcap.claim_job('tx', 'c');
ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
DO $$
BEGIN
  BEGIN
    PERFORM jobcap.claim_job('tx', 'd');
  EXCEPTION WHEN division_by_zero THEN
    NULL;
  END;
END $$;
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM jobcap.claim_job_by_id(:job2, 'e') WHERE false;
BEGIN;
SAVEPOINT s;
SELECT * FROM jobcap.claim_job_by_id(:job2, 'e');
ROLLBACK;
SELECT state, attempts FROM jobcap.jobs WHERE job_id = :job2;

-- 3. A worker written as a procedure that commits between calls: leases, due times and history
-- follow the clock of each call, not the start of the CALL.
CREATE PROCEDURE slow_worker() LANGUAGE plpgsql AS $$
DECLARE
  j record;
  id bigint;
BEGIN
  PERFORM pg_sleep(1.2);
  id := jobcap.enqueue_job('tx', run_at => clock_timestamp());
  COMMIT;
  SELECT * INTO j FROM jobcap.claim_job('tx', 'proc', lease => '1 second');
  RAISE NOTICE 'claimed the job enqueued after CALL began: %', j.job_id = id;
  RAISE NOTICE 'lease runs into the future: %', j.lease_expires_at - clock_timestamp() > interval '0.5 seconds';
  COMMIT;
  PERFORM pg_sleep(0.6);
  RAISE NOTICE 'heartbeat extends past the clock: %',
    jobcap.heartbeat(j.job_id, j.fence) - clock_timestamp() > interval '0.5 seconds';
  COMMIT;
  RAISE NOTICE 'reaper leaves the live lease alone: %', NOT EXISTS (SELECT FROM jobcap.reap_jobs());
  PERFORM jobcap.complete_job(j.job_id, j.fence);
END $$;
SELECT jobcap.cancel_job(:job2);
CALL slow_worker();
DROP PROCEDURE slow_worker();

-- 4. A transaction that claimed cannot be prepared: its fate would be decided in another
-- session. Without the preload the rolled-back claim is not counted (the documented limit).
SELECT jobcap.enqueue_job('tx') AS job3 \gset
BEGIN;
SELECT count(*) AS claimed FROM jobcap.claim_job_by_id(:job3, 'p');
PREPARE TRANSACTION 'claimed';
SELECT count(*) AS prepared FROM pg_prepared_xacts;
SELECT state, attempts FROM jobcap.jobs WHERE job_id = :job3;
-- A transaction that claimed nothing prepares as before.
BEGIN;
SELECT jobcap.cancel_job(:job3);
PREPARE TRANSACTION 'cancelled';
COMMIT PREPARED 'cancelled';
SELECT state FROM jobcap.jobs WHERE job_id = :job3;
SELECT jobcap.drop_queue('tx', force => true);
