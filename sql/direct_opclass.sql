-- A DBA's index on jobcap.jobs whose operator class has a comparison function of its own (an SQL
-- function naming jsonb_cmp unqualified). Every enqueue inserts an entry and so compares keys.
-- The SQL path runs the INSERT inside spi_open: as the tables' owner, with search_path pinned
-- to pg_catalog, jobcap, pg_temp. The direct path calls the support function itself, as the
-- caller and under the caller's search_path: a worker's own jsonb_cmp is run (its code as
-- itself, and whatever ordering it returns goes into the DBA's index: amcheck then finds the
-- index corrupt). plain_index therefore checks opclasses, not only expressions and predicates.
-- The expected output is the SQL path's.
\set VERBOSITY terse
SELECT jobcap.create_queue('r4_opclass');
CREATE FUNCTION public.r4_cmp(a jsonb, b jsonb) RETURNS int LANGUAGE sql IMMUTABLE
    AS $$ SELECT jsonb_cmp(a, b) $$;
CREATE OPERATOR CLASS public.r4_jsonb_ops FOR TYPE jsonb USING btree AS
    OPERATOR 1 pg_catalog.< , OPERATOR 2 pg_catalog.<= , OPERATOR 3 pg_catalog.= ,
    OPERATOR 4 pg_catalog.>= , OPERATOR 5 pg_catalog.> , FUNCTION 1 public.r4_cmp(jsonb, jsonb);
CREATE INDEX r4_payload ON jobcap.jobs (payload public.r4_jsonb_ops);
CREATE ROLE r4_worker LOGIN;
GRANT jobcap_worker TO r4_worker;
SELECT jobcap.grant_queue('r4_opclass', 'r4_worker');
CREATE SCHEMA r4_evil AUTHORIZATION r4_worker;
CREATE TABLE public.r4_seen (who text);
GRANT INSERT ON public.r4_seen TO PUBLIC;
SET ROLE r4_worker;
CREATE FUNCTION r4_evil.note() RETURNS void LANGUAGE plpgsql VOLATILE
    AS $$ BEGIN INSERT INTO public.r4_seen VALUES (current_user); END $$;
-- The reverse order.
CREATE FUNCTION r4_evil.jsonb_cmp(a jsonb, b jsonb) RETURNS int LANGUAGE plpgsql IMMUTABLE
    AS $$ BEGIN PERFORM r4_evil.note(); RETURN pg_catalog.jsonb_cmp(b, a); END $$;
SET search_path = r4_evil, pg_catalog;
SELECT array_length(jobcap.enqueue_jobs('r4_opclass',
    (SELECT array_agg(jsonb_build_object('n', n)) FROM generate_series(1, 40) n)), 1) AS enqueued;
SELECT jobcap.enqueue_job('r4_opclass', '{"n": 0}') > 0 AS enqueued;
RESET search_path;
RESET ROLE;
SELECT who, count(*) > 0 AS ran FROM public.r4_seen GROUP BY 1 ORDER BY 1;
CREATE EXTENSION amcheck;
SELECT bt_index_check('jobcap.r4_payload', true);
DROP EXTENSION amcheck;
DROP INDEX jobcap.r4_payload;
DROP OPERATOR CLASS public.r4_jsonb_ops USING btree;
DROP OPERATOR FAMILY public.r4_jsonb_ops USING btree;
DROP FUNCTION public.r4_cmp(jsonb, jsonb);
DROP SCHEMA r4_evil CASCADE;
DROP TABLE public.r4_seen;
SELECT jobcap.revoke_queue('r4_opclass', 'r4_worker');
SELECT jobcap.drop_queue('r4_opclass', force => true);
DROP ROLE r4_worker;
