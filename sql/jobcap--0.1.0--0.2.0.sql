-- jobcap 0.1.0 -> 0.2.0. There is no jobcap--0.2.0.sql: CREATE EXTENSION jobcap runs
-- jobcap--0.1.0.sql and then this script (PostgreSQL follows the update path), so a new install
-- and an upgraded one get the same schema, and every 0.2.0 change is written once, here.
-- The rules of jobcap--0.1.0.sql hold: every name qualified, every function pins search_path,
-- none is SECURITY DEFINER; new objects get their privileges in the last section.
\echo Use "ALTER EXTENSION jobcap UPDATE TO '0.2.0'" to load this file. \quit

-- Backups, rolled-back claims, caps.

-- Backups. The rows of these tables are the users' data (queues, jobs, their history, grants,
-- statistics), not the extension's: pg_dump dumps them with the extension, and the positions of
-- the sequences, so a restore (CREATE EXTENSION, then the rows) gives back every job, and the
-- next job id, history row and fence follow those restored (docs/backup.md says what pg_dump's
-- --table, --schema and --data-only do with them).
SELECT pg_catalog.pg_extension_config_dump('jobcap.queues', '');
SELECT pg_catalog.pg_extension_config_dump('jobcap.jobs', '');
SELECT pg_catalog.pg_extension_config_dump('jobcap.job_errors', '');
SELECT pg_catalog.pg_extension_config_dump('jobcap.queue_grants', '');
SELECT pg_catalog.pg_extension_config_dump('jobcap.stats_minutes', '');
SELECT pg_catalog.pg_extension_config_dump('jobcap.stats_latency', '');
SELECT pg_catalog.pg_extension_config_dump('jobcap.stats_progress', '');
SELECT pg_catalog.pg_extension_config_dump('jobcap.fences', '');
SELECT pg_catalog.pg_extension_config_dump('jobcap.jobs_job_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('jobcap.job_errors_seq_seq', '');

-- CREATE EXTENSION writes stats_progress's one row, and a restore then copies the dumped row in:
-- the dumped row replaces it (a restore with --disable-triggers cannot, and fails on the key).
CREATE FUNCTION jobcap.restore_stats_progress()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, jobcap, pg_temp
AS $$
BEGIN
    UPDATE jobcap.stats_progress SET counted_until = NEW.counted_until
     WHERE one OPERATOR(pg_catalog.=) NEW.one;
    IF FOUND THEN
        RETURN NULL;
    END IF;
    RETURN NEW;
END
$$;
COMMENT ON FUNCTION jobcap.restore_stats_progress() IS
    'Trigger: an inserted stats_progress row (a restore) replaces the one CREATE EXTENSION wrote.';
CREATE TRIGGER restore BEFORE INSERT ON jobcap.stats_progress
    FOR EACH ROW EXECUTE FUNCTION jobcap.restore_stats_progress();

-- Fences stay unique when the extension is dropped and created again in the same database
-- (external systems keep them as idempotency keys after the jobs are gone): an install's
-- fences start at the microseconds since 1970 at its creation (or at this update). An install
-- hands out one fence per claim, so its fences stay below the clock as long as it claims fewer
-- than a million jobs a second on average, and a later install starts above all of them unless
-- the clock was set back in between (docs/backup.md). Only ever moved forward.
SELECT pg_catalog.setval('jobcap.fences', c.start, false)
  FROM (SELECT (pg_catalog.extract('epoch', pg_catalog.clock_timestamp())
                OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8 AS start) c,
       jobcap.fences f
 WHERE c.start OPERATOR(pg_catalog.>) f.last_value;

-- DROP EXTENSION drops every object of jobcap but not its schema, and the schema keeps its
-- grants: jobcap_worker and jobcap_operator could not be dropped then. Before a DROP EXTENSION
-- that names jobcap, this trigger revokes every grant on the schema (the DROP's rollback undoes
-- it); the trigger goes with the extension.
CREATE FUNCTION jobcap.before_drop_extension()
RETURNS event_trigger
LANGUAGE C
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_before_drop_extension';
CREATE EVENT TRIGGER jobcap_before_drop_extension ON ddl_command_start
    WHEN TAG IN ('DROP EXTENSION')
    EXECUTE FUNCTION jobcap.before_drop_extension();

-- Caps. A job's cap is the lower of its own max_attempts and its queue's, so a job cannot
-- outlast its queue's cap and lowering that cap binds every job of the queue at once; the one
-- exception is the budget requeue_job (or requeue_dead) grants, which holds until the queue's
-- cap is next lowered. cap_epoch counts a queue's lowerings; a job's cap_epoch is its queue's
-- at the requeue that set its max_attempts (src/spi/cap.hpp writes the rule once).
ALTER TABLE jobcap.queues ADD COLUMN cap_epoch bigint NOT NULL DEFAULT 0;
ALTER TABLE jobcap.jobs ADD COLUMN cap_epoch bigint;
COMMENT ON COLUMN jobcap.queues.cap_epoch IS 'How many times max_attempts was lowered; a lowering ends every budget requeue_job granted before it.';
COMMENT ON COLUMN jobcap.jobs.max_attempts IS 'This job''s own cap: binds only below its queue''s, unless requeue_job set it (see cap_epoch). NULL follows its queue''s.';
COMMENT ON COLUMN jobcap.jobs.cap_epoch IS 'The queue''s cap_epoch when requeue_job set max_attempts; that budget holds while they are equal.';

CREATE OR REPLACE VIEW jobcap.dead_jobs AS
SELECT j.job_id, j.queue, j.attempts,
       CASE WHEN (j.cap_epoch OPERATOR(pg_catalog.=) q.cap_epoch) IS TRUE THEN j.max_attempts
            ELSE least(j.max_attempts, q.max_attempts) END AS max_attempts,
       j.finished_at AS died_at, j.enqueued_at, j.worker AS last_worker, j.dedupe_key,
       e.kind AS last_outcome, e.error AS last_error,
       h.errors, h.crashes, h.first_failure_at, h.last_failure_at
  FROM jobcap.jobs j
  LEFT JOIN jobcap.queues q ON q.queue OPERATOR(pg_catalog.=) j.queue
  LEFT JOIN LATERAL (SELECT e.kind, e.error FROM jobcap.job_errors e
                      WHERE e.job_id OPERATOR(pg_catalog.=) j.job_id
                      ORDER BY e.seq DESC LIMIT 1) e ON true
  LEFT JOIN LATERAL (SELECT count(*) FILTER (WHERE h.kind OPERATOR(pg_catalog.=) 'error') AS errors,
                            count(*) FILTER (WHERE h.kind OPERATOR(pg_catalog.=) 'lease_expired') AS crashes,
                            min(h.at) FILTER (WHERE h.kind OPERATOR(pg_catalog.<>) 'requeued') AS first_failure_at,
                            max(h.at) FILTER (WHERE h.kind OPERATOR(pg_catalog.<>) 'requeued') AS last_failure_at
                       FROM jobcap.job_errors h
                      WHERE h.job_id OPERATOR(pg_catalog.=) j.job_id) h ON true
 WHERE j.state OPERATOR(pg_catalog.=) 'dead'::jobcap.job_state;

-- Giving back an unstarted job: release_job.

-- Queue controls: pause and resume, max_running, periodic jobs, job output.

-- What the Celery and Django-Q adapters call.

-- The hot path's tables and indexes.

-- Privileges of the objects above (the same policy as 0.1.0: PUBLIC gets nothing).
REVOKE ALL ON FUNCTION jobcap.restore_stats_progress(), jobcap.before_drop_extension() FROM PUBLIC;

-- As in 0.1.0: default privileges of the role running this script may have granted more on the
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
