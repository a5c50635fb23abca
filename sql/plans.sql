-- Plan shape of the claim, on the statement jobcap really prepares (jobcap.statements()):
-- the locking scan runs once and locks no more rows than the batch, even with stale
-- statistics and hash joins off, for both generic and custom plans. Rows exhausted by their
-- cap never take a batch slot. jobcap keeps one generic plan of its claims and of the reaper,
-- made with sequential scans, bitmap scans, sorts and JIT disabled (src/spi/plans.hpp): the probes
-- below plan them the same way.
\set VERBOSITY terse
SELECT jobcap.create_queue('plans', max_attempts => 3);

-- Statistics taken while the table is almost empty, then a backlog arrives.
SELECT jobcap.enqueue_job('plans') AS seed \gset
ANALYZE jobcap.jobs;
-- 300 exhausted rows first in claim order (priority -10, attempts at the cap), then 3000 due.
INSERT INTO jobcap.jobs (queue, priority, attempts)
SELECT 'plans', -10, 3 FROM generate_series(1, 300);
INSERT INTO jobcap.jobs (queue) SELECT 'plans' FROM generate_series(1, 3000);
SET enable_hashjoin = off;

-- caller: the last parameter, NULL for a privileged caller (no grant check), else a role's oid.
CREATE FUNCTION claim_plan(batch int, mode text, caller oid DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
  s record;
  plan json;
BEGIN
  SELECT * INTO s FROM jobcap.statements() WHERE name = 'claim_job';
  PERFORM set_config('plan_cache_mode', mode, true);
  PERFORM set_config(g, 'off', true) FROM unnest('{enable_seqscan,enable_bitmapscan,enable_sort,jit}'::text[]) g;
  EXECUTE format('PREPARE claim_probe(%s) AS %s', array_to_string(s.argtypes, ', '), s.sql);
  EXECUTE format('EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF, FORMAT JSON) '
                 'EXECUTE claim_probe(clock_timestamp(), %L, NULL, %L, %s, %L, ''{}'')', 'probe', 'plans', batch,
                 caller) INTO plan;
  DEALLOCATE claim_probe;
  RETURN plan::jsonb;
END $$;

-- Row counts go through numeric: PostgreSQL 18's EXPLAIN shows Actual Rows with two decimals.
-- The scan under each LockRows. A grant check that does not depend on the row is a one-time
-- filter: a Result node over the scan (shown as "gated").
CREATE FUNCTION lock_nodes(plan jsonb) RETURNS TABLE (loops bigint, locked bigint, scan text)
LANGUAGE sql AS $$
  SELECT (n->>'Actual Loops')::bigint, (n->>'Actual Rows')::numeric::bigint,
         CASE WHEN g THEN 'gated ' ELSE '' END || (s->>'Node Type')
           || coalesce(' using ' || (s->>'Index Name'), '')
    FROM jsonb_path_query(plan, 'strict $.**?(@."Node Type" == "LockRows")') n,
         LATERAL (SELECT n->'Plans'->0->>'Node Type' = 'Result' AND n->'Plans'->0 ? 'Plans') r(g),
         LATERAL (SELECT CASE WHEN g THEN n->'Plans'->0->'Plans'->0 ELSE n->'Plans'->0 END) c(s)
$$;

CREATE FUNCTION updated_rows(plan jsonb) RETURNS bigint LANGUAGE sql AS $$
  SELECT sum((n->>'Actual Rows')::numeric::bigint)::bigint
    FROM jsonb_path_query(plan, 'strict $.**?(@."Node Type" == "ModifyTable")') n
$$;

SELECT 'custom' AS plan, l.*, updated_rows(p) AS claimed
  FROM claim_plan(10, 'force_custom_plan') p, lock_nodes(p) l;
SELECT 'generic' AS plan, l.*, updated_rows(p) AS claimed
  FROM claim_plan(10, 'force_generic_plan') p, lock_nodes(p) l;
SELECT 'generic, big batch' AS plan, l.*, updated_rows(p) AS claimed
  FROM claim_plan(500, 'force_generic_plan') p, lock_nodes(p) l;
-- A worker role's claim checks its grant once (an InitPlan), not per row: same scan, same locks.
-- (Rolled back: the counts below stay those of the claims above.)
CREATE ROLE regress_plans_worker NOLOGIN;
BEGIN;
SELECT jobcap.grant_queue('plans', 'regress_plans_worker');
SELECT 'granted worker' AS plan, l.*, updated_rows(p) AS claimed
  FROM claim_plan(10, 'force_generic_plan', 'regress_plans_worker'::regrole) p, lock_nodes(p) l;
SELECT jobcap.revoke_queue('plans', 'regress_plans_worker');
SELECT 'revoked worker' AS plan, l.*, updated_rows(p) AS claimed
  FROM claim_plan(10, 'force_generic_plan', 'regress_plans_worker'::regrole) p, lock_nodes(p) l;
ROLLBACK;
DROP ROLE regress_plans_worker;

-- Through the function itself: a claim of n returns n eligible jobs though 300 exhausted rows
-- come first, and claims exactly them.
SELECT count(*) AS claimed, bool_and(attempt = 1) AS all_fresh FROM jobcap.claim_job('plans', 'w', 25);
SELECT count(*) AS running FROM jobcap.jobs WHERE queue = 'plans' AND state = 'running';
SELECT count(*) FILTER (WHERE attempts > 3) AS over_cap FROM jobcap.jobs WHERE queue = 'plans';

-- The reaper's locking scans run once each, and lock at most max_jobs.
UPDATE jobcap.jobs SET lease_expires_at = now() - interval '1 second' WHERE state = 'running';
CREATE FUNCTION reap_plan(max_jobs int) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
  s record;
  plan json;
BEGIN
  SELECT * INTO s FROM jobcap.statements() WHERE name = 'reap_jobs';
  PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
  PERFORM set_config(g, 'off', true) FROM unnest('{enable_seqscan,enable_bitmapscan,enable_sort,jit}'::text[]) g;
  EXECUTE format('PREPARE reap_probe(%s) AS %s', array_to_string(s.argtypes, ', '), s.sql);
  EXECUTE format('EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF, FORMAT JSON) '
                 'EXECUTE reap_probe(%s, clock_timestamp())', max_jobs) INTO plan;
  DEALLOCATE reap_probe;
  RETURN plan::jsonb;
END $$;
SELECT l.loops, l.locked, l.scan FROM reap_plan(100) p, lock_nodes(p) l ORDER BY l.locked DESC;
-- With room left after the expired leases, the over-cap sweep runs too (once).
SELECT l.loops, l.locked, l.scan FROM reap_plan(1000) p, lock_nodes(p) l ORDER BY l.locked DESC;
SELECT state, count(*) FROM jobcap.jobs WHERE queue = 'plans' GROUP BY state ORDER BY state;

RESET enable_hashjoin;

-- Statistics taken while the queue was idle (nothing pending, nothing running), then a backlog
-- and many running jobs: the kept generic plans must still walk the claim index in order, reach
-- claimed rows by primary key, and settle by key, not by scanning every running job.
SELECT jobcap.drop_queue('plans', force => true);
SELECT jobcap.create_queue('plans', max_attempts => 3);
VACUUM ANALYZE jobcap.jobs;
INSERT INTO jobcap.jobs (queue) SELECT 'plans' FROM generate_series(1, 5000);
SELECT count(*) AS running FROM jobcap.claim_job('plans', 'w', 2000);
SELECT 'generic, stats from an idle queue' AS plan, l.*, updated_rows(p) AS claimed
  FROM claim_plan(10, 'force_generic_plan') p, lock_nodes(p) l;
CREATE FUNCTION scans(plan jsonb) RETURNS TABLE (scan text, relation text, index text, loops bigint, read bigint)
LANGUAGE sql AS $$
  SELECT n->>'Node Type', n->>'Relation Name', n->>'Index Name', (n->>'Actual Loops')::bigint,
         (n->>'Actual Rows')::numeric::bigint + coalesce((n->>'Rows Removed by Filter')::numeric::bigint, 0)
    FROM jsonb_path_query(plan, 'strict $.**?(@."Node Type" like_regex "Scan$")') n
   WHERE n->>'Relation Name' = 'jobs'
$$;
SELECT * FROM scans(claim_plan(10, 'force_generic_plan'));
-- The fenced calls find their job by the primary key, with the generic plans made here, where
-- few jobs run: jobs_running matches their state test, but its first key is the queue's hash,
-- and a plan through it walks every running job's entry for the job_id (its rows read would
-- still show 1: the entries a btree passes over are not counted here, so the index is named).
CREATE FUNCTION settle_plan(name text) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
  s record;
  j record;
  plan json;
