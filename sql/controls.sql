-- Queue controls: pause and resume, max_running, job output.
\set VERBOSITY terse
SELECT jobcap.create_queue('ctl', backoff_base => '0', backoff_max => '0');
SELECT count(jobcap.enqueue_job('ctl', jsonb_build_object('n', n))) FROM generate_series(1, 6) n;

-- Pause while a job runs: the claims hand out nothing, the running job settles normally, and
-- enqueue still works.
SELECT job_id AS running_job, fence AS running_fence FROM jobcap.claim_job('ctl', 'w') \gset
SELECT jobcap.pause_queue('ctl') AS paused;
SELECT jobcap.pause_queue('ctl') AS paused_again;
SELECT count(*) AS claimed FROM jobcap.claim_job('ctl', 'w', 10);
SELECT jobcap.enqueue_job('ctl', '{"n": 7}') AS paused_job \gset
SELECT count(*) AS claimed_by_id FROM jobcap.claim_job_by_id(:paused_job, 'w');
SELECT jobcap.heartbeat(:running_job, :running_fence) IS NOT NULL AS heartbeat_ok;
SELECT count(*) AS claimed_next
  FROM jobcap.complete_and_claim(:running_job, :running_fence, 'ctl', 'w');
SELECT state FROM jobcap.jobs WHERE job_id = :running_job;
SELECT queue, pending, running, paused, max_running FROM jobcap.queue_stats WHERE queue = 'ctl';
SELECT line FROM regexp_split_to_table(jobcap.metrics(), E'\n') line
 WHERE line LIKE 'jobcap_queue_%{queue="ctl"}%';
SELECT jobcap.resume_queue('ctl') AS resumed;
SELECT jobcap.resume_queue('ctl') AS resumed_again;
SELECT count(*) AS claimed FROM jobcap.claim_job('ctl', 'w', 2);
SELECT count(*) AS claimed_by_id FROM jobcap.claim_job_by_id(:paused_job, 'w');
SELECT paused FROM jobcap.queue_stats WHERE queue = 'ctl';
SELECT jobcap.pause_queue('nowhere');
SELECT jobcap.resume_queue(NULL);

-- max_running: at most N jobs of the queue run at once; a batch takes what fits.
SELECT jobcap.create_queue('capped', max_running => 2, backoff_base => '0', backoff_max => '0');
SELECT count(jobcap.enqueue_job('capped', jsonb_build_object('n', n))) FROM generate_series(1, 6) n;
SELECT array_agg(job_id ORDER BY job_id) AS ids, array_agg(fence ORDER BY job_id) AS fences
  FROM jobcap.claim_job('capped', 'w', 5) \gset
SELECT cardinality(:'ids'::bigint[]) AS claimed;
SELECT count(*) AS claimed_at_limit FROM jobcap.claim_job('capped', 'w', 5);
SELECT min(job_id) AS waiting FROM jobcap.jobs WHERE queue = 'capped' AND state = 'pending' \gset
SELECT count(*) AS claimed_by_id_at_limit FROM jobcap.claim_job_by_id(:waiting, 'w');
-- One completes: one slot frees, complete_and_claim takes it.
SELECT count(*) AS claimed_next
  FROM jobcap.complete_and_claim((:'ids'::bigint[])[1], (:'fences'::bigint[])[1], 'capped', 'w', 5);
SELECT count(*) AS running FROM jobcap.jobs WHERE queue = 'capped' AND state = 'running';
-- A failed job frees its slot too; claim_job_by_id takes it.
SELECT jobcap.fail_job((:'ids'::bigint[])[2], (:'fences'::bigint[])[2], 'boom');
SELECT max(job_id) AS waiting FROM jobcap.jobs WHERE queue = 'capped' AND state = 'pending' \gset
SELECT count(*) AS claimed_by_id FROM jobcap.claim_job_by_id(:waiting, 'w');
SELECT count(*) AS running FROM jobcap.jobs WHERE queue = 'capped' AND state = 'running';
-- Raising the limit makes room; a paused capped queue hands out nothing.
SELECT jobcap.alter_queue('capped', max_running => 3);
SELECT jobcap.pause_queue('capped');
SELECT count(*) AS claimed_paused FROM jobcap.claim_job('capped', 'w', 5);
SELECT jobcap.resume_queue('capped');
SELECT count(*) AS claimed FROM jobcap.claim_job('capped', 'w', 5);
SELECT queue, running, max_running FROM jobcap.queue_stats WHERE queue = 'capped';
-- The due jobs max_running holds back now (pending beyond the room left), and none for a rate.
SELECT pending, running, max_running, held_by_max_running, held_by_rate
  FROM jobcap.queue_stats WHERE queue = 'capped';
