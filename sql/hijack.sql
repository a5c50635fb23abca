-- A hostile search_path: a low-privilege worker puts a schema of its own first on its path,
-- full of functions and operators that shadow what jobcap's statements use (now(), = on bigint,
-- text and job_state, < on integer, timestamptz + interval, nextval, pg_has_role, ...), each
-- recording that it ran. The same life of jobs is played on two queues, once on the plain path
-- and once on the hostile one (the superuser reaps with the hostile path too): the outcomes must
-- be identical and no shadowing object may ever run.
\set VERBOSITY terse
SELECT setval(pg_get_serial_sequence('jobcap.jobs', 'job_id'), 9000, false) IS NOT NULL AS ids_reset,
       setval('jobcap.fences', 900, false) IS NOT NULL AS fences_reset;
SELECT count(*) AS queues FROM (SELECT jobcap.create_queue(q, max_attempts => 2, backoff_base => '0', backoff_max => '0')
                                  FROM (VALUES ('plain'), ('hostile'), ('closed')) v(q)) c;
CREATE ROLE regress_hijacker IN ROLE jobcap_worker;
SELECT jobcap.grant_queue(q, 'regress_hijacker') FROM (VALUES ('plain'), ('hostile')) v(q);
CREATE SCHEMA regress_evil AUTHORIZATION regress_hijacker;

