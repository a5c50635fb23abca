-- The same as direct_array_opclass for a column default: a DBA adds a column to jobcap.jobs
-- whose default compares two json[] constants with the built-in array equality. learn_defaults
-- accepts it (not_plain: built-in operator and types) and folds it (eval_const_expressions) as
-- the enqueuing worker, under the worker's search_path: the DBA's json equality (an SQL function
-- calling texteq unqualified) runs the worker's texteq. The SQL path's INSERT folds it as the
-- owner, search_path pinned.
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
ALTER TABLE jobcap.jobs ADD COLUMN json_array_default bool
  DEFAULT ('{"{}"}'::json[] OPERATOR(pg_catalog.=) '{"{}"}'::json[]);
SELECT jobcap.create_queue('array_default');
CREATE ROLE regress_array_default_worker;
GRANT jobcap_worker TO regress_array_default_worker;
SELECT jobcap.grant_queue('array_default', 'regress_array_default_worker');
CREATE SCHEMA array_default_evil AUTHORIZATION regress_array_default_worker;
\c
SET ROLE regress_array_default_worker;
CREATE FUNCTION array_default_evil.texteq(text, text) RETURNS bool LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO public.json_eq_ran VALUES (current_user, current_setting('search_path'));
  RETURN pg_catalog.texteq($1, $2);
END $$;
SET search_path = array_default_evil, pg_catalog;
SELECT count(*) FROM (SELECT jobcap.enqueue_job('array_default', '{}') FROM generate_series(1, 3)) e;
RESET search_path;
RESET ROLE;
-- SQL path: no row.
SELECT who, path, count(*) FROM public.json_eq_ran GROUP BY 1, 2;
SELECT json_array_default, count(*) FROM jobcap.jobs WHERE queue = 'array_default' GROUP BY 1;
SELECT jobcap.drop_queue('array_default', force => true);
ALTER TABLE jobcap.jobs DROP COLUMN json_array_default;
DROP SCHEMA array_default_evil CASCADE;
DROP OPERATOR CLASS public.json_by_text_ops USING hash;
DROP OPERATOR FAMILY public.json_by_text_ops USING hash;
DROP OPERATOR public.= (json, json);
DROP FUNCTION public.json_eq_by_text(json, json);
DROP FUNCTION public.json_hash_by_text(json);
DROP TABLE public.json_eq_ran;
DROP ROLE regress_array_default_worker;
