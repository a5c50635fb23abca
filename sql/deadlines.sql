-- start_by: a job that no claim took by then is cancelled by the reaper (reason "expired"),
-- pending or waiting; a job claimed before, even one pending again for a retry, is not.
\set VERBOSITY terse
SELECT jobcap.create_queue('dl', max_attempts => 3, backoff_base => '0', backoff_max => '0');
SELECT jobcap.enqueue_job('dl', '{"n": 1}', start_by => now() + interval '1 hour') AS later \gset
SELECT jobcap.enqueue_job('dl', '{"n": 2}', start_by => now() + interval '1 hour', priority => -1) AS retried \gset
SELECT jobcap.enqueue_job('dl', '{"n": 3}', start_by => now() + interval '1 hour', priority => 5) AS never \gset
SELECT jobcap.enqueue_job('dl', '{"n": 4}', priority => -2) AS parent \gset
SELECT jobcap.enqueue_job('dl', '{"n": 5}', depends_on => ARRAY[:parent]::bigint[],
                          start_by => now() + interval '1 hour') AS waiting \gset
-- The parent and then the retried job are claimed (priority first); the second fails and is
-- pending again, with a first claim on record.
SELECT job_id = :parent AS parent_first FROM jobcap.claim_job('dl', 'w');
SELECT job_id = :retried AS retried_next, fence FROM jobcap.claim_job('dl', 'w') \gset
SELECT jobcap.fail_job(:retried, :fence, 'try again');
SELECT state, first_claimed_at IS NOT NULL AS claimed_before FROM jobcap.jobs WHERE job_id = :retried;
-- Their deadlines pass (moved back by hand).
UPDATE jobcap.jobs SET start_by = now() - interval '1 second'
 WHERE job_id IN (:retried, :never, :waiting);
SELECT count(*) AS reaped FROM jobcap.reap_jobs();
SELECT job_id = :later AS later, job_id = :retried AS retried, job_id = :never AS never,
       job_id = :waiting AS waiting, state
  FROM jobcap.jobs WHERE queue = 'dl' AND job_id <> :parent ORDER BY job_id;
SELECT j.job_id = :never AS never, e.kind, e.error
  FROM jobcap.job_errors e JOIN jobcap.jobs j USING (job_id)
 WHERE j.queue = 'dl' AND e.kind = 'cancelled' ORDER BY e.seq;
-- Nothing more on the next sweep: the retried job is left to its attempts.
SELECT count(*) AS reaped_again FROM jobcap.reap_jobs();
SELECT jobcap.drop_queue('dl', force => true);

-- The sweep walks jobs_start_by, on the plan jobcap keeps (generic, sequential and bitmap scans
-- and sorts off: src/spi/plans.hpp).
BEGIN;
SELECT count(set_config(g, 'off', true)) AS steered
  FROM unnest('{enable_seqscan,enable_bitmapscan,enable_sort,jit}'::text[]) g;
SELECT set_config('plan_cache_mode', 'force_generic_plan', true) IS NOT NULL AS generic;
DO $$
DECLARE
  s record;
BEGIN
  SELECT * INTO s FROM jobcap.statements() WHERE name = 'expire_unclaimed';
  EXECUTE format('PREPARE sweep(%s) AS %s', array_to_string(s.argtypes, ', '), s.sql);
END $$;
CREATE FUNCTION pg_temp.sweep_scans() RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
  line text;
BEGIN
  FOR line IN EXECUTE 'EXPLAIN (COSTS OFF) EXECUTE sweep(100, now())' LOOP
    IF line ~ 'Scan' AND line ~ 'jobs' THEN
      RETURN NEXT regexp_replace(line, '^[ ->]*', '');
    END IF;
  END LOOP;
END $$;
SELECT * FROM pg_temp.sweep_scans();
ROLLBACK;