SET ROLE regress_hijacker;
CREATE TABLE regress_evil.calls (what text);
GRANT INSERT, SELECT ON regress_evil.calls TO PUBLIC;
CREATE FUNCTION regress_evil.record(what text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN INSERT INTO regress_evil.calls VALUES (what); END $$;
CREATE FUNCTION regress_evil.now() RETURNS timestamptz LANGUAGE plpgsql AS $$
BEGIN PERFORM regress_evil.record('now()'); RETURN '2000-01-01'; END $$;
CREATE FUNCTION regress_evil.statement_timestamp() RETURNS timestamptz LANGUAGE plpgsql AS $$
BEGIN PERFORM regress_evil.record('statement_timestamp()'); RETURN '2000-01-01'; END $$;
CREATE FUNCTION regress_evil.clock_timestamp() RETURNS timestamptz LANGUAGE plpgsql AS $$
BEGIN PERFORM regress_evil.record('clock_timestamp()'); RETURN '2000-01-01'; END $$;
CREATE FUNCTION regress_evil.nextval(regclass) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN PERFORM regress_evil.record('nextval(regclass)'); RETURN 1; END $$;
CREATE FUNCTION regress_evil.pg_has_role(oid, oid, text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN PERFORM regress_evil.record('pg_has_role(oid, oid, text)'); RETURN true; END $$;
CREATE FUNCTION regress_evil.to_regrole(text) RETURNS regrole LANGUAGE plpgsql AS $$
BEGIN PERFORM regress_evil.record('to_regrole(text)'); RETURN 'regress_hijacker'; END $$;
CREATE FUNCTION regress_evil.current_setting(text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN PERFORM regress_evil.record('current_setting(text)'); RETURN '0'; END $$;
CREATE FUNCTION regress_evil.backoff(integer, interval, interval) RETURNS interval LANGUAGE plpgsql AS $$
BEGIN PERFORM regress_evil.record('backoff()'); RETURN '100 years'; END $$;
CREATE FUNCTION regress_evil.unnest(jsonb[]) RETURNS SETOF jsonb LANGUAGE plpgsql AS $$
BEGIN PERFORM regress_evil.record('unnest(jsonb[])'); END $$;
CREATE FUNCTION regress_evil.agg_step(bigint[], bigint) RETURNS bigint[] LANGUAGE plpgsql AS $$
BEGIN PERFORM regress_evil.record('array_agg(bigint)'); RETURN '{}'; END $$;
CREATE AGGREGATE regress_evil.array_agg(bigint) (SFUNC = regress_evil.agg_step, STYPE = bigint[]);
CREATE FUNCTION regress_evil.eq_int8(bigint, bigint) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN PERFORM regress_evil.record('=(bigint, bigint)'); RETURN true; END $$;
CREATE OPERATOR regress_evil.= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = regress_evil.eq_int8);
CREATE FUNCTION regress_evil.eq_text(text, text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN PERFORM regress_evil.record('=(text, text)'); RETURN true; END $$;
CREATE OPERATOR regress_evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = regress_evil.eq_text);
CREATE FUNCTION regress_evil.eq_state(jobcap.job_state, jobcap.job_state) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN PERFORM regress_evil.record('=(job_state, job_state)'); RETURN true; END $$;
CREATE OPERATOR regress_evil.= (LEFTARG = jobcap.job_state, RIGHTARG = jobcap.job_state,
                               FUNCTION = regress_evil.eq_state);
CREATE FUNCTION regress_evil.lt_int4(integer, integer) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN PERFORM regress_evil.record('<(integer, integer)'); RETURN true; END $$;
CREATE OPERATOR regress_evil.< (LEFTARG = integer, RIGHTARG = integer, FUNCTION = regress_evil.lt_int4);
CREATE FUNCTION regress_evil.plus(timestamptz, interval) RETURNS timestamptz LANGUAGE plpgsql AS $$
BEGIN PERFORM regress_evil.record('+(timestamptz, interval)'); RETURN '2000-01-01'; END $$;
CREATE OPERATOR regress_evil.+ (LEFTARG = timestamptz, RIGHTARG = interval, FUNCTION = regress_evil.plus);
-- Casts: only for a type the role owns; jsonb's own casts are out of reach.
CREATE TYPE regress_evil.blob AS (b text);
CREATE FUNCTION regress_evil.blob_to_jsonb(regress_evil.blob) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN PERFORM regress_evil.record('blob::jsonb'); RETURN '{"evil": true}'; END $$;
CREATE CAST (regress_evil.blob AS jsonb) WITH FUNCTION regress_evil.blob_to_jsonb(regress_evil.blob) AS IMPLICIT;
CREATE FUNCTION regress_evil.text_to_jsonb(text) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;
CREATE CAST (text AS jsonb) WITH FUNCTION regress_evil.text_to_jsonb(text) AS IMPLICIT;
-- Temporary functions are never found without a schema name, even with pg_temp on the path.
CREATE FUNCTION pg_temp.now() RETURNS timestamptz LANGUAGE plpgsql AS $$
BEGIN PERFORM regress_evil.record('pg_temp.now()'); RETURN '2000-01-01'; END $$;
-- The settings that bound what a worker can write are not the worker's to change.
SET jobcap.max_payload_bytes = '1GB';
SET jobcap.max_error_bytes = '1MB';
SET jobcap.error_history = 1000;

-- The trap is live: on this path, unqualified SQL runs the shadows.
SET search_path = regress_evil, pg_catalog, public;
SELECT now() = '2000-01-01' AS evil_now, 1::bigint = 2::bigint AS evil_equals, 2 < 1 AS evil_less;
SELECT count(*) > 0 AS shadows_ran FROM regress_evil.calls;
TRUNCATE regress_evil.calls;
RESET search_path;
RESET ROLE;

-- One life of jobs on queue :q: enqueue (defaults, payloads), claim in order, heartbeat, fail
-- and retry, complete, a stale complete, a claim left to expire, the reaper, a poison job
-- going dead at its cap, a requeue refused to the worker.
-- pg_regress names its input directory, the top of the tree, in PG_ABS_SRCDIR: the include,
-- sql/hijack_life.psql, is found from there.
\getenv abs_srcdir PG_ABS_SRCDIR
\cd :abs_srcdir
-- The hostile run goes first, so the backend prepares jobcap's statements while it is in effect.
\set q hostile
\set path 'regress_evil, pg_catalog, public'
\i sql/hijack_life.psql
\set q plain
\set path '"$user", public'
\i sql/hijack_life.psql

-- Nothing in regress_evil ever ran, though every call above had it first on its path.
SELECT what, count(*) FROM regress_evil.calls GROUP BY what ORDER BY what;

-- Both queues went through the same states, attempts, fence steps, history and due times.
CREATE FUNCTION life(q text) RETURNS TABLE (n bigint, state jobcap.job_state, attempts int, fence_step bigint,
    priority int, payload jsonb, due boolean, leased boolean, errors text) LANGUAGE sql AS $$
  SELECT row_number() OVER (ORDER BY j.job_id), j.state, j.attempts,
         CASE WHEN j.fence > 0 THEN j.fence - min(j.fence) FILTER (WHERE j.fence > 0) OVER () END,
         j.priority, j.payload,
         j.run_at <= now(), j.lease_expires_at > now() + interval '4 minutes',
         (SELECT string_agg(e.kind || ':' || coalesce(e.error, '-'), ', ' ORDER BY e.seq)
            FROM jobcap.job_errors e WHERE e.job_id = j.job_id)
    FROM jobcap.jobs j WHERE j.queue = q ORDER BY j.job_id
$$;
SELECT * FROM life('plain');
SELECT count(*) AS differences FROM ((SELECT * FROM life('plain') EXCEPT SELECT * FROM life('hostile'))
                                     UNION ALL
                                     (SELECT * FROM life('hostile') EXCEPT SELECT * FROM life('plain'))) d;
-- The operator's figures, read on the hostile path (expressions here are qualified, so that
-- only jobcap's own SQL could meet the shadows): the same numbers for both queues, and no
-- shadow ran.
SET search_path = regress_evil, pg_catalog, public;
SELECT jobcap.refresh_stats() OPERATOR(pg_catalog.>) 0 AS counted;
SELECT queue, pending, scheduled, running, succeeded, dead, cancelled, failed_attempts, failing_jobs,
       lost_leases, crashed_jobs, new_dead
  FROM jobcap.queue_stats WHERE queue OPERATOR(pg_catalog.=) ANY (ARRAY['plain', 'hostile']) ORDER BY queue;
SELECT queue, failures, errors, crashes FROM jobcap.top_failing_jobs() ORDER BY queue;
SELECT pg_catalog.length(jobcap.metrics()) OPERATOR(pg_catalog.>) 0 AS metrics;
RESET search_path;
SELECT count(*) AS shadows_run FROM regress_evil.calls;

DROP FUNCTION life(text);
SELECT count(*) AS dropped FROM (SELECT jobcap.drop_queue(q, force => true)
                                   FROM (VALUES ('plain'), ('hostile'), ('closed')) v(q)) d;
DROP SCHEMA regress_evil CASCADE;
DROP OWNED BY regress_hijacker;
DROP ROLE regress_hijacker;
