-- The same as direct_array_opclass for a column default: a DBA adds a column to jobcap.jobs
-- whose default compares two json[] constants with the built-in array equality. learn_defaults
-- accepts it (not_plain: built-in operator and types) and folds it (eval_const_expressions) as
-- the enqueuing worker, under the worker's search_path: the DBA's json equality (an SQL function
-- calling texteq unqualified) runs the worker's texteq. The SQL path's INSERT folds it as the
-- owner, search_path pinned.
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
ALTER TABLE jobcap.jobs ADD COLUMN r6_flag bool
  DEFAULT ('{"{}"}'::json[] OPERATOR(pg_catalog.=) '{"{}"}'::json[]);
SELECT jobcap.create_queue('r6_dq');
CREATE ROLE r6_dworker;
GRANT jobcap_worker TO r6_dworker;
SELECT jobcap.grant_queue('r6_dq', 'r6_dworker');
CREATE SCHEMA r6_devil AUTHORIZATION r6_dworker;
\c
SET ROLE r6_dworker;
CREATE FUNCTION r6_devil.texteq(text, text) RETURNS bool LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO public.r6_who VALUES (current_user, current_setting('search_path'));
  RETURN pg_catalog.texteq($1, $2);
END $$;
SET search_path = r6_devil, pg_catalog;
SELECT count(*) FROM (SELECT jobcap.enqueue_job('r6_dq', '{}') FROM generate_series(1, 3)) e;
RESET search_path;
RESET ROLE;
-- SQL path: no row.
SELECT who, path, count(*) FROM public.r6_who GROUP BY 1, 2;
SELECT r6_flag, count(*) FROM jobcap.jobs WHERE queue = 'r6_dq' GROUP BY 1;
SELECT jobcap.drop_queue('r6_dq', force => true);
ALTER TABLE jobcap.jobs DROP COLUMN r6_flag;
DROP SCHEMA r6_devil CASCADE;
DROP OPERATOR CLASS public.r6_json_ops USING hash;
DROP OPERATOR FAMILY public.r6_json_ops USING hash;
DROP OPERATOR public.= (json, json);
DROP FUNCTION public.r6_json_eq(json, json);
DROP FUNCTION public.r6_json_hash(json);
DROP TABLE public.r6_who;
DROP ROLE r6_dworker;
