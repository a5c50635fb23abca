-- release_job gives back a claimed job whose handler never started: pending again, the claim's
-- attempt not counted, the fence stale for good (the next claim takes a newer one), a history
-- row of kind 'released'. crash_job ends an attempt whose handler's process died: it counts, and
-- the history says 'crashed'. Every fenced rule holds for both: a stale fence raises JC001.
\set VERBOSITY default
SELECT jobcap.create_queue('give', max_attempts => 2, backoff_base => '0', backoff_max => '0');
SELECT setval(pg_get_serial_sequence('jobcap.jobs', 'job_id'), 2000, false) IS NOT NULL AS ids_reset,
       setval('jobcap.fences', 300, false) IS NOT NULL AS fences_reset;

-- A batch of three claimed; the first started, the other two are given back.
SELECT jobcap.enqueue_job('give', jsonb_build_object('n', n)) FROM generate_series(1, 3) n;
CREATE TEMP TABLE claimed AS SELECT * FROM jobcap.claim_job('give', 'w1', 3);
SELECT job_id, fence, attempt FROM claimed ORDER BY job_id;
SELECT jobcap.release_job(job_id, fence) FROM claimed WHERE job_id > 2000 ORDER BY job_id;
SELECT job_id, state, attempts, fence, lease_expires_at IS NULL AS no_lease
  FROM jobcap.jobs ORDER BY job_id;
SELECT job_id, attempt, fence, kind, worker, error FROM jobcap.job_errors ORDER BY seq;

-- The released fence is stale for every fenced call, release_job included.
SELECT jobcap.release_job(2001, 301);
\echo :LAST_ERROR_SQLSTATE
SELECT jobcap.complete_job(2001, 301);
\echo :LAST_ERROR_SQLSTATE
SELECT jobcap.heartbeat(2001, 301);
\echo :LAST_ERROR_SQLSTATE
SELECT jobcap.crash_job(2001, 301, 'killed by signal 9');
\echo :LAST_ERROR_SQLSTATE

-- The next claim takes a newer fence than any handed out before; the attempt is the first again.
SELECT job_id, fence > 302 AS newer_fence, attempt FROM jobcap.claim_job('give', 'w2', 2)
 ORDER BY job_id;

-- Released again and again, a job never nears its cap: releases are not attempts. Crashes are:
-- with max_attempts 2, two crashes make the job dead, and dead_jobs counts them as crashes.
SELECT jobcap.release_job(2001, fence) FROM jobcap.jobs WHERE job_id = 2001;
SELECT jobcap.release_job(2002, fence) FROM jobcap.jobs WHERE job_id = 2002;
SELECT attempt FROM jobcap.claim_job_by_id(2001, 'w3');
SELECT jobcap.crash_job(2001, fence, 'killed by signal 9') FROM jobcap.jobs WHERE job_id = 2001;
SELECT attempt FROM jobcap.claim_job_by_id(2001, 'w3');
SELECT jobcap.crash_job(2001, fence, 'killed by signal 11') FROM jobcap.jobs WHERE job_id = 2001;
SELECT job_id, attempts, max_attempts, last_outcome, last_error, errors, crashes
  FROM jobcap.dead_jobs;
SELECT attempt, kind, error FROM jobcap.job_errors WHERE job_id = 2001 ORDER BY seq;
SELECT queue, lost_leases, crashed_jobs, failed_attempts FROM jobcap.queue_stats WHERE queue = 'give';

-- A released job and a crashed one side by side: only the crash counts.
SELECT jobcap.enqueue_job('give', '{"pair": true}', max_attempts => 1) AS one_shot \gset
SELECT fence AS f FROM jobcap.claim_job_by_id(:one_shot, 'w4') \gset
SELECT jobcap.release_job(:one_shot, :f);
SELECT fence AS f FROM jobcap.claim_job_by_id(:one_shot, 'w4') \gset
SELECT jobcap.crash_job(:one_shot, :f, 'killed by signal 9');
SELECT state, attempts FROM jobcap.jobs WHERE job_id = :one_shot;
SELECT count(*) AS no_claim FROM jobcap.claim_job_by_id(:one_shot, 'w4');

-- A settled job cannot be released, and a job whose lease the reaper took back neither.
SELECT jobcap.complete_job(2000, 300);
SELECT jobcap.release_job(2000, 300);
\echo :LAST_ERROR_SQLSTATE
SELECT fence AS f FROM jobcap.claim_job_by_id(2002, 'w5') \gset
UPDATE jobcap.jobs SET lease_expires_at = now() - interval '1 second' WHERE job_id = 2002;
SELECT job_id, outcome FROM jobcap.reap_jobs();
SELECT jobcap.release_job(2002, :f);
\echo :LAST_ERROR_SQLSTATE
SELECT state, attempts FROM jobcap.jobs WHERE job_id = 2002;

-- Bad input.
SELECT jobcap.release_job(NULL, 1);
SELECT jobcap.release_job(2002, NULL);
SELECT jobcap.release_job(-1, 1);
SELECT jobcap.release_job(999999, 1);
SELECT jobcap.crash_job(NULL, 1, 'x');
SELECT jobcap.crash_job(999999, 1, 'x');

-- Both statements are listed for EXPLAIN, and jobcap_worker may call both.
SELECT name, argtypes FROM jobcap.statements() WHERE name IN ('release_job', 'crash_job')
 ORDER BY name;
SELECT has_function_privilege('jobcap_worker', 'jobcap.release_job(bigint, bigint)', 'EXECUTE') AS worker_release,
       has_function_privilege('jobcap_worker', 'jobcap.crash_job(bigint, bigint, text)', 'EXECUTE') AS worker_crash,
       has_function_privilege('public', 'jobcap.release_job(bigint, bigint)', 'EXECUTE') AS public_release;

SELECT jobcap.drop_queue('give', force => true);