SELECT line FROM regexp_split_to_table(jobcap.metrics(), E'\n') line
 WHERE line LIKE 'jobcap_jobs_held_by_max_running{queue="capped"}%';
SELECT line FROM regexp_split_to_table(jobcap.metrics(), E'\n') line
 WHERE line LIKE 'jobcap_queue_max_running%';
-- The plans, as jobcap makes them (generic, steered; plans.sql has the probes in full): the
-- claims of an open queue and of a capped one both walk the claim index under LIMIT and
-- LockRows, with the queue's controls as one-time filters (InitPlans); neither scans the queue
-- table per row.
CREATE FUNCTION plan_lines(stmt text, args text) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
  s record;
  l text;
BEGIN
  SELECT * INTO s FROM jobcap.statements() st WHERE st.name = stmt;
  PERFORM set_config(g, 'off', true)
     FROM unnest('{enable_seqscan,enable_bitmapscan,enable_sort,jit}'::text[]) g;
  PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
  EXECUTE format('PREPARE probe(%s) AS %s', array_to_string(s.argtypes, ', '), s.sql);
  FOR l IN EXECUTE format('EXPLAIN (COSTS OFF) EXECUTE probe(%s)', args) LOOP
    IF l ~ 'Limit|LockRows|Scan|One-Time Filter' THEN
      -- Parameters as $n: PostgreSQL 17 and later name an InitPlan's output (InitPlan 1).col1.
      RETURN NEXT regexp_replace(regexp_replace(l, '\(InitPlan \d+\)\.col\d+', '$n', 'g'),
                                 '\$\d+', '$n', 'g');
    END IF;
  END LOOP;
  DEALLOCATE probe;
END $$;
SELECT plan_lines('claim_job', $$now(), 'w', NULL, 'capped', 5, NULL, '{}'$$);
SELECT plan_lines('claim_job_capped', $$now(), 'w', NULL, 'capped', 5, NULL, '{}'$$);
DROP FUNCTION plan_lines(text, text);
-- 0 removes the limit; NULL leaves it as it is.
SELECT jobcap.alter_queue('capped', max_running => 0);
SELECT max_running FROM jobcap.queues WHERE queue = 'capped';
SELECT count(*) AS claimed_unlimited FROM jobcap.claim_job('capped', 'w', 5);
SELECT jobcap.alter_queue('capped', max_running => 1);
SELECT jobcap.alter_queue('capped', lease => '1 minute');
SELECT max_running FROM jobcap.queues WHERE queue = 'capped';
SELECT jobcap.alter_queue('capped', max_running => -1);
SELECT jobcap.create_queue('capped2', max_running => 1000001);
SELECT jobcap.create_queue('capped2', max_running => 0);
SELECT max_running FROM jobcap.queues WHERE queue = 'capped2';

-- Job output: kept with the job, bounded by jobcap.max_output_bytes, NULL when none is given.
SELECT jobcap.create_queue('out');
SELECT count(jobcap.enqueue_job('out', jsonb_build_object('n', n))) FROM generate_series(1, 8) n;
SELECT job_id, fence FROM jobcap.claim_job('out', 'w') \gset
SELECT jobcap.complete_job(:job_id, :fence, '{"rows": 42}');
SELECT output FROM jobcap.jobs WHERE job_id = :job_id;
SELECT job_id, fence FROM jobcap.claim_job('out', 'w') \gset
SELECT jobcap.complete_job(:job_id, :fence);
SELECT output IS NULL AS no_output FROM jobcap.jobs WHERE job_id = :job_id;
-- Too large: replaced by a marker that is still jsonb. The payload is not copied.
SET jobcap.max_output_bytes = 64;
SELECT job_id, fence FROM jobcap.claim_job('out', 'w') \gset
SELECT jobcap.complete_job(:job_id, :fence, jsonb_build_object('text', repeat('x', 100)));
SELECT output, payload FROM jobcap.jobs WHERE job_id = :job_id;
RESET jobcap.max_output_bytes;
SHOW jobcap.max_output_bytes;
-- A stale fence keeps nothing.
\set VERBOSITY sqlstate
SELECT jobcap.complete_job(:job_id, :fence, '{"late": true}');
\set VERBOSITY terse
SELECT output FROM jobcap.jobs WHERE job_id = :job_id;
-- complete_and_claim and complete_jobs keep outputs too.
SELECT job_id, fence FROM jobcap.claim_job('out', 'w') \gset
SELECT job_id AS next_job, fence AS next_fence
  FROM jobcap.complete_and_claim(:job_id, :fence, 'out', 'w', output => '"done"') \gset
