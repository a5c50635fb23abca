-- A DBA's partial index on jobcap.jobs whose predicate uses only the built-in array equality
-- (array_eq: immutable, internal, anyarray arguments) on a built-in element type (json).
-- array_eq calls the element type's equality from its default operator class: json has none
-- built in, so the DBA's (an SQL function calling texteq unqualified) runs. not_plain accepts
-- the predicate (built-in operator and function, built-in types), so the direct enqueue
-- evaluates it as the caller, under the caller's search_path: the worker's own texteq runs.
-- On the SQL path the predicate runs as the owner with search_path pinned: nothing of the
-- worker's runs.
\set VERBOSITY terse
CREATE TABLE public.r6_who (who name, path text);
GRANT INSERT ON public.r6_who TO PUBLIC;
CREATE FUNCTION public.r6_json_eq(json, json) RETURNS bool LANGUAGE sql IMMUTABLE
  AS 'SELECT texteq($1::pg_catalog.text, $2::pg_catalog.text)';
CREATE FUNCTION public.r6_json_hash(json) RETURNS int4 LANGUAGE sql IMMUTABLE
  AS 'SELECT pg_catalog.hashtext($1::pg_catalog.text)';
CREATE OPERATOR public.= (LEFTARG = json, RIGHTARG = json, FUNCTION = public.r6_json_eq);
CREATE OPERATOR CLASS public.r6_json_ops DEFAULT FOR TYPE json USING hash AS
  OPERATOR 1 public.= (json, json), FUNCTION 1 public.r6_json_hash(json);
CREATE INDEX r6_pred ON jobcap.jobs (job_id)
  WHERE '{"{}"}'::json[] OPERATOR(pg_catalog.=) '{"{}"}'::json[];
SELECT jobcap.create_queue('r6_q');
CREATE ROLE r6_worker;
GRANT jobcap_worker TO r6_worker;
SELECT jobcap.grant_queue('r6_q', 'r6_worker');
CREATE SCHEMA r6_evil AUTHORIZATION r6_worker;
\c
SET ROLE r6_worker;
CREATE FUNCTION r6_evil.texteq(text, text) RETURNS bool LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO public.r6_who VALUES (current_user, current_setting('search_path'));
  RETURN pg_catalog.texteq($1, $2);
END $$;
SET search_path = r6_evil, pg_catalog;
SELECT count(*) FROM (SELECT jobcap.enqueue_job('r6_q', '{}') FROM generate_series(1, 3)) e;
RESET search_path;
RESET ROLE;
-- SQL path: no row.
SELECT who, path, count(*) FROM public.r6_who GROUP BY 1, 2;
DROP INDEX jobcap.r6_pred;
SELECT jobcap.drop_queue('r6_q', force => true);
DROP SCHEMA r6_evil CASCADE;
DROP OPERATOR CLASS public.r6_json_ops USING hash;
DROP OPERATOR FAMILY public.r6_json_ops USING hash;
DROP OPERATOR public.= (json, json);
DROP FUNCTION public.r6_json_eq(json, json);
DROP FUNCTION public.r6_json_hash(json);
DROP TABLE public.r6_who;
DROP ROLE r6_worker;
