-- jobcap 0.1.0: a job queue whose retries always have a rule for giving up.
\echo Use "CREATE EXTENSION jobcap" to load this file. \quit

-- CREATE EXTENSION runs this script with search_path = jobcap, pg_temp (pg_catalog first,
-- implicitly). Objects someone else put in schema jobcap would be on that path, and its owner
-- could later drop or replace ours. So the install adopts schema jobcap only when a superuser
-- owns it, nobody else may create in it, and it holds nothing (CREATE EXTENSION creates the
-- schema when it is missing, and DROP EXTENSION leaves it behind, empty). Every expression
-- below is qualified all the same.
DO $guard$
DECLARE
    nsp pg_catalog.oid;
    nsp_owner pg_catalog.oid;
    nsp_acl pg_catalog.aclitem[];
    found pg_catalog.text;
BEGIN
    SELECT n.oid, n.nspowner, n.nspacl INTO nsp, nsp_owner, nsp_acl
      FROM pg_catalog.pg_namespace n WHERE n.nspname OPERATOR(pg_catalog.=) 'jobcap';
    IF NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.oid OPERATOR(pg_catalog.=) nsp_owner) THEN
        RAISE EXCEPTION 'schema "jobcap" is owned by role "%", not by a superuser',
                        pg_catalog.pg_get_userbyid(nsp_owner)
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'Its owner could drop or replace the objects jobcap would create in it.',
                  HINT = 'Drop schema jobcap (after checking what it holds), then CREATE EXTENSION jobcap.';
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.aclexplode(nsp_acl) a
                WHERE a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'
                  AND a.grantee OPERATOR(pg_catalog.<>) nsp_owner) THEN
        RAISE EXCEPTION 'schema "jobcap" grants CREATE to roles other than its owner'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'REVOKE CREATE ON SCHEMA jobcap FROM those roles, or drop the schema.';
    END IF;
    -- Everything created in a schema depends on it; so does this extension.
    SELECT pg_catalog.pg_describe_object(d.classid, d.objid, d.objsubid) INTO found
      FROM pg_catalog.pg_depend d
     WHERE d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_namespace'::pg_catalog.regclass
       AND d.refobjid OPERATOR(pg_catalog.=) nsp
       AND d.classid OPERATOR(pg_catalog.<>) 'pg_catalog.pg_extension'::pg_catalog.regclass
     LIMIT 1;
    IF found IS NULL THEN
        SELECT c.oid::pg_catalog.regclass::pg_catalog.text INTO found FROM pg_catalog.pg_class c
         WHERE c.relnamespace OPERATOR(pg_catalog.=) nsp LIMIT 1;
    END IF;
    IF found IS NULL THEN
        SELECT p.oid::pg_catalog.regprocedure::pg_catalog.text INTO found FROM pg_catalog.pg_proc p
         WHERE p.pronamespace OPERATOR(pg_catalog.=) nsp LIMIT 1;
    END IF;
    IF found IS NULL THEN
        SELECT o.oid::pg_catalog.regoperator::pg_catalog.text INTO found FROM pg_catalog.pg_operator o
         WHERE o.oprnamespace OPERATOR(pg_catalog.=) nsp LIMIT 1;
    END IF;
    IF found IS NULL THEN
        SELECT t.oid::pg_catalog.regtype::pg_catalog.text INTO found FROM pg_catalog.pg_type t
         WHERE t.typnamespace OPERATOR(pg_catalog.=) nsp LIMIT 1;
    END IF;
    IF found IS NOT NULL THEN
        RAISE EXCEPTION 'schema "jobcap" already contains objects, such as %', found
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'jobcap installs only into an empty schema, so nothing in it can shadow or replace its objects.',
                  HINT = 'Move or drop those objects (or the schema), then CREATE EXTENSION jobcap.';
    END IF;
END
$guard$;

-- Two group roles, cluster-wide: jobcap_worker (claim, settle, enqueue) and jobcap_operator
-- (queues, cancel, requeue, reap, statistics). Another database's install finds them made;
-- DROP EXTENSION leaves them (drop them by hand once no database uses jobcap). A role of that
-- name that could log in, carries attributes or belongs to other roles is not adopted: its
-- members would get more than jobcap grants.
DO $roles$
DECLARE
    r pg_catalog.text;
