-- A CHECK constraint on jobcap.job_errors that runs SQL through a built-in C function
-- (query_to_xml). not_plain accepts it (a built-in, internal-language function on plain types),
-- so the direct fail_job evaluates it itself, as the tables' owner but without
-- SECURITY_RESTRICTED_OPERATION. The SQL path runs it inside spi_open (owner, restricted): the
-- DBA's function cannot create a temporary table there. On the direct path it can.
\set VERBOSITY terse
SET jobcap.hot_path = direct;
SELECT jobcap.create_queue('r5_xq', max_attempts => 100, backoff_base => '0', backoff_max => '0');
CREATE TABLE public.r5_seen (who name, probe text, path text);
GRANT INSERT ON public.r5_seen TO PUBLIC;
CREATE FUNCTION public.r5_probe() RETURNS int LANGUAGE plpgsql AS $$
DECLARE msg text := 'created';
BEGIN
  BEGIN
    CREATE TEMP TABLE r5_tmp_probe (x int);
  EXCEPTION WHEN OTHERS THEN msg := SQLERRM;
  END;
  INSERT INTO public.r5_seen VALUES (current_user, msg, current_setting('search_path'));
  RETURN 1;
END $$;
ALTER TABLE jobcap.job_errors ADD CONSTRAINT r5_audit
  CHECK (pg_catalog.query_to_xml('select public.r5_probe()', false, false, '') IS NOT NULL) NOT VALID;
CREATE ROLE r5_check_worker;
GRANT jobcap_worker TO r5_check_worker;
SELECT jobcap.grant_queue('r5_xq', 'r5_check_worker');
SELECT jobcap.enqueue_job('r5_xq', '{}') AS j \gset
SET ROLE r5_check_worker;
SELECT jobcap.fail_job(:j, fence, 'boom', retry_in => '0') FROM jobcap.claim_job('r5_xq', 'w');
RESET ROLE;
-- SQL path: "cannot create temporary table within security-restricted operation".
SELECT * FROM public.r5_seen;
DISCARD TEMP;
ALTER TABLE jobcap.job_errors DROP CONSTRAINT r5_audit;
SELECT jobcap.drop_queue('r5_xq', force => true);
DELETE FROM jobcap.job_errors WHERE queue = 'r5_xq';
DROP FUNCTION public.r5_probe();
DROP TABLE public.r5_seen;
DROP ROLE r5_check_worker;
