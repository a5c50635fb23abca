-- A DBA's index on jobcap.jobs whose operator class has a comparison function of its own (an SQL
-- function naming jsonb_cmp unqualified). Every enqueue inserts an entry and so compares keys.
-- The SQL path runs the INSERT inside spi_open: as the tables' owner, with search_path pinned
-- to pg_catalog, jobcap, pg_temp. The direct path calls the support function itself, as the
-- caller and under the caller's search_path: a worker's own jsonb_cmp is run (its code as
-- itself, and whatever ordering it returns goes into the DBA's index: amcheck then finds the
-- index corrupt). plain_index therefore checks opclasses, not only expressions and predicates.
-- The expected output is the SQL path's.
\set VERBOSITY terse
SELECT jobcap.create_queue('opclass');
CREATE FUNCTION public.payload_cmp(a jsonb, b jsonb) RETURNS int LANGUAGE sql IMMUTABLE
    AS $$ SELECT jsonb_cmp(a, b) $$;
CREATE OPERATOR CLASS public.payload_jsonb_ops FOR TYPE jsonb USING btree AS
    OPERATOR 1 pg_catalog.< , OPERATOR 2 pg_catalog.<= , OPERATOR 3 pg_catalog.= ,
    OPERATOR 4 pg_catalog.>= , OPERATOR 5 pg_catalog.> , FUNCTION 1 public.payload_cmp(jsonb, jsonb);
CREATE INDEX jobs_payload_opclass ON jobcap.jobs (payload public.payload_jsonb_ops);
CREATE ROLE regress_opclass_worker LOGIN;
GRANT jobcap_worker TO regress_opclass_worker;
SELECT jobcap.grant_queue('opclass', 'regress_opclass_worker');
CREATE SCHEMA opclass_evil AUTHORIZATION regress_opclass_worker;
CREATE TABLE public.jsonb_cmp_ran (who text);
GRANT INSERT ON public.jsonb_cmp_ran TO PUBLIC;
SET ROLE regress_opclass_worker;
CREATE FUNCTION opclass_evil.note() RETURNS void LANGUAGE plpgsql VOLATILE
    AS $$ BEGIN INSERT INTO public.jsonb_cmp_ran VALUES (current_user); END $$;
-- The reverse order.
CREATE FUNCTION opclass_evil.jsonb_cmp(a jsonb, b jsonb) RETURNS int LANGUAGE plpgsql IMMUTABLE
    AS $$ BEGIN PERFORM opclass_evil.note(); RETURN pg_catalog.jsonb_cmp(b, a); END $$;
SET search_path = opclass_evil, pg_catalog;
SELECT array_length(jobcap.enqueue_jobs('opclass',
    (SELECT array_agg(jsonb_build_object('n', n)) FROM generate_series(1, 40) n)), 1) AS enqueued;
SELECT jobcap.enqueue_job('opclass', '{"n": 0}') > 0 AS enqueued;
RESET search_path;
RESET ROLE;
SELECT who, count(*) > 0 AS ran FROM public.jsonb_cmp_ran GROUP BY 1 ORDER BY 1;
CREATE EXTENSION amcheck;
SELECT bt_index_check('jobcap.jobs_payload_opclass', true);
DROP EXTENSION amcheck;
DROP INDEX jobcap.jobs_payload_opclass;
DROP OPERATOR CLASS public.payload_jsonb_ops USING btree;
DROP OPERATOR FAMILY public.payload_jsonb_ops USING btree;
DROP FUNCTION public.payload_cmp(jsonb, jsonb);
DROP SCHEMA opclass_evil CASCADE;
DROP TABLE public.jsonb_cmp_ran;
SELECT jobcap.revoke_queue('opclass', 'regress_opclass_worker');
SELECT jobcap.drop_queue('opclass', force => true);
DROP ROLE regress_opclass_worker;