BEGIN
    FOREACH r IN ARRAY ARRAY['jobcap_worker', 'jobcap_operator']::pg_catalog.text[] LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) r) THEN
            EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', r);
        ELSIF EXISTS (SELECT FROM pg_catalog.pg_roles g
                       WHERE g.rolname OPERATOR(pg_catalog.=) r
                         AND (g.rolcanlogin OR g.rolsuper OR g.rolcreaterole OR g.rolcreatedb
                              OR g.rolreplication OR g.rolbypassrls
                              OR EXISTS (SELECT FROM pg_catalog.pg_auth_members m
                                          WHERE m.member OPERATOR(pg_catalog.=) g.oid))) THEN
            RAISE EXCEPTION 'role "%" exists and is more than a group role', r
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      DETAIL = 'jobcap expects a NOLOGIN role without attributes that belongs to no other role.',
                      HINT = pg_catalog.format('ALTER ROLE %I to match, or drop it, then CREATE EXTENSION jobcap.', r);
        END IF;
    END LOOP;
END
$roles$;
COMMENT ON ROLE jobcap_worker IS 'jobcap: may enqueue, claim and settle jobs of the queues granted with jobcap.grant_queue';
COMMENT ON ROLE jobcap_operator IS 'jobcap: may manage queues and jobs of every queue, run the reaper and read the tables';

-- The lifecycle. pending (a future run_at means scheduled) -> running -> succeeded | pending
-- (retry) | dead (cap reached). cancelled and dead are left only by requeue_job; succeeded never.
CREATE TYPE jobcap.job_state AS ENUM ('pending', 'running', 'succeeded', 'dead', 'cancelled');

CREATE TABLE jobcap.queues (
    queue        text PRIMARY KEY,
    max_attempts integer NOT NULL CHECK (max_attempts OPERATOR(pg_catalog.>) 0),
    lease        interval NOT NULL CHECK (lease OPERATOR(pg_catalog.>) interval '0'),
    backoff_base interval NOT NULL CHECK (backoff_base OPERATOR(pg_catalog.>=) interval '0'),
    backoff_max  interval NOT NULL,
    notify       boolean NOT NULL DEFAULT false,
    created_at   timestamptz NOT NULL DEFAULT pg_catalog.now(),
    CHECK (backoff_max OPERATOR(pg_catalog.>=) backoff_base)
);
COMMENT ON TABLE jobcap.queues IS 'One row per queue: its attempt cap, lease and backoff.';

-- No foreign key to queues: a key-share lock per enqueue would serialise enqueuers on the queue
-- row. drop_queue locks jobs against writers instead, and every statement joins the queue.
-- No CHECK constraints either: PostgreSQL re-reads them for every statement that writes a row,
-- and every write goes through jobcap's functions, which validate their arguments.
CREATE TABLE jobcap.jobs (
    job_id           bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    queue            text NOT NULL,
    state            jobcap.job_state NOT NULL DEFAULT 'pending',
    priority         integer NOT NULL DEFAULT 0,
    run_at           timestamptz NOT NULL DEFAULT pg_catalog.now(),
    attempts         integer NOT NULL DEFAULT 0,
    max_attempts     integer,
    fence            bigint NOT NULL DEFAULT 0,
    lease            interval,
    lease_expires_at timestamptz,
    worker           text,
    dedupe_key       text,
    enqueued_at      timestamptz NOT NULL DEFAULT pg_catalog.now(),
    first_claimed_at timestamptz,
    claimed_at       timestamptz,
    finished_at      timestamptz,
    payload          jsonb NOT NULL DEFAULT '{}'
) WITH (
    -- Room on each page for the new versions that claims, heartbeats and completions write.
    fillfactor = 90,
    -- A queue table churns: every job leaves a dead entry at the head of the claim index that
    -- each claim must step over until VACUUM removes it. Vacuum after 1,000 dead rows plus 2%
    -- instead of PostgreSQL's 50 plus 20%.
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_insert_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.05
);
COMMENT ON COLUMN jobcap.jobs.attempts IS 'Claims so far; incremented and capped inside the claim.';
COMMENT ON COLUMN jobcap.jobs.max_attempts IS 'This job''s own cap; NULL follows its queue''s.';
COMMENT ON COLUMN jobcap.jobs.fence IS 'Lease generation, new at every claim; also an idempotency key.';

