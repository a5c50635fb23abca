-- Indexes a DBA adds to jobcap.jobs whose expressions the direct path compiles once per backend
-- (learn_indexes) and evaluates itself. The expected output is the SQL path's.
\set VERBOSITY terse
SELECT jobcap.create_queue('index_exprs', max_attempts => 5);
SELECT array_length(jobcap.enqueue_jobs('index_exprs',
         ARRAY['{"tenant": "T1"}'::jsonb, '{"tenant": "T1"}', '{"tenant": "T1"}',
               '{"tenant": "T1"}', '{"tenant": "T1"}', '{"tenant": "T1"}']), 1) AS enqueued;

-- 1. An index on a function of the whole row (allowed by CREATE INDEX). Its ExprState's
-- whole-row step keeps a tuple descriptor in the per-query memory of the EState it first ran
-- with; the direct path frees that EState at the end of each call and keeps the ExprState.
CREATE FUNCTION public.job_key(j jobcap.jobs) RETURNS text LANGUAGE plpgsql IMMUTABLE
    AS $$ BEGIN RETURN j.queue || ':' || j.job_id; END $$;
CREATE INDEX jobs_key ON jobcap.jobs (public.job_key(jobs));
SELECT count(*) AS claimed FROM jobcap.claim_job('index_exprs', 'w');
SELECT count(*) AS claimed FROM jobcap.claim_job('index_exprs', 'w');
SELECT count(*) AS enqueued FROM jobcap.enqueue_job('index_exprs', '{"tenant": "T1"}');
SELECT count(*) AS claimed FROM jobcap.claim_job('index_exprs', 'w', batch => 2);
SELECT jobcap.complete_job(job_id, fence) FROM jobcap.jobs
 WHERE queue = 'index_exprs' AND state = 'running' ORDER BY job_id;
SELECT state, count(*) FROM jobcap.jobs WHERE queue = 'index_exprs' GROUP BY 1 ORDER BY 1;
DROP INDEX jobcap.jobs_key;
DROP FUNCTION public.job_key(jobcap.jobs);

-- 2. An index on an SQL function whose body names lower() unqualified. The SQL path evaluates
-- it inside spi_open (the owner, search_path pinned); the direct path inlines it under the
-- caller's search_path, as the caller, and keeps the result for the backend's life.
CREATE FUNCTION public.tenant(p jsonb) RETURNS text LANGUAGE sql IMMUTABLE
    AS $$ SELECT lower(p ->> 'tenant') $$;
CREATE INDEX jobs_tenant ON jobcap.jobs (public.tenant(payload));
CREATE ROLE index_exprs_worker LOGIN;
GRANT jobcap_worker TO index_exprs_worker;
SELECT jobcap.grant_queue('index_exprs', 'index_exprs_worker');
CREATE SCHEMA index_exprs_evil AUTHORIZATION index_exprs_worker;
CREATE TABLE public.index_exprs_seen (who text);
GRANT INSERT ON public.index_exprs_seen TO PUBLIC;
SET ROLE index_exprs_worker;
CREATE FUNCTION index_exprs_evil.note() RETURNS void LANGUAGE plpgsql VOLATILE
    AS $$ BEGIN INSERT INTO public.index_exprs_seen VALUES (current_user); END $$;
CREATE FUNCTION index_exprs_evil.lower(t text) RETURNS text LANGUAGE plpgsql IMMUTABLE
    AS $$ BEGIN PERFORM index_exprs_evil.note(); RETURN 'hijacked'; END $$;
SET search_path = index_exprs_evil, pg_catalog;
SELECT count(*) AS claimed FROM jobcap.claim_job('index_exprs', 'w');
RESET search_path;
RESET ROLE;
-- The same backend, now as the superuser, with an ordinary search_path.
SELECT count(*) AS completed FROM (SELECT jobcap.complete_job(job_id, fence) FROM jobcap.jobs
 WHERE queue = 'index_exprs' AND state = 'running') c;
SELECT who, count(*) FROM public.index_exprs_seen GROUP BY 1 ORDER BY 1;
-- Every version's entry in jobs_tenant must be what the index's own definition computes.
CREATE EXTENSION amcheck;
SELECT bt_index_check('jobcap.jobs_tenant', true);
DROP EXTENSION amcheck;
DROP INDEX jobcap.jobs_tenant;
DROP FUNCTION public.tenant(jsonb);
DROP SCHEMA index_exprs_evil CASCADE;
DROP TABLE public.index_exprs_seen;
SELECT jobcap.revoke_queue('index_exprs', 'index_exprs_worker');
SELECT jobcap.drop_queue('index_exprs', force => true);
DROP ROLE index_exprs_worker;