BEGIN
  SELECT * INTO s FROM jobcap.statements() st WHERE st.name = settle_plan.name;
  SELECT job_id, fence INTO j FROM jobcap.jobs WHERE queue = 'plans' AND state = 'running' LIMIT 1;
  PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
  EXECUTE format('PREPARE settle_probe(%s) AS %s', array_to_string(s.argtypes, ', '), s.sql);
  EXECUTE format('EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF, FORMAT JSON) EXECUTE settle_probe(%s)',
                 CASE name WHEN 'complete_jobs' THEN format('ARRAY[%s]::bigint[], ARRAY[%s]::bigint[], clock_timestamp(), NULL, NULL', j.job_id, j.fence)
                           WHEN 'heartbeat' THEN format('%s, %s, NULL, clock_timestamp(), NULL', j.job_id, j.fence)
                           WHEN 'assert_fence' THEN format('%s, %s, NULL', j.job_id, j.fence)
                           ELSE format('%s, %s, clock_timestamp(), NULL, NULL', j.job_id, j.fence) END) INTO plan;
  DEALLOCATE settle_probe;
  RETURN plan::jsonb;
END $$;
SELECT 'complete_job' AS statement, * FROM scans(settle_plan('complete_job'));
SELECT 'complete_jobs' AS statement, * FROM scans(settle_plan('complete_jobs'));
SELECT 'heartbeat' AS statement, * FROM scans(settle_plan('heartbeat'));
SELECT 'assert_fence' AS statement, * FROM scans(settle_plan('assert_fence'));

