-- Enqueueing on the direct path (enqueue_job without a dedupe key, enqueue_jobs): the rows are
-- those the SQL path's INSERT writes. Each check enqueues the same jobs once per path, into
-- two queues, and compares the rows column by column (all but job_id, queue and the times).
\set VERBOSITY terse
SELECT jobcap.create_queue('enq_direct', max_attempts => 3);
SELECT jobcap.create_queue('enq_sql', max_attempts => 3);
-- The default, set here because regress_sql runs every suite with jobcap.hot_path = sql.
SET jobcap.hot_path = direct;

CREATE FUNCTION public.enq_same() RETURNS TABLE (direct bigint, sql bigint, differing bigint)
LANGUAGE sql AS $$
    WITH d AS (SELECT row_number() OVER (ORDER BY job_id) AS n,
                      to_jsonb(j) - '{job_id,queue,run_at,enqueued_at}'::text[] AS r
                 FROM jobcap.jobs j WHERE queue = 'enq_direct'),
         s AS (SELECT row_number() OVER (ORDER BY job_id) AS n,
                      to_jsonb(j) - '{job_id,queue,run_at,enqueued_at}'::text[] AS r
                 FROM jobcap.jobs j WHERE queue = 'enq_sql')
    SELECT (SELECT count(*) FROM d), (SELECT count(*) FROM s),
           (SELECT count(*) FROM d FULL JOIN s USING (n) WHERE d.r IS DISTINCT FROM s.r)
$$;
CREATE PROCEDURE public.enq_both(calls text) LANGUAGE plpgsql AS $$
BEGIN
    SET LOCAL jobcap.hot_path = direct;
    EXECUTE replace(calls, '%q', 'enq_direct');
    SET LOCAL jobcap.hot_path = sql;
    EXECUTE replace(calls, '%q', 'enq_sql');
END $$;

-- 1. Which path: enqueue_job without a key and enqueue_jobs take the direct one; a dedupe key
-- needs the SQL statement's ON CONFLICT.
SET client_min_messages = debug2;
CALL public.enq_both($$SELECT jobcap.enqueue_job('%q', '{"a": 1}')$$);
CALL public.enq_both($$SELECT jobcap.enqueue_jobs('%q', ARRAY['{"b": 1}', '{"b": 2}']::jsonb[])$$);
CALL public.enq_both($$SELECT jobcap.enqueue_job('%q', '{"k": 1}', dedupe_key => 'k')$$);
RESET client_min_messages;
SELECT * FROM public.enq_same();

-- 2. Ids ascend in payload order and come back in it; an empty batch inserts nothing.
SELECT jobcap.enqueue_jobs('enq_direct', ARRAY['{"n": "x"}', '{"n": "y"}', '{"n": "z"}']::jsonb[])
    AS ids \gset
SELECT :'ids'::bigint[] = (SELECT array_agg(job_id ORDER BY job_id) FROM jobcap.jobs
                             WHERE job_id = ANY (:'ids'::bigint[])) AS ascending,
       (SELECT array_agg(payload ->> 'n' ORDER BY job_id) FROM jobcap.jobs
         WHERE job_id = ANY (:'ids'::bigint[])) AS payloads,
       cardinality(:'ids'::bigint[]) AS n;
SELECT jobcap.enqueue_jobs('enq_sql', ARRAY['{"n": "x"}', '{"n": "y"}', '{"n": "z"}']::jsonb[])
    IS NOT NULL AS too;
SELECT jobcap.enqueue_jobs('enq_direct', '{}'::jsonb[]) AS none;
-- Every argument: run_at, priority, max_attempts.
CALL public.enq_both($$SELECT jobcap.enqueue_jobs('%q', ARRAY['{"c": 1}']::jsonb[],
    run_at => now() + interval '1 hour', priority => -3, max_attempts => 7)$$);
CALL public.enq_both($$SELECT jobcap.enqueue_job('%q', '{"c": 2}', now() - interval '1 hour', 5, 2)$$);
SELECT * FROM public.enq_same();
SELECT count(*) FILTER (WHERE run_at > now()) AS later, count(*) FILTER (WHERE max_attempts = 7) AS capped
  FROM jobcap.jobs WHERE queue = 'enq_direct';

-- 3. A large batch (several chunks of the direct path's multi-row insert), claimed in order.
SELECT jobcap.create_queue('enq_big', max_attempts => 3);
SELECT cardinality(jobcap.enqueue_jobs('enq_big',
         (SELECT array_agg(jsonb_build_object('i', i) ORDER BY i) FROM generate_series(1, 2500) i)))
         AS enqueued;
WITH c AS (SELECT * FROM jobcap.claim_job('enq_big', 'w', 1200))
SELECT count(*) AS claimed, min((payload ->> 'i')::int) AS first, max((payload ->> 'i')::int) AS last,
       bool_and(payload ->> 'i' = (job_id - (SELECT min(job_id) FROM c) + 1)::text) AS in_order
  FROM c;
SELECT count(*) AS pending FROM jobcap.jobs WHERE queue = 'enq_big' AND state = 'pending';
-- A payload big enough to be stored out of line (TOAST) comes back whole.
SELECT jobcap.enqueue_job('enq_big', jsonb_build_object('big', repeat('x', 50000), 'r',
         (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 400) i))) AS big \gset