-- Fences come from a sequence, not fence + 1: a sequence does not roll back, so a claim whose
-- transaction rolled back never hands its fence to the next claim. Every fence is unique
-- across all jobs, which makes it a good idempotency key for external systems.
CREATE SEQUENCE jobcap.fences AS bigint;

-- The claim walks this index in claim order; nothing else is pending-and-ordered.
CREATE INDEX jobs_claim ON jobcap.jobs (queue, priority, run_at, job_id) WHERE state OPERATOR(pg_catalog.=) 'pending';
-- The reaper's expired leases: running jobs only. lease_expires_at stays out of every index so
-- a heartbeat is a HOT update. Keyed by job_id so that a fenced call (job_id = $1 AND state =
-- 'running') finds its row through this index as directly as through the primary key, however
-- empty the index looked when statistics were last taken.
CREATE INDEX jobs_running ON jobcap.jobs (job_id) WHERE state OPERATOR(pg_catalog.=) 'running';
-- The reaper's over-cap sweep: a pending job can be over its cap only after an attempt, so
-- fresh jobs (attempts = 0) stay out of this index and enqueue does not pay for it.
CREATE INDEX jobs_retrying ON jobcap.jobs (queue) WHERE state OPERATOR(pg_catalog.=) 'pending' AND attempts OPERATOR(pg_catalog.>) 0;
-- Retention (the background worker) deletes finished jobs by age. Only finished rows enter this
-- index, so claims, heartbeats and retries never pay for it: one entry per job, at its end.
CREATE INDEX jobs_finished ON jobcap.jobs (state, finished_at)
    WHERE state OPERATOR(pg_catalog.=) ANY ('{succeeded,dead,cancelled}');
-- Dedupe keys are unique among the jobs that block re-enqueueing: pending, running and dead.
CREATE UNIQUE INDEX jobs_dedupe ON jobcap.jobs (queue, dedupe_key)
    WHERE dedupe_key IS NOT NULL AND state OPERATOR(pg_catalog.=) ANY ('{pending,running,dead}');