-- A round-robin claim reads the first due jobs of the keys it takes, through jobs_keys, never the
-- queue's backlog: 20,000 due jobs in 20 keys, each key's enqueued after the one before's, and
-- 100 without a key. A claim of 4 after t11 takes t12, t13, t14 and t15, one descent and a job
-- each (when it ranked the whole backlog it read every due job; a key's first job looked for in
-- claim order would lie up to 19,000 rows in). A claim of 40 after t18 takes two rounds of the
-- keys (t19, t2 ... t9, t0 ... t18) and no job without a key. With max_running_per_key 1 and
-- 5 keys at it, a claim of 40 passes those keys, takes one job of each of the 15 others and
-- then 25 without a key: only then is the claim index read, up to those jobs (behind all 20,000
-- with a key in claim order here; the price of jobs without a key in a round-robin queue).
SELECT jobcap.create_queue('turns', fairness => 'round_robin');
SELECT jobcap.enqueue_jobs('turns', array_fill('{}'::jsonb, ARRAY[20000]),
         concurrency_keys => (SELECT array_agg('t' || (i / 1000) ORDER BY i)
                                FROM generate_series(0, 19999) i)) IS NOT NULL AS enqueued;
SELECT jobcap.enqueue_jobs('turns', array_fill('{}'::jsonb, ARRAY[100])) IS NOT NULL AS enqueued;
CREATE FUNCTION turns_plan(batch int, last_key text, per_key int DEFAULT NULL,
                           at_limit text[] DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
  s record;
  plan json;
BEGIN
  SELECT * INTO s FROM jobcap.statements() WHERE name = 'claim_job_turns';
  PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
  PERFORM set_config(g, 'off', true) FROM unnest('{enable_seqscan,enable_bitmapscan,enable_sort,jit}'::text[]) g;
  EXECUTE format('PREPARE turns_probe(%s) AS %s', array_to_string(s.argtypes, ', '), s.sql);
  EXECUTE format('EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF, FORMAT JSON) '
                 'EXECUTE turns_probe(clock_timestamp(), ''probe'', NULL, ''turns'', %s, NULL, ''{}'','
                 ' %L, %L, %L, %L)', batch, per_key, at_limit,
                 (SELECT array_agg(1) FROM unnest(at_limit)), last_key) INTO plan;
  DEALLOCATE turns_probe;
  RETURN plan::jsonb;
END $$;
-- The rows each index's scans of jobs read in all (EXPLAIN gives rows per loop, PostgreSQL 18 to
-- two decimals: small sums are shown as such).
CREATE FUNCTION reads(plan jsonb) RETURNS TABLE (index text, loops bigint, read bigint)
LANGUAGE sql AS $$
  SELECT n->>'Index Name', (n->>'Actual Loops')::bigint,
         round(((n->>'Actual Rows')::numeric + coalesce((n->>'Rows Removed by Filter')::numeric, 0))
               * (n->>'Actual Loops')::numeric)::bigint
    FROM jsonb_path_query(plan, 'strict $.**?(@."Node Type" like_regex "Scan$")') n
   WHERE n->>'Relation Name' = 'jobs'