SELECT length(payload ->> 'big') AS big, length(payload ->> 'r') AS r,
       pg_column_size(payload) < octet_length(payload::text) AS compressed
  FROM jobcap.jobs WHERE job_id = :big;
SELECT jobcap.drop_queue('enq_big', force => true);

-- 4. Missing and denied queues: the SQL path decides and raises the same errors.
\set VERBOSITY sqlstate
SELECT jobcap.enqueue_job('enq_missing', '{}');
SELECT jobcap.enqueue_jobs('enq_missing', ARRAY['{}']::jsonb[]);
\set VERBOSITY terse
CREATE ROLE enq_worker;
GRANT jobcap_worker TO enq_worker;
SET ROLE enq_worker;
\set VERBOSITY sqlstate
SELECT jobcap.enqueue_jobs('enq_direct', ARRAY['{}']::jsonb[]);
\set VERBOSITY terse
RESET ROLE;
SELECT jobcap.grant_queue('enq_direct', 'enq_worker');
SET ROLE enq_worker;
SELECT cardinality(jobcap.enqueue_jobs('enq_direct', ARRAY['{}']::jsonb[])) AS granted;
RESET ROLE;

-- 5. Defaults a DBA sets on columns the INSERT does not list. A constant one is written by both
-- paths; anything else (a time, a function of their own) sends enqueues to the SQL path, which
-- evaluates it as the statement would.
DELETE FROM jobcap.jobs WHERE queue IN ('enq_direct', 'enq_sql');
ALTER TABLE jobcap.jobs ALTER COLUMN worker SET DEFAULT 'nobody';
ALTER TABLE jobcap.jobs ADD COLUMN enq_tenant text NOT NULL DEFAULT 'acme';
SET client_min_messages = debug2;
CALL public.enq_both($$SELECT jobcap.enqueue_job('%q', '{"d": 1}')$$);
RESET client_min_messages;
CALL public.enq_both($$SELECT jobcap.enqueue_jobs('%q', ARRAY['{"d": 2}', '{"d": 3}']::jsonb[])$$);
SELECT * FROM public.enq_same();
SELECT DISTINCT worker, enq_tenant FROM jobcap.jobs WHERE queue = 'enq_direct';
-- A column left without a default but NOT NULL: the INSERT's error, on either path.
ALTER TABLE jobcap.jobs ALTER COLUMN enq_tenant DROP DEFAULT;
SET client_min_messages = debug2;
SELECT jobcap.enqueue_jobs('enq_direct', ARRAY['{}']::jsonb[]);
RESET client_min_messages;
ALTER TABLE jobcap.jobs DROP COLUMN enq_tenant;
-- A default of the DBA's own function, whose body names lower() unqualified: the SQL path
-- runs it as the statements run (the tables' owner, search_path pinned); the direct path
-- neither runs it nor inlines it under the caller's search_path.
CREATE FUNCTION public.enq_tag() RETURNS text LANGUAGE sql IMMUTABLE AS $$ SELECT lower('TAG') $$;
ALTER TABLE jobcap.jobs ADD COLUMN enq_tag text DEFAULT public.enq_tag();
CREATE SCHEMA enq_evil;
CREATE FUNCTION enq_evil.lower(t text) RETURNS text LANGUAGE sql IMMUTABLE AS $$ SELECT 'hijacked' $$;
SET search_path = enq_evil, pg_catalog, public;
SET client_min_messages = debug2;
SELECT jobcap.enqueue_job('enq_direct', '{"e": 1}') > 0 AS enqueued;
RESET client_min_messages;
RESET search_path;
SELECT enq_tag FROM jobcap.jobs WHERE queue = 'enq_direct' AND payload ? 'e';
ALTER TABLE jobcap.jobs DROP COLUMN enq_tag;
-- A default of now() on a column the INSERT does not list: the SQL path evaluates it.
ALTER TABLE jobcap.jobs ALTER COLUMN claimed_at SET DEFAULT now();
SET client_min_messages = debug2;
SELECT jobcap.enqueue_job('enq_direct', '{"f": 1}') > 0 AS enqueued;
RESET client_min_messages;
SELECT claimed_at IS NOT NULL AS defaulted
  FROM jobcap.jobs WHERE queue = 'enq_direct' AND payload ? 'f';
ALTER TABLE jobcap.jobs ALTER COLUMN claimed_at DROP DEFAULT;
ALTER TABLE jobcap.jobs ALTER COLUMN worker DROP DEFAULT;

-- 6. An index a DBA adds gets the new rows' entries (amcheck: every heap row has its entry in
-- every index), partial ones only for the rows they hold.
CREATE EXTENSION IF NOT EXISTS amcheck;
CREATE INDEX enq_priority ON jobcap.jobs (priority) WHERE priority > 0;
CREATE INDEX enq_run_at ON jobcap.jobs (run_at, job_id);
SET client_min_messages = debug2;
SELECT cardinality(jobcap.enqueue_jobs('enq_direct', ARRAY['{"g": 1}', '{"g": 2}']::jsonb[],
         priority => 1)) AS enqueued;
