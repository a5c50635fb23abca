-- jobcap 0.1.0 -> 0.2.0. There is no jobcap--0.2.0.sql: CREATE EXTENSION jobcap runs
-- jobcap--0.1.0.sql and then this script (PostgreSQL follows the update path), so a new install
-- and an upgraded one get the same schema, and every 0.2.0 change is written once, here.
-- The rules of jobcap--0.1.0.sql hold: every name qualified, every function pins search_path,
-- none is SECURITY DEFINER; new objects get their privileges in the last section.
\echo Use "ALTER EXTENSION jobcap UPDATE TO '0.2.0'" to load this file. \quit

-- Backups, rolled-back claims, caps.

-- Rolled-back claims (src/background/rollbacks.cpp). With jobcap preloaded, the attempt of a
-- claim whose transaction rolled back is still counted: the reaper adds it in a transaction of
-- its own and leaves a history row of kind claim_rolled_back. Like an expired lease, such an
-- attempt ended without a report: the statistics count both as lost leases and crashes.
ALTER TABLE jobcap.job_errors DROP CONSTRAINT job_errors_kind_check;
ALTER TABLE jobcap.job_errors ADD CONSTRAINT job_errors_kind_check
    CHECK (kind OPERATOR(pg_catalog.=) ANY ('{error,lease_expired,requeued,claim_rolled_back}'));
COMMENT ON TABLE jobcap.job_errors IS
    'Attempts that ended badly: reported errors, leases that expired without a report, claims that rolled back, requeues.';

CREATE OR REPLACE VIEW jobcap.dead_jobs AS
SELECT j.job_id, j.queue, j.attempts, coalesce(j.max_attempts, q.max_attempts) AS max_attempts,
       j.finished_at AS died_at, j.enqueued_at, j.worker AS last_worker, j.dedupe_key,
       e.kind AS last_outcome, e.error AS last_error,
       h.errors, h.crashes, h.first_failure_at, h.last_failure_at
  FROM jobcap.jobs j
  LEFT JOIN jobcap.queues q ON q.queue OPERATOR(pg_catalog.=) j.queue
  LEFT JOIN LATERAL (SELECT e.kind, e.error FROM jobcap.job_errors e
                      WHERE e.job_id OPERATOR(pg_catalog.=) j.job_id
                      ORDER BY e.seq DESC LIMIT 1) e ON true
  LEFT JOIN LATERAL (SELECT count(*) FILTER (WHERE h.kind OPERATOR(pg_catalog.=) 'error') AS errors,
                            count(*) FILTER (WHERE h.kind OPERATOR(pg_catalog.=) ANY ('{lease_expired,claim_rolled_back}')) AS crashes,
                            min(h.at) FILTER (WHERE h.kind OPERATOR(pg_catalog.<>) 'requeued') AS first_failure_at,
                            max(h.at) FILTER (WHERE h.kind OPERATOR(pg_catalog.<>) 'requeued') AS last_failure_at
                       FROM jobcap.job_errors h
                      WHERE h.job_id OPERATOR(pg_catalog.=) j.job_id) h ON true
 WHERE j.state OPERATOR(pg_catalog.=) 'dead'::jobcap.job_state;

-- Without the preload there is no shared memory to keep rolled-back claims in: say so at
-- install (and upgrade) time, beside the warning about the worker (a WARNING: extension
-- scripts hide notices). The ring is allocated exactly when jobcap is preloaded.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_shmem_allocations s
                    WHERE s.name OPERATOR(pg_catalog.=) 'jobcap rolled-back claims') THEN
        RAISE WARNING 'jobcap is not preloaded: a claim whose transaction rolls back does not count its attempt'
            USING DETAIL = 'BEGIN; claim; ROLLBACK undoes the attempt count, so a job whose claims '
                           'keep rolling back never reaches its cap.',
                  HINT = 'Add jobcap to shared_preload_libraries and restart the server, and '
                         'commit every claim before its work starts.';
    END IF;
END
$$;

-- (End of rolled-back claims.)

-- Giving back an unstarted job: release_job.

-- Queue controls: pause and resume, max_running, periodic jobs, job output.

-- What the Celery and Django-Q adapters call.

-- The hot path's tables and indexes.

-- Privileges of the objects above (the same policy as 0.1.0: PUBLIC gets nothing).
