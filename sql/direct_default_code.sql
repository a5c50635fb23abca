-- A DBA column default made of built-in operators only (not_plain accepts it) whose built-in
-- function dispatches to a DBA's support function: range_eq over a range type whose subtype
-- opclass compares with a PL/pgSQL function. On the SQL path only an INSERT evaluates a default,
-- inside spi_open (the owner, search_path pinned). The direct path folds every default while it
-- learns the table's shape (learn_defaults, eval_const_expressions), on any direct call: here a
-- worker's claim_job runs the DBA's function as the worker, under the worker's search_path.
-- The expected output is the SQL path's.
\set VERBOSITY terse
SELECT jobcap.create_queue('r4_range');
SELECT jobcap.enqueue_job('r4_range', '{}') > 0 AS enqueued;
CREATE TABLE public.r4_who (who text, path text);
GRANT INSERT ON public.r4_who TO PUBLIC;
CREATE FUNCTION public.r4_note() RETURNS void LANGUAGE plpgsql VOLATILE
    AS $$ BEGIN INSERT INTO public.r4_who VALUES (current_user, current_setting('search_path')); END $$;
CREATE FUNCTION public.r4_tcmp(a text, b text) RETURNS int LANGUAGE plpgsql IMMUTABLE
    AS $$ BEGIN PERFORM public.r4_note(); RETURN pg_catalog.bttextcmp(a, b); END $$;
CREATE OPERATOR CLASS public.r4_text_ops FOR TYPE text USING btree AS
    OPERATOR 1 pg_catalog.< , OPERATOR 2 pg_catalog.<= , OPERATOR 3 pg_catalog.= ,
    OPERATOR 4 pg_catalog.>= , OPERATOR 5 pg_catalog.> , FUNCTION 1 public.r4_tcmp(text, text);
CREATE TYPE public.r4_range AS RANGE (subtype = text, subtype_opclass = public.r4_text_ops);
ALTER TABLE jobcap.jobs ADD COLUMN r4_flag bool;
ALTER TABLE jobcap.jobs ALTER COLUMN r4_flag
    SET DEFAULT ('[a,b]'::public.r4_range = '[a,c]'::public.r4_range);
TRUNCATE public.r4_who;
CREATE ROLE r4_range_worker LOGIN;
GRANT jobcap_worker TO r4_range_worker;
SELECT jobcap.grant_queue('r4_range', 'r4_range_worker');
SET ROLE r4_range_worker;
SET search_path = public, pg_catalog;
SELECT count(*) AS claimed FROM jobcap.claim_job('r4_range', 'w');
RESET search_path;
RESET ROLE;
SELECT who, path, count(*) > 0 AS ran FROM public.r4_who GROUP BY 1, 2;
ALTER TABLE jobcap.jobs DROP COLUMN r4_flag;
-- The same through a CHECK constraint on jobcap.job_errors, which the direct fail_job evaluates
-- (ExecConstraints) as the caller. On the SQL path it runs inside spi_open.
TRUNCATE public.r4_who;
ALTER TABLE jobcap.job_errors ADD CONSTRAINT r4_check
    CHECK (attempt < 0 OR '[a,b]'::public.r4_range <> '[a,c]'::public.r4_range);
SELECT job_id AS r4_job, fence AS r4_fence FROM jobcap.jobs
 WHERE queue = 'r4_range' AND state = 'running' \gset
TRUNCATE public.r4_who;
SET ROLE r4_range_worker;
SET search_path = public, pg_catalog;
SELECT jobcap.fail_job(:r4_job, :r4_fence, 'boom', retry_in => '0') AS state;
RESET search_path;
RESET ROLE;
SELECT who, path, count(*) > 0 AS ran FROM public.r4_who GROUP BY 1, 2;
ALTER TABLE jobcap.job_errors DROP CONSTRAINT r4_check;
DROP TYPE public.r4_range;
DROP OPERATOR CLASS public.r4_text_ops USING btree;
DROP OPERATOR FAMILY public.r4_text_ops USING btree;
DROP FUNCTION public.r4_tcmp(text, text);
DROP FUNCTION public.r4_note();
DROP TABLE public.r4_who;
SELECT jobcap.revoke_queue('r4_range', 'r4_range_worker');
SELECT jobcap.drop_queue('r4_range', force => true);
DROP ROLE r4_range_worker;
