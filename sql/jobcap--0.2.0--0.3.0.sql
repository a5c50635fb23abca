-- jobcap 0.2.0 -> 0.3.0. As for 0.2.0, there is no jobcap--0.3.0.sql: CREATE EXTENSION jobcap runs
-- jobcap--0.1.0.sql, jobcap--0.1.0--0.2.0.sql and then this script, so a new install and an
-- upgraded one get the same schema. The rules of the scripts before hold: every name qualified,
-- every function pins search_path, none is SECURITY DEFINER. No function a worker calls is
-- dropped here: a call that resolved it before the update commits would find it gone.
\echo Use "ALTER EXTENSION jobcap UPDATE TO '0.3.0'" to load this file. \quit

-- Every table locked first, jobs before the others, as every worker statement locks them (with
-- the library preloaded, ALTER EXTENSION takes the same locks before this script runs).
LOCK TABLE jobcap.jobs IN ACCESS EXCLUSIVE MODE;
LOCK TABLE jobcap.queues, jobcap.job_errors, jobcap.queue_grants, jobcap.job_schedules
    IN ACCESS EXCLUSIVE MODE;

-- Periodic jobs are the users' data too: pg_dump keeps them with the extension.
SELECT pg_catalog.pg_extension_config_dump('jobcap.job_schedules', '');

COMMENT ON FUNCTION jobcap.cron_next(text, timestamptz) IS
    'The first slot of a five-field cron expression (UTC) after a time; NULL when none comes before the end of PostgreSQL''s timestamps; 22023 for a bad expression.';