SELECT output FROM jobcap.jobs WHERE job_id = :job_id;
SELECT array_agg(job_id ORDER BY job_id) AS ids, array_agg(fence ORDER BY job_id) AS fences
  FROM jobcap.claim_job('out', 'w', 2) \gset
SELECT jobcap.complete_jobs(:'ids', :'fences', ARRAY['{"i": 1}', NULL]::jsonb[]);
SELECT output FROM jobcap.jobs
 WHERE job_id = ANY (:'ids') ORDER BY job_id;
SELECT jobcap.complete_jobs(ARRAY[:next_job]::bigint[], ARRAY[:next_fence]::bigint[], ARRAY['1', '2']::jsonb[]);
SELECT jobcap.complete_jobs(ARRAY[:next_job]::bigint[], ARRAY[:next_fence]::bigint[], NULL);
SELECT state, output IS NULL AS no_output FROM jobcap.jobs WHERE job_id = :next_job;

-- The 0.1.0 declarations (two arguments; six for the queue functions) still reach the C code.
CREATE FUNCTION old_complete_job(bigint, bigint) RETURNS jobcap.job_state
  LANGUAGE C AS '$libdir/jobcap', 'jobcap_complete_job';
CREATE FUNCTION old_create_queue(text, integer, interval, interval, interval, boolean) RETURNS void
  LANGUAGE C AS '$libdir/jobcap', 'jobcap_create_queue';
SELECT job_id, fence FROM jobcap.claim_job('out', 'w') \gset
SELECT old_complete_job(:job_id, :fence);
SELECT old_create_queue('old', 3, '1 minute', '1 second', '1 minute', false);
SELECT max_attempts, max_running, paused FROM jobcap.queues WHERE queue = 'old';
DROP FUNCTION old_complete_job(bigint, bigint);
DROP FUNCTION old_create_queue(text, integer, interval, interval, interval, boolean);

-- Operators only: a worker role may complete with an output, not pause, cap or schedule.
CREATE ROLE regress_controls_worker NOLOGIN IN ROLE jobcap_worker;
SELECT jobcap.enqueue_job('old') AS other_job \gset
SELECT jobcap.grant_queue('out', 'regress_controls_worker');
SET ROLE regress_controls_worker;
\set VERBOSITY sqlstate
SELECT jobcap.pause_queue('out');
SELECT jobcap.resume_queue('out');
SELECT jobcap.alter_queue('out', max_running => 1);
SELECT jobcap.schedule_job('w', '* * * * *', 'out');
SELECT jobcap.run_schedules();
\set VERBOSITY terse
SELECT jobcap.enqueue_job('out') AS worker_job \gset
SELECT job_id, fence FROM jobcap.claim_job('out', 'w') \gset
SELECT jobcap.complete_job(:job_id, :fence, '{"by": "worker"}');
-- The enqueuing side reads a result through job_result, not the table; a failure shows its error.
SELECT state, attempts, output, error, finished_at IS NOT NULL AS finished
  FROM jobcap.job_result(:job_id);
SELECT jobcap.enqueue_job('out', '{"to": "a@example.com"}') AS failing \gset
SELECT fence FROM jobcap.claim_job('out', 'w') \gset
SELECT jobcap.fail_job(:failing, :fence, 'smtp refused');
SELECT state, attempts, output, error, finished_at FROM jobcap.job_result(:failing);
-- A job of a queue not granted and a job that does not exist are refused alike.
\set VERBOSITY sqlstate
SELECT output FROM jobcap.jobs WHERE job_id = :job_id;
SELECT * FROM jobcap.job_result(:other_job);
SELECT * FROM jobcap.job_result(:other_job + 1000000);
SELECT * FROM jobcap.job_result(NULL);
\set VERBOSITY terse
RESET ROLE;
\set VERBOSITY sqlstate
SELECT * FROM jobcap.job_result(:other_job + 1000000);
\set VERBOSITY terse
SELECT state, attempts FROM jobcap.job_result(:other_job);
SELECT output FROM jobcap.jobs WHERE job_id = :job_id;
SELECT jobcap.revoke_queue('out', 'regress_controls_worker');
DROP ROLE regress_controls_worker;

SELECT count(*) AS dropped FROM (SELECT jobcap.drop_queue(queue, force => true) FROM jobcap.queues
  WHERE queue IN ('ctl', 'capped', 'capped2', 'out', 'old')) d;
