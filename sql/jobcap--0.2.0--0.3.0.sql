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

-- A job's result for the side that enqueued it (issue 33): a worker role reads its granted
-- queues' jobs through this function, never through the table.
CREATE FUNCTION jobcap.job_result(job_id bigint)
RETURNS TABLE (state jobcap.job_state, attempts integer, output jsonb, error text,
               finished_at timestamptz)
LANGUAGE C STABLE ROWS 1
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_job_result';
COMMENT ON FUNCTION jobcap.job_result(bigint) IS
    'A job of a queue the caller may work: its state, attempts, the output complete_job kept, the last error reported, and when it finished; 42501 for a job of another queue or none.';
REVOKE ALL ON FUNCTION jobcap.job_result(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION jobcap.job_result(bigint) TO jobcap_worker;

-- Roles in one step (issue 33): grant_queue can create the queue it grants, so that an owner
-- sets up a worker role's queue before either exists in one call. Only owners call it, so it can
-- be replaced here.
DROP FUNCTION jobcap.grant_queue(text, text);
CREATE FUNCTION jobcap.grant_queue(queue text, role text, create_missing boolean DEFAULT false)
RETURNS boolean
LANGUAGE C VOLATILE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_grant_queue';
COMMENT ON FUNCTION jobcap.grant_queue(text, text, boolean) IS
    'Lets role (and roles with its privileges) enqueue, claim and settle jobs of queue; false if it already could. With create_missing, a missing queue is created first with create_queue''s defaults.';
REVOKE ALL ON FUNCTION jobcap.grant_queue(text, text, boolean) FROM PUBLIC;

-- As in 0.2.0: default privileges of the role running this script may have granted more on the
-- objects above; take back anything held by a role other than the owner and jobcap's two roles.
DO $acl$
DECLARE
    o record;
    revoked pg_catalog.text[] := '{}';
BEGIN
    FOR o IN
        SELECT DISTINCT pg_catalog.format('%s %s', k.kind, k.name) AS what,
               CASE WHEN k.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                    ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(k.grantee)) END AS who
          FROM (SELECT CASE WHEN c.relkind OPERATOR(pg_catalog.=) 'S' THEN 'SEQUENCE' ELSE 'TABLE' END AS kind,
                       c.oid::pg_catalog.regclass::pg_catalog.text AS name, a.grantee, c.relowner AS owner
                  FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
                 WHERE c.relnamespace OPERATOR(pg_catalog.=) 'jobcap'::pg_catalog.regnamespace
                UNION ALL
                SELECT 'FUNCTION', p.oid::pg_catalog.regprocedure::pg_catalog.text, a.grantee, p.proowner
                  FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
                 WHERE p.pronamespace OPERATOR(pg_catalog.=) 'jobcap'::pg_catalog.regnamespace) k
         WHERE k.grantee OPERATOR(pg_catalog.<>) k.owner
           AND k.grantee OPERATOR(pg_catalog.<>) ALL (ARRAY['jobcap_worker'::pg_catalog.regrole,
                                                          'jobcap_operator'::pg_catalog.regrole]::pg_catalog.oid[])
         ORDER BY 1, 2
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON %s FROM %s', o.what, o.who);
        revoked := revoked OPERATOR(pg_catalog.||) pg_catalog.format('%s from %s', o.what, o.who);
    END LOOP;
    IF pg_catalog.cardinality(revoked) OPERATOR(pg_catalog.>) 0 THEN
        RAISE WARNING 'jobcap: revoked % privileges that default privileges had granted on its objects',
                      pg_catalog.cardinality(revoked)
            USING DETAIL = pg_catalog.array_to_string(revoked, E'\n'),
                  HINT = 'jobcap grants its objects to jobcap_worker and jobcap_operator only; grant those roles instead.';
    END IF;
END
$acl$;