RESET client_min_messages;
SELECT cardinality(jobcap.enqueue_jobs('enq_direct', ARRAY['{"g": 3}']::jsonb[])) AS enqueued;
-- Predicates that read the columns in which a batch's rows differ (payload, job_id,
-- concurrency_key) are evaluated for each row; the others once per batch.
CREATE INDEX enq_pad ON jobcap.jobs (job_id) WHERE payload ? 'pad';
CREATE INDEX enq_even ON jobcap.jobs (job_id) WHERE job_id % 2 = 0;
CREATE INDEX enq_key ON jobcap.jobs (job_id) WHERE concurrency_key = 'k1';
-- Two batches, one whose first row passes each predicate and one whose first row does not.
SET client_min_messages = debug2;
SELECT cardinality(jobcap.enqueue_jobs('enq_direct',
         ARRAY['{"h": 1}', '{"pad": 1}', '{"h": 2}', '{"pad": 2}', '{"h": 3}']::jsonb[],
         concurrency_keys => ARRAY['k0', 'k1', 'k1', NULL, 'k0'])) AS enqueued;
SELECT cardinality(jobcap.enqueue_jobs('enq_direct',
         ARRAY['{"pad": 3}', '{"h": 4}', '{"pad": 4}', '{"h": 5}']::jsonb[],
         concurrency_keys => ARRAY['k1', 'k0', NULL, 'k1'])) AS enqueued;
RESET client_min_messages;
-- Each index holds exactly the rows its predicate passes: counted through the index (an index
-- whose WHERE is the query's reads no heap column to recheck it) and through the table.
CREATE TEMP TABLE enq_counts (pred text, via text, n bigint);
SET enable_seqscan = off; SET enable_bitmapscan = off;
INSERT INTO enq_counts SELECT 'pad', 'index', count(*) FROM jobcap.jobs WHERE payload ? 'pad';
INSERT INTO enq_counts SELECT 'even', 'index', count(*) FROM jobcap.jobs WHERE job_id % 2 = 0;
INSERT INTO enq_counts SELECT 'k1', 'index', count(*) FROM jobcap.jobs WHERE concurrency_key = 'k1';
RESET enable_seqscan; SET enable_indexscan = off; SET enable_indexonlyscan = off;
INSERT INTO enq_counts SELECT 'pad', 'table', count(*) FROM jobcap.jobs WHERE payload ? 'pad';
INSERT INTO enq_counts SELECT 'even', 'table', count(*) FROM jobcap.jobs WHERE job_id % 2 = 0;
INSERT INTO enq_counts SELECT 'k1', 'table', count(*) FROM jobcap.jobs WHERE concurrency_key = 'k1';
RESET enable_indexscan; RESET enable_indexonlyscan; RESET enable_bitmapscan;
SELECT pred, count(DISTINCT n) = 1 AS same, max(n) > 0 AS some FROM enq_counts GROUP BY pred ORDER BY pred;
DROP TABLE enq_counts;
SELECT count(*) AS checked FROM (
    SELECT bt_index_check(i.indexrelid, true)
      FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
     WHERE i.indrelid = 'jobcap.jobs'::regclass
       AND c.relam = (SELECT oid FROM pg_am WHERE amname = 'btree')) c;
SET enable_seqscan = off;
SELECT count(*) AS via_partial_index FROM jobcap.jobs WHERE priority > 0 AND queue = 'enq_direct';
RESET enable_seqscan;
DROP INDEX jobcap.enq_priority, jobcap.enq_run_at, jobcap.enq_pad, jobcap.enq_even, jobcap.enq_key;

SELECT jobcap.drop_queue('enq_direct', force => true), jobcap.drop_queue('enq_sql', force => true);
DROP PROCEDURE public.enq_both(text);
DROP FUNCTION public.enq_same(), public.enq_tag(), enq_evil.lower(text);
DROP SCHEMA enq_evil;
DROP ROLE enq_worker;
DROP EXTENSION amcheck;
RESET jobcap.hot_path;