-- Bounded history: the last jobcap.error_history entries per job. Payloads are never copied.
CREATE TABLE jobcap.job_errors (
    seq     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id  bigint NOT NULL,
    queue   text NOT NULL,
    attempt integer NOT NULL,
    fence   bigint NOT NULL,
    kind    text NOT NULL CHECK (kind OPERATOR(pg_catalog.=) ANY ('{error,lease_expired,requeued}')),
    worker  text,
    error   text,
    at      timestamptz NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE jobcap.job_errors IS
    'Attempts that ended badly: reported errors, leases that expired without a report, requeues.';
CREATE INDEX job_errors_job ON jobcap.job_errors (job_id, seq);
CREATE INDEX job_errors_at ON jobcap.job_errors (at);

-- Which roles may work which queue (jobcap.grant_queue): a role works a queue granted to it or
-- to a role whose privileges it has. Roles are kept by name, so grants survive dump and restore;
-- a renamed or dropped role matches nobody until its grant is revoked.
CREATE TABLE jobcap.queue_grants (
    queue      text NOT NULL REFERENCES jobcap.queues ON DELETE CASCADE ON UPDATE CASCADE,
    grantee    text NOT NULL,
    granted_by text NOT NULL,
    granted_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    PRIMARY KEY (queue, grantee)
);
COMMENT ON TABLE jobcap.queue_grants IS
    'Roles that may enqueue, claim and settle jobs of a queue (besides superusers and the owner).';

-- Functions. All are C, all pin search_path; none is SECURITY DEFINER: each checks its caller
-- and runs its statements as the tables' owner itself (src/access.hpp).

CREATE FUNCTION jobcap.backoff(attempt integer, backoff_base interval, backoff_max interval)
RETURNS interval
LANGUAGE C VOLATILE PARALLEL SAFE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_backoff';
COMMENT ON FUNCTION jobcap.backoff(integer, interval, interval) IS
    'Retry delay after failed attempt n: uniform in [c/2, c), c = min(backoff_max, backoff_base * 2^(n-1)).';

CREATE FUNCTION jobcap.create_queue(
    queue text,
    max_attempts integer DEFAULT NULL,
    lease interval DEFAULT '5 minutes',
    backoff_base interval DEFAULT '10 seconds',
    backoff_max interval DEFAULT '1 hour',
    notify boolean DEFAULT false)
RETURNS void
LANGUAGE C VOLATILE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_create_queue';

CREATE FUNCTION jobcap.alter_queue(
    queue text,
    max_attempts integer DEFAULT NULL,
    lease interval DEFAULT NULL,
    backoff_base interval DEFAULT NULL,
    backoff_max interval DEFAULT NULL,
    notify boolean DEFAULT NULL)
RETURNS void
LANGUAGE C VOLATILE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_alter_queue';

CREATE FUNCTION jobcap.drop_queue(queue text, force boolean DEFAULT false)
RETURNS void
LANGUAGE C VOLATILE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_drop_queue';

CREATE FUNCTION jobcap.enqueue_job(
    queue text,
    payload jsonb DEFAULT '{}',
    run_at timestamptz DEFAULT pg_catalog.now(),
    priority integer DEFAULT 0,
    max_attempts integer DEFAULT NULL,
    dedupe_key text DEFAULT NULL)
RETURNS bigint
LANGUAGE C VOLATILE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_enqueue_job';

CREATE FUNCTION jobcap.claim_job(
    queue text,
    worker text,
    batch integer DEFAULT 1,
    lease interval DEFAULT NULL)
RETURNS TABLE (job_id bigint, fence bigint, attempt integer, max_attempts integer,
               payload jsonb, lease_expires_at timestamptz)
LANGUAGE C VOLATILE ROWS 1
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_claim_job';

CREATE FUNCTION jobcap.claim_job_by_id(job_id bigint, worker text, lease interval DEFAULT NULL)
RETURNS TABLE (job_id bigint, fence bigint, attempt integer, max_attempts integer,
               payload jsonb, lease_expires_at timestamptz)
LANGUAGE C VOLATILE ROWS 1
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_claim_job_by_id';

CREATE FUNCTION jobcap.complete_job(job_id bigint, fence bigint)
RETURNS jobcap.job_state
LANGUAGE C VOLATILE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_complete_job';

CREATE FUNCTION jobcap.fail_job(job_id bigint, fence bigint, error text,
                                retry_in interval DEFAULT NULL)
RETURNS jobcap.job_state
LANGUAGE C VOLATILE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_fail_job';

CREATE FUNCTION jobcap.heartbeat(job_id bigint, fence bigint, extend interval DEFAULT NULL)
RETURNS timestamptz
LANGUAGE C VOLATILE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_heartbeat';

CREATE FUNCTION jobcap.assert_fence(job_id bigint, fence bigint)
RETURNS void
LANGUAGE C VOLATILE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_assert_fence';

CREATE FUNCTION jobcap.reap_jobs(max_jobs integer DEFAULT 1000)
RETURNS TABLE (job_id bigint, queue text, outcome jobcap.job_state)
LANGUAGE C VOLATILE ROWS 10
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_reap_jobs';

CREATE FUNCTION jobcap.requeue_job(job_id bigint, reason text, extra_attempts integer DEFAULT NULL)
RETURNS boolean
LANGUAGE C VOLATILE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_requeue_job';

CREATE FUNCTION jobcap.cancel_job(job_id bigint)
RETURNS boolean
LANGUAGE C VOLATILE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_cancel_job';

-- Views and functions for people: docs/observability.md. The figures come from partial indexes
-- (live and dead jobs), from job_errors (failures are rare events) and from counts the background
-- worker keeps (jobcap.refresh_stats); never from a scan of the succeeded jobs kept.

-- Dead jobs by queue and time of death. A job enters this index once, when it dies (a rare
-- event), so claims and completions never pay for it.
CREATE INDEX jobs_dead ON jobcap.jobs (queue, finished_at) WHERE state OPERATOR(pg_catalog.=) 'dead';

-- Finished jobs counted per queue and minute (date_bin from 2000-01-01 UTC), and the claim
-- latency (enqueued_at -> first_claimed_at) of those jobs as a histogram: bin 0 holds latencies
-- under 1 ms, bin k >= 1 those in [2^((k-1)/4), 2^(k/4)) ms, the last bin everything longer.
-- Written only by jobcap.refresh_stats() (the background worker calls it), one call at a time;
-- minutes older than 25 hours are deleted.
CREATE TABLE jobcap.stats_minutes (
    queue     text NOT NULL,
    minute    timestamptz NOT NULL,
    succeeded bigint NOT NULL DEFAULT 0,
    cancelled bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, minute)
);
CREATE INDEX stats_minutes_minute ON jobcap.stats_minutes (minute);
CREATE TABLE jobcap.stats_latency (
    queue  text NOT NULL,
    minute timestamptz NOT NULL,
    bin    smallint NOT NULL,
    jobs   bigint NOT NULL,
    PRIMARY KEY (queue, minute, bin)
);
CREATE INDEX stats_latency_minute ON jobcap.stats_latency (minute);
-- Jobs that finished up to counted_until are in the counts. Retention never deletes a finished
-- job that is not counted yet.
CREATE TABLE jobcap.stats_progress (
    one           boolean PRIMARY KEY DEFAULT true CHECK (one),
    counted_until timestamptz NOT NULL
);
INSERT INTO jobcap.stats_progress (counted_until) VALUES (pg_catalog.now());
COMMENT ON TABLE jobcap.stats_minutes IS
    'Jobs that succeeded or were cancelled, per queue and minute of finishing (jobcap.refresh_stats).';
