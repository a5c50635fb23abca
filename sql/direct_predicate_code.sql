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
CREATE TABLE public.r5_who (who name, path text);
GRANT INSERT ON public.r5_who TO PUBLIC;
-- The DBA's hash opclass: its extended hash calls hashint4extended unqualified.
CREATE FUNCTION public.r5_hash(int4, int8) RETURNS int8 LANGUAGE sql IMMUTABLE
  AS 'SELECT hashint4extended($1, $2)';
CREATE OPERATOR CLASS public.r5_hash_ops FOR TYPE int4 USING hash AS
  OPERATOR 1 pg_catalog.=, FUNCTION 1 pg_catalog.hashint4(int4), FUNCTION 2 public.r5_hash(int4, int8);
CREATE TABLE public.r5_parted (k int4) PARTITION BY HASH (k public.r5_hash_ops);
-- The DBA's index on jobs: a predicate of built-in functions only.
CREATE INDEX r5_pred ON jobcap.jobs (job_id)
  WHERE pg_catalog.satisfies_hash_partition('public.r5_parted'::regclass, 2, 0, priority);
SELECT jobcap.create_queue('r5_hq');
CREATE ROLE r5_hash_worker;
GRANT jobcap_worker TO r5_hash_worker;
SELECT jobcap.grant_queue('r5_hq', 'r5_hash_worker');
CREATE SCHEMA r5_evil AUTHORIZATION r5_hash_worker;
SET ROLE r5_hash_worker;
CREATE FUNCTION r5_evil.hashint4extended(int4, int8) RETURNS int8 LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO public.r5_who VALUES (current_user, current_setting('search_path'));
  RETURN pg_catalog.hashint4extended($1, $2);
END $$;
SET search_path = r5_evil, pg_catalog;
SELECT count(*) FROM (SELECT jobcap.enqueue_job('r5_hq', '{}') FROM generate_series(1, 3)) e;
RESET search_path;
RESET ROLE;
-- SQL path: no row.
SELECT who, path, count(*) FROM public.r5_who GROUP BY 1, 2;
DROP INDEX jobcap.r5_pred;
SELECT jobcap.drop_queue('r5_hq', force => true);
DROP SCHEMA r5_evil CASCADE;
DROP TABLE public.r5_parted;
DROP OPERATOR CLASS public.r5_hash_ops USING hash;
DROP OPERATOR FAMILY public.r5_hash_ops USING hash;
DROP FUNCTION public.r5_hash(int4, int8);
DROP TABLE public.r5_who;
DROP ROLE r5_hash_worker;
