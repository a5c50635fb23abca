-- jobcap 0.1.0 -> 0.2.0. There is no jobcap--0.2.0.sql: CREATE EXTENSION jobcap runs
-- jobcap--0.1.0.sql and then this script (PostgreSQL follows the update path), so a new install
-- and an upgraded one get the same schema, and every 0.2.0 change is written once, here.
-- The rules of jobcap--0.1.0.sql hold: every name qualified, every function pins search_path,
-- none is SECURITY DEFINER; new objects get their privileges in the last section.
\echo Use "ALTER EXTENSION jobcap UPDATE TO '0.2.0'" to load this file. \quit

-- Backups, rolled-back claims, caps.

-- Giving back an unstarted job: release_job.

-- Queue controls: pause and resume, max_running, periodic jobs, job output.

-- What the Celery and Django-Q adapters call.

CREATE FUNCTION jobcap.give_up_job(job_id bigint, fence bigint, reason text)
RETURNS jobcap.job_state
LANGUAGE C VOLATILE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_give_up_job';
COMMENT ON FUNCTION jobcap.give_up_job(bigint, bigint, text) IS
    'A worker ends its running job now: dead at once, its budget set to the attempts counted (this one was the last), the reason kept in its history; a stale fence raises JC001.';

CREATE FUNCTION jobcap.queue_depth(queue text)
RETURNS TABLE (ready bigint, scheduled bigint, running bigint)
LANGUAGE C STABLE ROWS 1
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_queue_depth';
COMMENT ON FUNCTION jobcap.queue_depth(text) IS
    'Jobs of a queue the caller may work: pending and due (ready), pending for later (scheduled), and running.';

CREATE FUNCTION jobcap.purge_pending(queue text, max_jobs integer DEFAULT 1000)
RETURNS integer
LANGUAGE C VOLATILE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_purge_pending';
COMMENT ON FUNCTION jobcap.purge_pending(text, integer) IS
    'Deletes up to max_jobs pending jobs of a queue with their history, oldest first; returns how many. Call again until it returns less than max_jobs.';

-- The hot path's tables and indexes.

-- Privileges of the objects above (the same policy as 0.1.0: PUBLIC gets nothing).

REVOKE ALL ON FUNCTION
    jobcap.give_up_job(bigint, bigint, text),
    jobcap.queue_depth(text),
    jobcap.purge_pending(text, integer)
FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    jobcap.give_up_job(bigint, bigint, text),
    jobcap.queue_depth(text)
TO jobcap_worker;
GRANT EXECUTE ON FUNCTION
    jobcap.queue_depth(text),
    jobcap.purge_pending(text, integer)
TO jobcap_operator;

-- Default privileges of the installing role may have granted more on the objects created above
-- (the same sweep as 0.1.0's, run again after them); take back anything on jobcap's objects held by a role other than the owner and the two above.
DO $acl$
DECLARE
    o record;
    who pg_catalog.text;
    revoked pg_catalog.text[] := '{}';
BEGIN
    FOR o IN
        SELECT DISTINCT pg_catalog.format('%s %s', k.kind, k.name) AS what, k.grantee
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
        who := CASE WHEN o.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                    ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(o.grantee)) END;
        EXECUTE pg_catalog.format('REVOKE ALL ON %s FROM %s', o.what, who);
        revoked := revoked OPERATOR(pg_catalog.||) pg_catalog.format('%s from %s', o.what, who);
    END LOOP;
    -- A warning: CREATE EXTENSION hides notices.
    IF pg_catalog.cardinality(revoked) OPERATOR(pg_catalog.>) 0 THEN
        RAISE WARNING 'jobcap: revoked % privileges that default privileges had granted on its objects',
                      pg_catalog.cardinality(revoked)
            USING DETAIL = pg_catalog.array_to_string(revoked, E'\n'),
                  HINT = 'jobcap grants its objects to jobcap_worker and jobcap_operator only; grant those roles instead.';
    END IF;
END
$acl$;
