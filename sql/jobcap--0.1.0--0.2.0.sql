-- jobcap 0.1.0 -> 0.2.0. There is no jobcap--0.2.0.sql: CREATE EXTENSION jobcap runs
-- jobcap--0.1.0.sql and then this script (PostgreSQL follows the update path), so a new install
-- and an upgraded one get the same schema, and every 0.2.0 change is written once, here.
-- The rules of jobcap--0.1.0.sql hold: every name qualified, every function pins search_path,
-- none is SECURITY DEFINER; new objects get their privileges in the last section.
\echo Use "ALTER EXTENSION jobcap UPDATE TO '0.2.0'" to load this file. \quit

-- Backups, rolled-back claims, caps.

-- Giving back an unstarted job: release_job. A client that claimed more jobs than it started
-- (a prefetched batch, a shutdown) gives the unstarted ones back: pending again, the claim's
-- attempt not counted, the fence left stale (the sequence never goes back, so the next claim
-- gets a newer one), and a history row of kind 'released'. The contract for client authors:
-- release only a job whose handler never started; a job whose work began is completed, failed
-- or crashed (crash_job), never released, or it could run past its cap.
-- crash_job is fail_job for a handler whose process died (a signal, an exit without a report),
-- seen by the supervising process that holds the lease: the attempt counts, and the history
-- row's kind is 'crashed', so a job's history tells a crash from an error at once, without
-- waiting for the lease to expire (the reaper's 'lease_expired').
ALTER TABLE jobcap.job_errors DROP CONSTRAINT job_errors_kind_check;
ALTER TABLE jobcap.job_errors ADD CONSTRAINT job_errors_kind_check
    CHECK (kind OPERATOR(pg_catalog.=) ANY ('{error,lease_expired,crashed,requeued,released}'));
COMMENT ON TABLE jobcap.job_errors IS
    'Attempts that ended badly (reported errors, crashes seen by the worker, leases that expired without a report), requeues and releases.';

CREATE FUNCTION jobcap.release_job(job_id bigint, fence bigint)
RETURNS jobcap.job_state
LANGUAGE C VOLATILE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_release_job';
COMMENT ON FUNCTION jobcap.release_job(bigint, bigint) IS
    'Gives back a claimed job whose handler never started: pending, its attempt not counted, its fence stale; a stale fence raises JC001.';

CREATE FUNCTION jobcap.crash_job(job_id bigint, fence bigint, error text)
RETURNS jobcap.job_state
LANGUAGE C VOLATILE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_crash_job';
COMMENT ON FUNCTION jobcap.crash_job(bigint, bigint, text) IS
    'fail_job for a handler whose process died (history kind crashed): retried after backoff, or dead at the cap; a stale fence raises JC001.';

-- Crashes count as crashes wherever history is summed: those the reaper found (lease_expired)
-- and those a worker's supervisor saw (crashed). Releases are not failures.
CREATE OR REPLACE VIEW jobcap.dead_jobs AS
SELECT j.job_id, j.queue, j.attempts, coalesce(j.max_attempts, q.max_attempts) AS max_attempts,
       j.finished_at AS died_at, j.enqueued_at, j.worker AS last_worker, j.dedupe_key,
       e.kind AS last_outcome, e.error AS last_error,
       h.errors, h.crashes, h.first_failure_at, h.last_failure_at
  FROM jobcap.jobs j
  LEFT JOIN jobcap.queues q ON q.queue OPERATOR(pg_catalog.=) j.queue
  LEFT JOIN LATERAL (SELECT e.kind, e.error FROM jobcap.job_errors e
                      WHERE e.job_id OPERATOR(pg_catalog.=) j.job_id
                        AND e.kind OPERATOR(pg_catalog.<>) 'released'
                      ORDER BY e.seq DESC LIMIT 1) e ON true
  LEFT JOIN LATERAL (SELECT count(*) FILTER (WHERE h.kind OPERATOR(pg_catalog.=) 'error') AS errors,
                            count(*) FILTER (WHERE h.kind OPERATOR(pg_catalog.=) ANY ('{lease_expired,crashed}')) AS crashes,
                            min(h.at) FILTER (WHERE h.kind OPERATOR(pg_catalog.=) ANY ('{error,lease_expired,crashed}')) AS first_failure_at,
                            max(h.at) FILTER (WHERE h.kind OPERATOR(pg_catalog.=) ANY ('{error,lease_expired,crashed}')) AS last_failure_at
                       FROM jobcap.job_errors h
                      WHERE h.job_id OPERATOR(pg_catalog.=) j.job_id) h ON true
 WHERE j.state OPERATOR(pg_catalog.=) 'dead'::jobcap.job_state;

-- Queue controls: pause and resume, max_running, periodic jobs, job output.

-- What the Celery and Django-Q adapters call.

-- The hot path's tables and indexes.

-- Privileges of the objects above (the same policy as 0.1.0: PUBLIC gets nothing).
REVOKE ALL ON FUNCTION jobcap.release_job(bigint, bigint), jobcap.crash_job(bigint, bigint, text)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION jobcap.release_job(bigint, bigint), jobcap.crash_job(bigint, bigint, text)
    TO jobcap_worker;

-- Default privileges of the installing role may have granted more on the objects this script
-- creates; take back anything on jobcap's objects held by a role other than the owner and
-- jobcap_worker and jobcap_operator (the same sweep as jobcap--0.1.0.sql; this stays last).
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