COMMENT ON TABLE jobcap.stats_latency IS
    'Claim latency histogram of the jobs that finished, per queue and minute (jobcap.refresh_stats).';
COMMENT ON TABLE jobcap.stats_progress IS 'How far jobcap.refresh_stats has counted finished jobs.';

CREATE FUNCTION jobcap.queue_stats_between(since timestamptz, until timestamptz DEFAULT NULL)
RETURNS TABLE (queue text, pending bigint, scheduled bigint, running bigint, succeeded bigint,
               dead bigint, cancelled bigint, failed_attempts bigint, failing_jobs bigint,
               lost_leases bigint, crashed_jobs bigint, new_dead bigint,
               claim_latency_p50 interval, claim_latency_p95 interval,
               oldest_pending_age interval, window_start timestamptz, window_end timestamptz,
               counted_until timestamptz)
LANGUAGE C VOLATILE ROWS 10
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_queue_stats_between';
COMMENT ON FUNCTION jobcap.queue_stats_between(timestamptz, timestamptz) IS
    'Per queue: jobs by state now, and failures, deaths, completions and claim latency in (since, until]; NULL since = until - jobcap.stats_window, NULL until = now.';

-- The same over the last jobcap.stats_window (SET jobcap.stats_window = '15min' for another).
CREATE VIEW jobcap.queue_stats AS SELECT * FROM jobcap.queue_stats_between(NULL, NULL);
COMMENT ON VIEW jobcap.queue_stats IS
    'Per queue: jobs by state now, and failures, deaths, completions and claim latency over the last jobcap.stats_window.';

CREATE FUNCTION jobcap.refresh_stats(max_jobs integer DEFAULT 100000)
RETURNS bigint
LANGUAGE C VOLATILE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_refresh_stats';
COMMENT ON FUNCTION jobcap.refresh_stats(integer) IS
    'Counts up to max_jobs finished jobs not counted yet (the background worker calls it); returns how many; 0 while another call is counting.';

CREATE FUNCTION jobcap.metrics()
RETURNS text
LANGUAGE C VOLATILE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_metrics';
COMMENT ON FUNCTION jobcap.metrics() IS
    'The numbers of jobcap.queue_stats in the Prometheus text exposition format (version 0.0.4).';

CREATE FUNCTION jobcap.top_failing_jobs(queue text DEFAULT NULL, n integer DEFAULT 10,
                                        since timestamptz DEFAULT NULL,
                                        until timestamptz DEFAULT NULL)
RETURNS TABLE (job_id bigint, queue text, state jobcap.job_state, attempts integer,
               max_attempts integer, failures bigint, errors bigint, crashes bigint,
               first_failure_at timestamptz, last_failure_at timestamptz, last_errors text[])