$$;
BEGIN;
SELECT index, sum(loops) AS loops,
       CASE WHEN sum(read) < 100 THEN 'under 100' WHEN sum(read) < 1000 THEN 'under 1,000'
            ELSE sum(read)::text END AS rows_read,
       updated_rows(p) AS claimed
  FROM turns_plan(4, 't11') p, reads(p) GROUP BY index, p ORDER BY index;
ROLLBACK;
BEGIN;
SELECT index, sum(loops) AS loops,
       CASE WHEN sum(read) < 100 THEN 'under 100' WHEN sum(read) < 1000 THEN 'under 1,000'
            ELSE sum(read)::text END AS rows_read,
       updated_rows(p) AS claimed
  FROM turns_plan(40, 't18') p, reads(p) GROUP BY index, p ORDER BY index;
ROLLBACK;
BEGIN;
SELECT index, sum(loops) AS loops,
       CASE WHEN sum(read) < 100 THEN 'under 100' WHEN sum(read) < 1000 THEN 'under 1,000'
            ELSE sum(read)::text END AS rows_read,
       updated_rows(p) AS claimed
  FROM turns_plan(40, 't18', 1, '{t19,t3,t5,t7,t9}') p, reads(p) GROUP BY index, p ORDER BY index;
ROLLBACK;
DROP FUNCTION turns_plan(int, text, int, text[]);
DROP FUNCTION reads(jsonb);
SELECT jobcap.drop_queue('turns', force => true);

-- A limited queue's claim counts its own running jobs, not every queue's: 600 jobs running in
-- another queue are not read (jobs_running's first key is the queue's hash; on job_id alone
-- every claim below read all 600). Rows read from jobs by sequential scans and entries read
-- from its indexes, around each claim; the claims of one share the turn on the direct path
-- and count on the SQL path, max_running and per key alike.
SELECT jobcap.create_queue('held', lease => '1 hour');
SELECT cardinality(jobcap.enqueue_jobs('held', array_fill('{}'::jsonb, ARRAY[600])));
SELECT count(*) AS held FROM jobcap.claim_job('held', 'holder', 600);
SELECT jobcap.create_queue('counted', max_running => 1000000);
SELECT jobcap.create_queue('counted_keys', max_running_per_key => 1000000);
SELECT cardinality(jobcap.enqueue_jobs('counted', array_fill('{}'::jsonb, ARRAY[3])));
SELECT cardinality(jobcap.enqueue_jobs('counted_keys', array_fill('{}'::jsonb, ARRAY[3]),
                                              concurrency_keys => '{a,b,a}'));
ANALYZE jobcap.jobs;
CREATE FUNCTION pg_temp.jobs_reads() RETURNS bigint LANGUAGE sql AS $$
    SELECT pg_stat_get_xact_tuples_returned('jobcap.jobs'::regclass)
           + (SELECT sum(pg_stat_get_xact_tuples_returned(i.indexrelid))::bigint
                FROM pg_index i WHERE i.indrelid = 'jobcap.jobs'::regclass)
$$;
CREATE TEMP TABLE claim_reads (queue text, claimed bigint, rows_read bigint);
CREATE PROCEDURE pg_temp.measure_claim(q text) LANGUAGE plpgsql AS $$
DECLARE
  r0 bigint := pg_temp.jobs_reads();
  n bigint;
BEGIN
  SELECT count(*) INTO n FROM jobcap.claim_job(q, 'w');
  INSERT INTO claim_reads VALUES (q, n, pg_temp.jobs_reads() - r0);
END $$;
BEGIN;
CALL pg_temp.measure_claim('counted');
CALL pg_temp.measure_claim('counted');
CALL pg_temp.measure_claim('counted_keys');
CALL pg_temp.measure_claim('counted_keys');
COMMIT;
SELECT queue, claimed, CASE WHEN rows_read < 50 THEN 'under 50' ELSE rows_read::text END AS rows_read
  FROM claim_reads ORDER BY queue, rows_read;
SELECT jobcap.drop_queue(q, force => true) FROM unnest('{held,counted,counted_keys}'::text[]) q;

DROP FUNCTION settle_plan(text);
DROP FUNCTION scans(jsonb);
DROP FUNCTION claim_plan(int, text, oid);
DROP FUNCTION reap_plan(int);
DROP FUNCTION lock_nodes(jsonb);
DROP FUNCTION updated_rows(jsonb);
SELECT jobcap.drop_queue('plans', force => true);

-- Every statement jobcap prepares is listed, each under one name.
SELECT name, pg_catalog.cardinality(argtypes) AS nargs FROM jobcap.statements() ORDER BY name;
SELECT count(*) = count(DISTINCT name) AS names_unique FROM jobcap.statements();
