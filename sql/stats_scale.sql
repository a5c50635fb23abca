-- queue_stats must stay cheap however many finished jobs are kept: it may read the live jobs
-- (pending, running), the dead ones and the failures of its window, never the succeeded jobs
-- that retention keeps (a day's worth by default). Measured, not assumed: this transaction's
-- own access counters (pg_stat_get_xact_*) for jobcap.jobs and each of its indexes, around one
-- read of queue_stats, with 100,000 and then 400,000 succeeded jobs inside the window.
\set VERBOSITY terse
-- Parallel workers would count their reads in their own processes. jobcap's statements never
-- run in parallel (prepared without CURSOR_OPT_PARALLEL_OK); the control below must not either.
SET max_parallel_workers_per_gather = 0;
SELECT jobcap.create_queue('scale_a', max_attempts => 1, backoff_base => '0', backoff_max => '0');
SELECT jobcap.create_queue('scale_b');
-- The live part: 22 pending, 5 running, 3 dead (one failure each), 2 scheduled.
SELECT cardinality(jobcap.enqueue_jobs('scale_a', array_fill('{}'::jsonb, ARRAY[30])));
SELECT count(*) FROM jobcap.claim_job('scale_a', 'w', 5);
SELECT count(jobcap.fail_job(job_id, fence, 'corrupt')) FROM jobcap.claim_job('scale_a', 'w', 3);
SELECT jobcap.enqueue_job('scale_b', run_at => now() + interval '1 hour') > 0 AS scheduled;
SELECT jobcap.enqueue_job('scale_b', run_at => now() + interval '2 hours') > 0 AS scheduled;

-- Rows read from jobs: by sequential scans, and index entries read (by index and bitmap scans
-- alike: each row an index leads to is one entry). Not the heap fetches: a bitmap scan counts
-- them on the table where an index scan counts them on its index, and which of the two the
-- planner takes for the same few rows varies with ANALYZE's sample.
CREATE FUNCTION pg_temp.reads(OUT seq_scans bigint, OUT rows_read bigint) LANGUAGE sql AS $$
    SELECT pg_stat_get_xact_numscans('jobcap.jobs'::regclass),
           pg_stat_get_xact_tuples_returned('jobcap.jobs'::regclass)
           + (SELECT sum(pg_stat_get_xact_tuples_returned(i.indexrelid))::bigint
                FROM pg_index i WHERE i.indrelid = 'jobcap.jobs'::regclass)
$$;
CREATE TEMP TABLE measured (succeeded_kept bigint, seq_scans bigint, rows_read bigint);
-- Succeeded jobs that finished half an hour ago, inside the window (before the counts began, so
-- refresh_stats does not count them either).
CREATE PROCEDURE pg_temp.keep_succeeded(n int) LANGUAGE sql AS $$
    INSERT INTO jobcap.jobs (queue, state, attempts, enqueued_at, first_claimed_at, claimed_at, finished_at)
    SELECT 'scale_a', 'succeeded', 1, t, t, t, t
      FROM (SELECT now() - interval '30 minutes' + i * interval '1 ms' AS t FROM generate_series(1, n) i) s
$$;

CALL pg_temp.keep_succeeded(100000);
VACUUM (ANALYZE) jobcap.jobs;
BEGIN;
SELECT seq_scans AS s0, rows_read AS r0 FROM pg_temp.reads() \gset
SELECT queue, pending, scheduled, running, dead, failed_attempts, failing_jobs, new_dead
  FROM jobcap.queue_stats ORDER BY queue;
INSERT INTO measured
SELECT (SELECT count(*) FROM jobcap.jobs WHERE state = 'succeeded'), seq_scans - :s0, rows_read - :r0
  FROM pg_temp.reads();
COMMIT;

CALL pg_temp.keep_succeeded(300000);
VACUUM (ANALYZE) jobcap.jobs;
BEGIN;
SELECT seq_scans AS s0, rows_read AS r0 FROM pg_temp.reads() \gset
SELECT queue, pending, scheduled, running, dead, failed_attempts, failing_jobs, new_dead
  FROM jobcap.queue_stats ORDER BY queue;
INSERT INTO measured
SELECT (SELECT count(*) FROM jobcap.jobs WHERE state = 'succeeded'), seq_scans - :s0, rows_read - :r0
  FROM pg_temp.reads();
COMMIT;

-- The same reads at both sizes, no sequential scan, and no more rows than the live and dead
-- jobs (30 in scale_a, 2 in scale_b) read through a few indexes.
SELECT succeeded_kept, seq_scans, rows_read, rows_read <= 100 AS reads_at_most_100 FROM measured ORDER BY 1;
SELECT count(DISTINCT rows_read) = 1 AS same_reads_at_both_sizes FROM measured;

-- The control: the measure sees a scan of the succeeded jobs when there is one (the old view
-- counted them per queue).
BEGIN;
SELECT seq_scans AS s0, rows_read AS r0 FROM pg_temp.reads() \gset
SELECT count(*) FROM jobcap.jobs j WHERE j.state = 'succeeded' AND j.queue = 'scale_a';
SELECT rows_read - :r0 >= 400000 AS control_reads_them_all FROM pg_temp.reads();
COMMIT;

-- queue_depth (the adapters' queue size) reads the queue's pending and running jobs only, one
-- branch per state: with state IN ('pending', 'running'), which no partial index matches, every
-- call read the whole table, the succeeded jobs kept included.
BEGIN;
SELECT seq_scans AS s0, rows_read AS r0 FROM pg_temp.reads() \gset
SELECT * FROM jobcap.queue_depth('scale_a');
SELECT seq_scans - :s0 AS seq_scans, rows_read - :r0 <= 100 AS reads_at_most_100
  FROM pg_temp.reads();
COMMIT;

-- The plan of the statement itself (jobcap.statements()), generic as the function keeps it
-- and custom: which index serves each scan of jobs, and no scan of the whole table. Index names,
-- not scan types: whether the planner reads an index directly or through a bitmap varies with
-- the statistics from run to run, and either reads the same entries.
-- jobs_keys (the pending jobs with a key) may serve the count of those held by a per-key limit
-- beside jobs_claim, as the statistics go: it is left out of the list.
SELECT sql AS stats_sql FROM jobcap.statements() WHERE name = 'queue_stats' \gset
PREPARE stats(timestamptz, timestamptz, timestamptz) AS :stats_sql;
CREATE FUNCTION pg_temp.scans_of_jobs(mode text) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    plan jsonb;
BEGIN
    EXECUTE format('SET LOCAL plan_cache_mode = %I', mode);
    EXECUTE 'EXPLAIN (FORMAT JSON, COSTS OFF) EXECUTE stats(now() - interval ''1 hour'', now(), now())' INTO plan;
    RETURN QUERY SELECT DISTINCT coalesce('index ' || (n->>'Index Name'), n->>'Node Type')
      FROM jsonb_path_query(plan, 'strict $.**') n
     WHERE jsonb_typeof(n) = 'object'
       AND (n->>'Relation Name' = 'jobs' AND n->>'Node Type' NOT LIKE 'Bitmap%'
            OR n->>'Index Name' IN (SELECT c.relname::text FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
                                     WHERE i.indrelid = 'jobcap.jobs'::regclass))
       AND n->>'Index Name' IS DISTINCT FROM 'jobs_keys'
     ORDER BY 1;
END $$;
SELECT * FROM pg_temp.scans_of_jobs('force_generic_plan');
SELECT * FROM pg_temp.scans_of_jobs('force_custom_plan');

-- The hot path writes no row for the statistics: a transaction that enqueues, claims,
-- heartbeats, completes, fails and completes in batch writes jobs and job_errors only.
BEGIN;
SELECT jobcap.enqueue_jobs('scale_b', array_fill('{}'::jsonb, ARRAY[4])) IS NOT NULL AS enqueued;
CREATE TEMP TABLE hot AS
SELECT row_number() OVER (ORDER BY c.job_id) AS n, c.* FROM jobcap.claim_job('scale_b', 'w', 4) c;
SELECT count(jobcap.heartbeat(job_id, fence)) AS heartbeats FROM hot;
SELECT jobcap.complete_job(job_id, fence) FROM hot WHERE n = 1;
SELECT jobcap.fail_job(job_id, fence, 'x') FROM hot WHERE n = 2;
SELECT jobcap.complete_jobs(array_agg(job_id), array_agg(fence)) FROM hot WHERE n > 2;
SELECT c.relname, pg_stat_get_xact_tuples_inserted(c.oid) + pg_stat_get_xact_tuples_updated(c.oid)
         + pg_stat_get_xact_tuples_deleted(c.oid) AS rows_written
  FROM pg_class c WHERE c.relnamespace = 'jobcap'::regnamespace AND c.relkind = 'r'
 ORDER BY c.relname;
ROLLBACK;

SELECT jobcap.drop_queue('scale_a', force => true);
SELECT jobcap.drop_queue('scale_b', force => true);
