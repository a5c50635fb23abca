-- A DBA column default made of built-in operators only (not_plain accepts it) whose built-in
-- function dispatches to a DBA's support function: range_eq over a range type whose subtype
-- opclass compares with a PL/pgSQL function. On the SQL path only an INSERT evaluates a default,
-- inside spi_open (the owner, search_path pinned). The direct path folds every default while it
-- learns the table's shape (learn_defaults, eval_const_expressions), on any direct call: here a
-- worker's claim_job runs the DBA's function as the worker, under the worker's search_path.
-- The expected output is the SQL path's.
\set VERBOSITY terse
SELECT jobcap.create_queue('range_default');
SELECT jobcap.enqueue_job('range_default', '{}') > 0 AS enqueued;
CREATE TABLE public.text_cmp_ran (who text, path text);
GRANT INSERT ON public.text_cmp_ran TO PUBLIC;
CREATE FUNCTION public.note_caller() RETURNS void LANGUAGE plpgsql VOLATILE
    AS $$ BEGIN INSERT INTO public.text_cmp_ran VALUES (current_user, current_setting('search_path')); END $$;
CREATE FUNCTION public.noting_text_cmp(a text, b text) RETURNS int LANGUAGE plpgsql IMMUTABLE
    AS $$ BEGIN PERFORM public.note_caller(); RETURN pg_catalog.bttextcmp(a, b); END $$;
CREATE OPERATOR CLASS public.noting_text_ops FOR TYPE text USING btree AS
    OPERATOR 1 pg_catalog.< , OPERATOR 2 pg_catalog.<= , OPERATOR 3 pg_catalog.= ,
    OPERATOR 4 pg_catalog.>= , OPERATOR 5 pg_catalog.> , FUNCTION 1 public.noting_text_cmp(text, text);
CREATE TYPE public.noting_text_range AS RANGE (subtype = text, subtype_opclass = public.noting_text_ops);
ALTER TABLE jobcap.jobs ADD COLUMN range_eq_default bool;
ALTER TABLE jobcap.jobs ALTER COLUMN range_eq_default
    SET DEFAULT ('[a,b]'::public.noting_text_range = '[a,c]'::public.noting_text_range);
TRUNCATE public.text_cmp_ran;
CREATE ROLE regress_range_default_worker LOGIN;
GRANT jobcap_worker TO regress_range_default_worker;
SELECT jobcap.grant_queue('range_default', 'regress_range_default_worker');
SET ROLE regress_range_default_worker;
SET search_path = public, pg_catalog;
SELECT count(*) AS claimed FROM jobcap.claim_job('range_default', 'w');
RESET search_path;
RESET ROLE;
SELECT who, path, count(*) > 0 AS ran FROM public.text_cmp_ran GROUP BY 1, 2;
ALTER TABLE jobcap.jobs DROP COLUMN range_eq_default;
-- The same through a CHECK constraint on jobcap.job_errors, which the direct fail_job evaluates
-- (ExecConstraints) as the caller. On the SQL path it runs inside spi_open.
TRUNCATE public.text_cmp_ran;
ALTER TABLE jobcap.job_errors ADD CONSTRAINT range_check
    CHECK (attempt < 0 OR '[a,b]'::public.noting_text_range <> '[a,c]'::public.noting_text_range);
SELECT job_id AS running_job, fence AS running_fence FROM jobcap.jobs
 WHERE queue = 'range_default' AND state = 'running' \gset
TRUNCATE public.text_cmp_ran;
SET ROLE regress_range_default_worker;
SET search_path = public, pg_catalog;
SELECT jobcap.fail_job(:running_job, :running_fence, 'boom', retry_in => '0') AS state;
RESET search_path;
RESET ROLE;
SELECT who, path, count(*) > 0 AS ran FROM public.text_cmp_ran GROUP BY 1, 2;
ALTER TABLE jobcap.job_errors DROP CONSTRAINT range_check;
DROP TYPE public.noting_text_range;
DROP OPERATOR CLASS public.noting_text_ops USING btree;
DROP OPERATOR FAMILY public.noting_text_ops USING btree;
DROP FUNCTION public.noting_text_cmp(text, text);
DROP FUNCTION public.note_caller();
DROP TABLE public.text_cmp_ran;
SELECT jobcap.revoke_queue('range_default', 'regress_range_default_worker');
SELECT jobcap.drop_queue('range_default', force => true);
DROP ROLE regress_range_default_worker;