LANGUAGE C VOLATILE ROWS 10
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_top_failing_jobs';
COMMENT ON FUNCTION jobcap.top_failing_jobs(text, integer, timestamptz, timestamptz) IS
    'The n jobs (of queue, or of every queue) with the most failed attempts in the window, worst first.';

-- Dead letters in bulk: the dead jobs of a queue whose last error matches error_like (LIKE) and
-- that died in (died_after, died_before), oldest death first, at most max_jobs per call.
CREATE FUNCTION jobcap.requeue_dead(queue text, reason text, error_like text DEFAULT NULL,
                                    died_after timestamptz DEFAULT NULL,
                                    died_before timestamptz DEFAULT NULL,
                                    max_jobs integer DEFAULT 1000,
                                    extra_attempts integer DEFAULT NULL)
RETURNS integer
LANGUAGE C VOLATILE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_requeue_dead';
COMMENT ON FUNCTION jobcap.requeue_dead(text, text, text, timestamptz, timestamptz, integer, integer) IS
    'requeue_job for matching dead jobs of a queue, at most max_jobs per call; returns how many were requeued.';

CREATE FUNCTION jobcap.purge_dead(queue text, error_like text DEFAULT NULL,
                                  died_after timestamptz DEFAULT NULL,
                                  died_before timestamptz DEFAULT NULL,
                                  max_jobs integer DEFAULT 1000)
RETURNS integer
LANGUAGE C VOLATILE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_purge_dead';
COMMENT ON FUNCTION jobcap.purge_dead(text, text, timestamptz, timestamptz, integer) IS
    'Deletes matching dead jobs of a queue with their history, at most max_jobs per call; returns how many.';

-- Each dead job with its last outcome and what its kept history (the last jobcap.error_history
-- entries) says: reported errors, lost leases (crashes), first and last failure.
CREATE VIEW jobcap.dead_jobs AS
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
                            count(*) FILTER (WHERE h.kind OPERATOR(pg_catalog.=) 'lease_expired') AS crashes,
                            min(h.at) FILTER (WHERE h.kind OPERATOR(pg_catalog.<>) 'requeued') AS first_failure_at,
                            max(h.at) FILTER (WHERE h.kind OPERATOR(pg_catalog.<>) 'requeued') AS last_failure_at
                       FROM jobcap.job_errors h
                      WHERE h.job_id OPERATOR(pg_catalog.=) j.job_id) h ON true
 WHERE j.state OPERATOR(pg_catalog.=) 'dead'::jobcap.job_state;

-- The statements jobcap prepares, for EXPLAIN: PREPARE p(<argtypes>) AS <sql>.
CREATE FUNCTION jobcap.statements()
RETURNS TABLE (name text, argtypes regtype[], sql text)
LANGUAGE C STABLE ROWS 10
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_statements';

-- Batch and combined calls for throughput (one statement, one commit).

CREATE FUNCTION jobcap.enqueue_jobs(
    queue text,
    payloads jsonb[],
    run_at timestamptz DEFAULT pg_catalog.now(),
    priority integer DEFAULT 0,
    max_attempts integer DEFAULT NULL)
RETURNS bigint[]
LANGUAGE C VOLATILE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_enqueue_jobs';

-- Completes a batch: all or nothing. A fence that is not current raises JC001 (for the first such
-- job) and no job of the batch is completed. Returns how many jobs were completed.
CREATE FUNCTION jobcap.complete_jobs(job_ids bigint[], fences bigint[])
RETURNS integer
LANGUAGE C VOLATILE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_complete_jobs';

CREATE FUNCTION jobcap.complete_and_claim(
    job_id bigint,
    fence bigint,
    queue text,
    worker text,
    batch integer DEFAULT 1,
    lease interval DEFAULT NULL)
RETURNS TABLE (job_id bigint, fence bigint, attempt integer, max_attempts integer,
               payload jsonb, lease_expires_at timestamptz)
LANGUAGE C VOLATILE ROWS 1
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_complete_and_claim';

