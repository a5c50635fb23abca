-- The direct path (jobcap.hot_path = direct, the default) and when the SQL statements serve
-- instead. Each call says which path served it at DEBUG2; the rest of the server's DEBUG2
-- chatter is kept out by asking only around the calls.
\set VERBOSITY terse
-- A trigger below names a job id: ids start where the expected output says.
SELECT setval(pg_get_serial_sequence('jobcap.jobs', 'job_id'), 2010, false) IS NOT NULL AS ids_reset;
SELECT jobcap.create_queue('direct', max_attempts => 3, lease => '1 hour');
SELECT count(*) AS enqueued FROM (
    SELECT jobcap.enqueue_job('direct', jsonb_build_object('n', n)) FROM generate_series(1, 12) n) e;
-- The default, set here because regress_sql runs every suite with jobcap.hot_path = sql.
SET jobcap.hot_path = direct;

-- Claims and settles, each on the direct path.
SET client_min_messages = debug2;
SELECT job_id AS a, fence AS fa FROM jobcap.claim_job('direct', 'w') \gset
SELECT jobcap.heartbeat(:a, :fa, '2 hours') > now() + interval '1 hour' AS lease_pushed;
BEGIN;
SELECT jobcap.assert_fence(:a, :fa);
COMMIT;
SELECT jobcap.complete_job(:a, :fa, '{"ok": true}');
SELECT array_agg(job_id) AS ids, array_agg(fence) AS fences FROM jobcap.claim_job('direct', 'w', 2) \gset
SELECT jobcap.complete_jobs(:'ids', :'fences');
SELECT job_id AS b, fence AS fb FROM jobcap.claim_job('direct', 'w') \gset
SELECT job_id AS c, fence AS fc FROM jobcap.complete_and_claim(:b, :fb, 'direct', 'w') \gset
RESET client_min_messages;
SELECT state, attempts, output FROM jobcap.jobs WHERE job_id = :a;
-- A stale fence is the same error as on the SQL path (JC001).
\set VERBOSITY sqlstate
SELECT jobcap.complete_job(:a, :fa);
SELECT jobcap.heartbeat(:b, :fb);
\set VERBOSITY terse

-- The SQL path: by setting, in REPEATABLE READ, for a paused queue.
SET jobcap.hot_path = sql;
SET client_min_messages = debug2;
SELECT jobcap.heartbeat(:c, :fc) IS NOT NULL AS beat;
RESET client_min_messages;
SET jobcap.hot_path = direct;
BEGIN ISOLATION LEVEL REPEATABLE READ;
SET LOCAL client_min_messages = debug2;
SELECT count(*) AS claimed FROM jobcap.claim_job('direct', 'w');
COMMIT;
SELECT jobcap.pause_queue('direct');
SET client_min_messages = debug2;
SELECT count(*) AS claimed_while_paused FROM jobcap.claim_job('direct', 'w');
RESET client_min_messages;
SELECT jobcap.resume_queue('direct');

-- What only the executor does is never skipped: with a trigger on jobcap.jobs, or row security,
-- every call takes the SQL path (and the trigger fires); without them, the direct path again.
CREATE FUNCTION public.direct_path_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE NOTICE 'trigger: job % % -> %', NEW.job_id, OLD.state, NEW.state;
    RETURN NEW;
END $$;
CREATE TRIGGER direct_path_seen BEFORE UPDATE ON jobcap.jobs
    FOR EACH ROW EXECUTE FUNCTION public.direct_path_trigger();
SET client_min_messages = debug2;
SELECT job_id AS d, fence AS fd FROM jobcap.claim_job('direct', 'w') \gset
RESET client_min_messages;
DROP TRIGGER direct_path_seen ON jobcap.jobs;
DROP FUNCTION public.direct_path_trigger();
ALTER TABLE jobcap.jobs ENABLE ROW LEVEL SECURITY;
SET client_min_messages = debug2;
SELECT jobcap.complete_job(:d, :fd);
RESET client_min_messages;
ALTER TABLE jobcap.jobs DISABLE ROW LEVEL SECURITY;
SET client_min_messages = debug2;
SELECT jobcap.complete_job(:c, :fc);
RESET client_min_messages;

-- The hot path's functions (and enqueue's) have no SET search_path clause (the direct path
-- looks nothing up by name); the SQL they run is pinned in C. A caller's search_path that puts
-- its own nextval before pg_catalog's reaches neither path: fences still come from
-- jobcap.fences. Nor does its own text = text, which would find no queue.
SELECT p.proname, p.proconfig FROM pg_proc p
 WHERE p.pronamespace = 'jobcap'::regnamespace AND p.proconfig IS NULL ORDER BY 1;
CREATE SCHEMA direct_evil;
CREATE FUNCTION direct_evil.nextval(regclass) RETURNS bigint LANGUAGE sql AS 'SELECT 42::bigint';
SET search_path = direct_evil, pg_catalog, public;
SELECT fence > 42 AS real_fence FROM jobcap.claim_job('direct', 'w');
SET jobcap.hot_path = sql;
SELECT fence > 42 AS real_fence FROM jobcap.claim_job('direct', 'w');
CREATE FUNCTION direct_evil.never(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT false';
CREATE OPERATOR direct_evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = direct_evil.never);
SELECT jobcap.enqueue_job('direct') > 0 AS enqueued;
SELECT array_length(jobcap.enqueue_jobs('direct', ARRAY['{}'::jsonb, '{}']), 1) AS enqueued;
SHOW search_path;
SET jobcap.hot_path = direct;
RESET search_path;
DROP SCHEMA direct_evil CASCADE;

SELECT state, count(*) FROM jobcap.jobs WHERE queue = 'direct' GROUP BY 1 ORDER BY 1;
SELECT jobcap.drop_queue('direct', force => true);

-- A round-robin queue: a claim of keyless jobs writes no turn and stays on the direct path, even
-- with no turn row (a queue without keys never has one); the claim that would write a queue's
-- first turn goes to the SQL path (its upsert); with the turn row there, the direct path again.
SELECT jobcap.create_queue('direct_rr', fairness => 'round_robin');
SELECT count(*) FROM (SELECT jobcap.enqueue_job('direct_rr') FROM generate_series(1, 2)) e;
SET client_min_messages = debug2;
SELECT count(*) AS keyless_claimed FROM jobcap.claim_job('direct_rr', 'w');
RESET client_min_messages;
SELECT count(*) AS turns FROM jobcap.queue_turns WHERE queue = 'direct_rr';
SELECT count(*) FROM (SELECT jobcap.enqueue_job('direct_rr', concurrency_key => k)
                        FROM unnest(ARRAY['a', 'b']) k) e;
SET client_min_messages = debug2;
SELECT concurrency_key FROM jobcap.claim_job('direct_rr', 'w') JOIN jobcap.jobs USING (job_id);
SELECT concurrency_key FROM jobcap.claim_job('direct_rr', 'w') JOIN jobcap.jobs USING (job_id);
RESET client_min_messages;
SELECT last_key FROM jobcap.queue_turns WHERE queue = 'direct_rr';
SELECT jobcap.drop_queue('direct_rr', force => true);
