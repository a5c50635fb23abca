-- A DBA's partial index on jobcap.jobs whose predicate calls only a built-in, immutable,
-- internal-language function: satisfies_hash_partition. That function calls the hash support
-- function of the named partitioned table's operator class, a DBA's SQL function here, which
-- calls hashint4extended unqualified. not_plain accepts the predicate (built-in function, built-in
-- argument types), so the direct enqueue evaluates it as the caller, under the caller's
-- search_path: the worker's own hashint4extended runs (and decides which rows the index holds).
-- On the SQL path the predicate runs as the owner with search_path pinned: nothing of the
-- worker's runs.
\set VERBOSITY terse
SET jobcap.hot_path = direct;
CREATE TABLE public.hash_ran (who name, path text);
GRANT INSERT ON public.hash_ran TO PUBLIC;
-- The DBA's hash opclass: its extended hash calls hashint4extended unqualified.
CREATE FUNCTION public.int4_hash_extended(int4, int8) RETURNS int8 LANGUAGE sql IMMUTABLE
  AS 'SELECT hashint4extended($1, $2)';
CREATE OPERATOR CLASS public.int4_hash_ops FOR TYPE int4 USING hash AS
  OPERATOR 1 pg_catalog.=, FUNCTION 1 pg_catalog.hashint4(int4), FUNCTION 2 public.int4_hash_extended(int4, int8);
CREATE TABLE public.hash_parted (k int4) PARTITION BY HASH (k public.int4_hash_ops);
-- The DBA's index on jobs: a predicate of built-in functions only.
CREATE INDEX jobs_hash_pred ON jobcap.jobs (job_id)
  WHERE pg_catalog.satisfies_hash_partition('public.hash_parted'::regclass, 2, 0, priority);
SELECT jobcap.create_queue('hash_pred');
CREATE ROLE regress_hash_pred_worker;
GRANT jobcap_worker TO regress_hash_pred_worker;
SELECT jobcap.grant_queue('hash_pred', 'regress_hash_pred_worker');
CREATE SCHEMA hash_pred_evil AUTHORIZATION regress_hash_pred_worker;
SET ROLE regress_hash_pred_worker;
CREATE FUNCTION hash_pred_evil.hashint4extended(int4, int8) RETURNS int8 LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO public.hash_ran VALUES (current_user, current_setting('search_path'));
  RETURN pg_catalog.hashint4extended($1, $2);
END $$;
SET search_path = hash_pred_evil, pg_catalog;
SELECT count(*) FROM (SELECT jobcap.enqueue_job('hash_pred', '{}') FROM generate_series(1, 3)) e;
RESET search_path;
RESET ROLE;
-- SQL path: no row.
SELECT who, path, count(*) FROM public.hash_ran GROUP BY 1, 2;
DROP INDEX jobcap.jobs_hash_pred;
SELECT jobcap.drop_queue('hash_pred', force => true);
DROP SCHEMA hash_pred_evil CASCADE;
DROP TABLE public.hash_parted;
DROP OPERATOR CLASS public.int4_hash_ops USING hash;
DROP OPERATOR FAMILY public.int4_hash_ops USING hash;
DROP FUNCTION public.int4_hash_extended(int4, int8);
DROP TABLE public.hash_ran;
DROP ROLE regress_hash_pred_worker;
