-- A CHECK constraint on jobcap.job_errors that runs SQL through a built-in C function
-- (query_to_xml). not_plain accepts it (a built-in, internal-language function on plain types),
-- so the direct fail_job evaluates it itself, as the tables' owner but without
-- SECURITY_RESTRICTED_OPERATION. The SQL path runs it inside spi_open (owner, restricted): the
-- DBA's function cannot create a temporary table there. On the direct path it can.
\set VERBOSITY terse
SET jobcap.hot_path = direct;
SELECT jobcap.create_queue('check_sql', max_attempts => 100, backoff_base => '0', backoff_max => '0');
CREATE TABLE public.check_sql_ran (who name, probe text, path text);
GRANT INSERT ON public.check_sql_ran TO PUBLIC;
CREATE FUNCTION public.try_temp_table() RETURNS int LANGUAGE plpgsql AS $$
DECLARE msg text := 'created';
BEGIN
  BEGIN
    CREATE TEMP TABLE temp_probe (x int);
  EXCEPTION WHEN OTHERS THEN msg := SQLERRM;
  END;
  INSERT INTO public.check_sql_ran VALUES (current_user, msg, current_setting('search_path'));
  RETURN 1;
END $$;
ALTER TABLE jobcap.job_errors ADD CONSTRAINT runs_sql
  CHECK (pg_catalog.query_to_xml('select public.try_temp_table()', false, false, '') IS NOT NULL) NOT VALID;
CREATE ROLE regress_check_sql_worker;
GRANT jobcap_worker TO regress_check_sql_worker;
SELECT jobcap.grant_queue('check_sql', 'regress_check_sql_worker');
SELECT jobcap.enqueue_job('check_sql', '{}') AS j \gset
SET ROLE regress_check_sql_worker;
SELECT jobcap.fail_job(:j, fence, 'boom', retry_in => '0') FROM jobcap.claim_job('check_sql', 'w');
RESET ROLE;
-- SQL path: "cannot create temporary table within security-restricted operation".
SELECT * FROM public.check_sql_ran;
DISCARD TEMP;
ALTER TABLE jobcap.job_errors DROP CONSTRAINT runs_sql;
SELECT jobcap.drop_queue('check_sql', force => true);
DELETE FROM jobcap.job_errors WHERE queue = 'check_sql';
DROP FUNCTION public.try_temp_table();
DROP TABLE public.check_sql_ran;
DROP ROLE regress_check_sql_worker;
