-- A DBA's partial index on jobcap.jobs whose predicate uses only the built-in array equality
-- (array_eq: immutable, internal, anyarray arguments) on a built-in element type (json).
-- array_eq calls the element type's equality from its default operator class: json has none
-- built in, so the DBA's (an SQL function calling texteq unqualified) runs. not_plain accepts
-- the predicate (built-in operator and function, built-in types), so the direct enqueue
-- evaluates it as the caller, under the caller's search_path: the worker's own texteq runs.
-- On the SQL path the predicate runs as the owner with search_path pinned: nothing of the
-- worker's runs.
\set VERBOSITY terse
CREATE TABLE public.json_eq_ran (who name, path text);
GRANT INSERT ON public.json_eq_ran TO PUBLIC;
CREATE FUNCTION public.json_eq_by_text(json, json) RETURNS bool LANGUAGE sql IMMUTABLE
  AS 'SELECT texteq($1::pg_catalog.text, $2::pg_catalog.text)';
CREATE FUNCTION public.json_hash_by_text(json) RETURNS int4 LANGUAGE sql IMMUTABLE
  AS 'SELECT pg_catalog.hashtext($1::pg_catalog.text)';
CREATE OPERATOR public.= (LEFTARG = json, RIGHTARG = json, FUNCTION = public.json_eq_by_text);
CREATE OPERATOR CLASS public.json_by_text_ops DEFAULT FOR TYPE json USING hash AS
  OPERATOR 1 public.= (json, json), FUNCTION 1 public.json_hash_by_text(json);
CREATE INDEX jobs_json_array_pred ON jobcap.jobs (job_id)
  WHERE '{"{}"}'::json[] OPERATOR(pg_catalog.=) '{"{}"}'::json[];
SELECT jobcap.create_queue('array_pred');
CREATE ROLE regress_array_pred_worker;
GRANT jobcap_worker TO regress_array_pred_worker;
SELECT jobcap.grant_queue('array_pred', 'regress_array_pred_worker');
CREATE SCHEMA array_pred_evil AUTHORIZATION regress_array_pred_worker;
\c
SET ROLE regress_array_pred_worker;
CREATE FUNCTION array_pred_evil.texteq(text, text) RETURNS bool LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO public.json_eq_ran VALUES (current_user, current_setting('search_path'));
  RETURN pg_catalog.texteq($1, $2);
END $$;
SET search_path = array_pred_evil, pg_catalog;
SELECT count(*) FROM (SELECT jobcap.enqueue_job('array_pred', '{}') FROM generate_series(1, 3)) e;
RESET search_path;
RESET ROLE;
-- SQL path: no row.
SELECT who, path, count(*) FROM public.json_eq_ran GROUP BY 1, 2;
DROP INDEX jobcap.jobs_json_array_pred;
SELECT jobcap.drop_queue('array_pred', force => true);
DROP SCHEMA array_pred_evil CASCADE;
DROP OPERATOR CLASS public.json_by_text_ops USING hash;
DROP OPERATOR FAMILY public.json_by_text_ops USING hash;
DROP OPERATOR public.= (json, json);
DROP FUNCTION public.json_eq_by_text(json, json);
DROP FUNCTION public.json_hash_by_text(json);
DROP TABLE public.json_eq_ran;
DROP ROLE regress_array_pred_worker;