-- Warn at install time when no background worker serves this database, so nothing reaps it
-- unless reap_jobs() is scheduled (docs: "Background worker"). Under jobcap.database = '*', wake
-- the launcher (a cancel request is its "look again now"), so this database is served at once.
DO $$
BEGIN
    IF pg_catalog.current_setting('jobcap.database', true) OPERATOR(pg_catalog.=) '*'
       AND EXISTS (SELECT FROM pg_catalog.pg_stat_activity a
                    WHERE a.backend_type OPERATOR(pg_catalog.=) 'jobcap launcher') THEN
        PERFORM pg_catalog.pg_cancel_backend(a.pid) FROM pg_catalog.pg_stat_activity a
          WHERE a.backend_type OPERATOR(pg_catalog.=) 'jobcap launcher';
    ELSIF NOT EXISTS (SELECT FROM pg_catalog.pg_stat_activity a
                       WHERE a.backend_type OPERATOR(pg_catalog.=) 'jobcap reaper'
                         AND a.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()) THEN
        RAISE WARNING 'no jobcap background worker serves database "%"', pg_catalog.current_database()
            USING HINT = 'Name this database in jobcap.database with jobcap in shared_preload_libraries, '
                         'or schedule SELECT jobcap.reap_jobs() (pg_cron, cron + psql).';
    END IF;
END
$$;

-- Who may work which queue; superusers and the owner of jobcap's tables only.
CREATE FUNCTION jobcap.grant_queue(queue text, role text)
RETURNS boolean
LANGUAGE C VOLATILE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_grant_queue';
COMMENT ON FUNCTION jobcap.grant_queue(text, text) IS
    'Lets role (and roles with its privileges) enqueue, claim and settle jobs of queue; false if it already could.';

CREATE FUNCTION jobcap.revoke_queue(queue text, role text)
RETURNS boolean
LANGUAGE C VOLATILE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_revoke_queue';
COMMENT ON FUNCTION jobcap.revoke_queue(text, text) IS
    'Withdraws grant_queue; the role''s running jobs get 42501 at their next fenced call.';

-- Privileges. PUBLIC gets nothing; neither role gets DML on any table: the functions check the
-- caller and write as the tables' owner (src/access.hpp).
REVOKE ALL ON SCHEMA jobcap FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA jobcap FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA jobcap FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA jobcap FROM PUBLIC;
GRANT USAGE ON SCHEMA jobcap TO jobcap_worker, jobcap_operator;

GRANT EXECUTE ON FUNCTION
    jobcap.enqueue_job(text, jsonb, timestamptz, integer, integer, text),
    jobcap.enqueue_jobs(text, jsonb[], timestamptz, integer, integer),
    jobcap.claim_job(text, text, integer, interval),
    jobcap.claim_job_by_id(bigint, text, interval),
    jobcap.complete_and_claim(bigint, bigint, text, text, integer, interval),
    jobcap.complete_job(bigint, bigint),
    jobcap.complete_jobs(bigint[], bigint[]),
    jobcap.fail_job(bigint, bigint, text, interval),
    jobcap.heartbeat(bigint, bigint, interval),
    jobcap.assert_fence(bigint, bigint),
    jobcap.backoff(integer, interval, interval)
TO jobcap_worker;

GRANT EXECUTE ON FUNCTION
    jobcap.create_queue(text, integer, interval, interval, interval, boolean),
    jobcap.alter_queue(text, integer, interval, interval, interval, boolean),
    jobcap.drop_queue(text, boolean),
    jobcap.requeue_job(bigint, text, integer),
    jobcap.cancel_job(bigint),
    jobcap.reap_jobs(integer),
    jobcap.statements(),
    jobcap.backoff(integer, interval, interval),
    jobcap.queue_stats_between(timestamptz, timestamptz),
    jobcap.refresh_stats(integer),
    jobcap.metrics(),
    jobcap.top_failing_jobs(text, integer, timestamptz, timestamptz),
    jobcap.requeue_dead(text, text, text, timestamptz, timestamptz, integer, integer),
    jobcap.purge_dead(text, text, timestamptz, timestamptz, integer)
TO jobcap_operator;
GRANT SELECT ON jobcap.queues, jobcap.jobs, jobcap.job_errors, jobcap.queue_grants,
                jobcap.queue_stats, jobcap.dead_jobs, jobcap.stats_minutes, jobcap.stats_latency,
                jobcap.stats_progress
TO jobcap_operator;

-- Default privileges of the installing role may have granted more; take back anything on
-- jobcap's objects held by a role other than the owner and the two above.
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
