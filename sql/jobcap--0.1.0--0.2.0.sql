-- jobcap 0.1.0 -> 0.2.0. There is no jobcap--0.2.0.sql: CREATE EXTENSION jobcap runs
-- jobcap--0.1.0.sql and then this script (PostgreSQL follows the update path), so a new install
-- and an upgraded one get the same schema, and every 0.2.0 change is written once, here.
-- The rules of jobcap--0.1.0.sql hold: every name qualified, every function pins search_path
-- (the eight of the hot path pin it in C: see "The hot path"), none is SECURITY DEFINER; new
-- objects get their privileges in the last section.
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

-- Rolled-back claims (src/background/rollbacks.cpp). With jobcap preloaded, the attempt of a
-- claim whose transaction rolled back is still counted: the reaper adds it in a transaction of
-- its own and leaves a history row of kind claim_rolled_back. Like an expired lease, such an
-- attempt ended without a report: the statistics, and dead_jobs' crashes (below, in the view of
-- the caps), count both.
ALTER TABLE jobcap.job_errors DROP CONSTRAINT job_errors_kind_check;
ALTER TABLE jobcap.job_errors ADD CONSTRAINT job_errors_kind_check
    CHECK (kind OPERATOR(pg_catalog.=) ANY ('{error,lease_expired,requeued,claim_rolled_back}'));
COMMENT ON TABLE jobcap.job_errors IS
    'Attempts that ended badly: reported errors, leases that expired without a report, claims that rolled back, requeues.';

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

-- Caps. A job's cap is the lower of its own max_attempts and its queue's, so a job cannot
-- outlast its queue's cap and lowering that cap binds every job of the queue at once; the one
-- exception is the budget requeue_job (or requeue_dead) grants, which holds until the queue's
-- cap is next lowered. cap_epoch counts a queue's lowerings; a job's cap_epoch is its queue's
-- at the requeue that set its max_attempts (src/spi/cap.hpp writes the rule once).
ALTER TABLE jobcap.queues ADD COLUMN cap_epoch bigint NOT NULL DEFAULT 0;
ALTER TABLE jobcap.jobs ADD COLUMN cap_epoch bigint;
-- 0.1.0 honoured a job's own max_attempts above its queue's cap. A budget requeue_job granted
-- under 0.1.0 (the job has a requeued history row) keeps holding, as one granted now would, until
-- the queue's cap is next lowered; a cap given at enqueue is bound by its queue's from now on.
-- (A requeue whose history row is gone, jobcap.error_history = 0 or pruned, cannot be told apart.)
UPDATE jobcap.jobs j SET cap_epoch = 0
 WHERE j.max_attempts IS NOT NULL
   AND EXISTS (SELECT FROM jobcap.job_errors e
                WHERE e.job_id OPERATOR(pg_catalog.=) j.job_id
                  AND e.kind OPERATOR(pg_catalog.=) 'requeued');
COMMENT ON COLUMN jobcap.queues.cap_epoch IS 'How many times max_attempts was lowered; a lowering ends every budget requeue_job granted before it.';
COMMENT ON COLUMN jobcap.jobs.max_attempts IS 'This job''s own cap: binds only below its queue''s, unless requeue_job set it (see cap_epoch). NULL follows its queue''s.';
COMMENT ON COLUMN jobcap.jobs.cap_epoch IS 'The queue''s cap_epoch when requeue_job set max_attempts; that budget holds while they are equal.';

-- dead_jobs shows each job's cap by this rule: its one definition is in "Smaller holes" below.

-- Giving back an unstarted job: release_job. A client that claimed more jobs than it started
-- (a prefetched batch, a shutdown) gives the unstarted ones back: pending again, the claim's
-- attempt not counted, the fence left stale (the sequence never goes back, so the next claim
-- gets a newer one), and a history row of kind 'released'. The contract for client authors:
-- release only a job whose handler never started; a job whose work began is completed, failed
-- or crashed (crash_job), never released, or it could run past its cap.
-- crash_job is fail_job for a handler whose process died (a signal, an exit without a report),
-- seen by the supervising process that holds the lease: the attempt counts, and the history
-- row's kind is 'crashed', so a job's history tells a crash from an error at once, without
-- waiting for the lease to expire (the reaper's 'lease_expired'). dead_jobs (its definition is in
-- "Smaller holes") counts 'crashed' among crashes and skips 'released', which is no failure.
ALTER TABLE jobcap.job_errors DROP CONSTRAINT job_errors_kind_check;
ALTER TABLE jobcap.job_errors ADD CONSTRAINT job_errors_kind_check
    CHECK (kind OPERATOR(pg_catalog.=) ANY ('{error,lease_expired,crashed,requeued,claim_rolled_back,released}'));
COMMENT ON TABLE jobcap.job_errors IS
    'Attempts that ended badly (reported errors, crashes seen by the worker, leases that expired without a report, claims that rolled back), requeues and releases.';

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

-- Every vacuum of jobs cleans its indexes. By default (vacuum_index_cleanup = auto) VACUUM
-- skips the index pass when fewer than 2% of the table's pages hold dead rows; it prunes the
-- heap and leaves every index entry in place. A claim walks the claim index from its queue's
-- first entry over every entry that such vacuums left, and finished jobs kept by retention are
-- most of the table's pages, so a big history kept the claim index's dead head for good: 8
-- clients claiming beside 1.1 million kept jobs made 3,127 claims/s (p99 7.9 ms) against 4,417
-- (5.5 ms) with every vacuum cleaning the indexes (means of two runs each; docs/worker.md). The
-- price is a pass over every index per vacuum: 0.05 s beside that history, and no measurable
-- loss in claims and completions on a table without one.
ALTER TABLE jobcap.jobs SET (vacuum_index_cleanup = on);

-- The claim index's first key is an integer: hashtextextended(queue, 0), a 64-bit hash of the
-- job's queue, instead of the queue's name. After a key of variable width PostgreSQL cannot
-- cache where the next keys start, so every comparison of an index insertion or descent walked
-- each entry from the queue's name to reach priority, run_at and job_id: an enqueued row cost
-- about 38,400 instructions against 28,100 with the hash (callgrind, 10,000 rows into a table of
-- jobs' shape; docs/direct_path.md). Every claim compares the name too (the SQL statements and
-- the direct path alike), so even queues whose names shared a hash would get only their own
-- jobs; 64 bits make that a chance of about one in 10^10 among 100,000 queues (32 would make it
-- likely, and a colliding queue's claims walk the other's backlog). The name stays in the index
-- (INCLUDE), for the statistics' index-only scan. An expression, not a generated column: no
-- table rewrite here (building this index reads the table under a SHARE lock), and no wider
-- row for every update to walk.
DROP INDEX jobcap.jobs_claim;
CREATE INDEX jobs_claim
    ON jobcap.jobs (pg_catalog.hashtextextended(queue, 0), priority, run_at, job_id)
    INCLUDE (queue) WHERE state OPERATOR(pg_catalog.=) 'pending';

-- Queue controls: pause and resume, max_running, periodic jobs, job output.

-- A paused queue hands out nothing: every claim statement reads the flag in the same statement
-- that claims. max_running caps the jobs of a queue that run at once (NULL: no cap); a claim of
-- a capped queue serialises on the queue's row and takes only what fits.
ALTER TABLE jobcap.queues
    ADD COLUMN paused boolean NOT NULL DEFAULT false,
    ADD COLUMN max_running integer CHECK (max_running OPERATOR(pg_catalog.>) 0);
COMMENT ON COLUMN jobcap.queues.paused IS 'pause_queue/resume_queue: a paused queue hands out no job.';
COMMENT ON COLUMN jobcap.queues.max_running IS 'At most this many jobs of the queue run at once; NULL: no limit.';

-- What complete_job kept of the worker's result: at most jobcap.max_output_bytes, else a marker.
ALTER TABLE jobcap.jobs ADD COLUMN output jsonb;
COMMENT ON COLUMN jobcap.jobs.output IS
    'The result given to complete_job (at most jobcap.max_output_bytes; larger results are replaced by {"truncated": true, "bytes": n}).';

CREATE FUNCTION jobcap.pause_queue(queue text)
RETURNS boolean
LANGUAGE C VOLATILE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_pause_queue';
COMMENT ON FUNCTION jobcap.pause_queue(text) IS
    'Stops handing out jobs of queue (running jobs settle normally, enqueue still works); false if it was paused already.';

CREATE FUNCTION jobcap.resume_queue(queue text)
RETURNS boolean
LANGUAGE C VOLATILE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_resume_queue';
COMMENT ON FUNCTION jobcap.resume_queue(text) IS
    'Hands out jobs of a paused queue again; false if it was not paused.';

-- New parameters (max_running; output): the 0.1.0 signatures are replaced. The C functions still
-- accept the old number of arguments.
DROP FUNCTION jobcap.create_queue(text, integer, interval, interval, interval, boolean);
CREATE FUNCTION jobcap.create_queue(
    queue text,
    max_attempts integer DEFAULT NULL,
    lease interval DEFAULT '5 minutes',
    backoff_base interval DEFAULT '10 seconds',
    backoff_max interval DEFAULT '1 hour',
    notify boolean DEFAULT false,
    max_running integer DEFAULT NULL)
RETURNS void
LANGUAGE C VOLATILE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_create_queue';
COMMENT ON FUNCTION jobcap.create_queue(text, integer, interval, interval, interval, boolean, integer) IS
    'Creates a queue; max_running (NULL or 0: no limit) caps the jobs of the queue that run at once.';

DROP FUNCTION jobcap.alter_queue(text, integer, interval, interval, interval, boolean);
CREATE FUNCTION jobcap.alter_queue(
    queue text,
    max_attempts integer DEFAULT NULL,
    lease interval DEFAULT NULL,
    backoff_base interval DEFAULT NULL,
    backoff_max interval DEFAULT NULL,
    notify boolean DEFAULT NULL,
    max_running integer DEFAULT NULL)
RETURNS void
LANGUAGE C VOLATILE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_alter_queue';
COMMENT ON FUNCTION jobcap.alter_queue(text, integer, interval, interval, interval, boolean, integer) IS
    'Changes the settings given (NULL: unchanged); max_running => 0 removes the limit.';

DROP FUNCTION jobcap.complete_job(bigint, bigint);
CREATE FUNCTION jobcap.complete_job(job_id bigint, fence bigint, output jsonb DEFAULT NULL)
RETURNS jobcap.job_state
LANGUAGE C VOLATILE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_complete_job';
COMMENT ON FUNCTION jobcap.complete_job(bigint, bigint, jsonb) IS
    'Success under a current fence; output (at most jobcap.max_output_bytes) is kept in jobs.output.';

DROP FUNCTION jobcap.complete_jobs(bigint[], bigint[]);
CREATE FUNCTION jobcap.complete_jobs(job_ids bigint[], fences bigint[], outputs jsonb[] DEFAULT NULL)
RETURNS integer
LANGUAGE C VOLATILE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_complete_jobs';
COMMENT ON FUNCTION jobcap.complete_jobs(bigint[], bigint[], jsonb[]) IS
    'Completes a batch, all or nothing; outputs (NULL, or one per job) are kept as complete_job keeps one.';

DROP FUNCTION jobcap.complete_and_claim(bigint, bigint, text, text, integer, interval);
CREATE FUNCTION jobcap.complete_and_claim(
    job_id bigint,
    fence bigint,
    queue text,
    worker text,
    batch integer DEFAULT 1,
    lease interval DEFAULT NULL,
    output jsonb DEFAULT NULL)
RETURNS TABLE (job_id bigint, fence bigint, attempt integer, max_attempts integer,
               payload jsonb, lease_expires_at timestamptz)
LANGUAGE C VOLATILE ROWS 1
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_complete_and_claim';

-- queue_stats shows each queue's controls: two columns at the end.
DROP VIEW jobcap.queue_stats;
DROP FUNCTION jobcap.queue_stats_between(timestamptz, timestamptz);
CREATE FUNCTION jobcap.queue_stats_between(since timestamptz, until timestamptz DEFAULT NULL)
RETURNS TABLE (queue text, pending bigint, scheduled bigint, running bigint, succeeded bigint,
               dead bigint, cancelled bigint, failed_attempts bigint, failing_jobs bigint,
               lost_leases bigint, crashed_jobs bigint, new_dead bigint,
               claim_latency_p50 interval, claim_latency_p95 interval,
               oldest_pending_age interval, window_start timestamptz, window_end timestamptz,
               counted_until timestamptz, paused boolean, max_running integer)
LANGUAGE C VOLATILE ROWS 10
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_queue_stats_between';
COMMENT ON FUNCTION jobcap.queue_stats_between(timestamptz, timestamptz) IS
    'Per queue: jobs by state now, and failures, deaths, completions and claim latency in (since, until]; NULL since = until - jobcap.stats_window, NULL until = now.';
CREATE VIEW jobcap.queue_stats AS SELECT * FROM jobcap.queue_stats_between(NULL, NULL);
COMMENT ON VIEW jobcap.queue_stats IS
    'Per queue: jobs by state now, and failures, deaths, completions and claim latency over the last jobcap.stats_window.';

-- Periodic jobs. The background worker (or jobcap.run_schedules(), without the preload) enqueues
-- each due slot of a schedule once: it advances last_slot with a compare-and-swap in the
-- transaction that enqueues, so neither a restart nor a second caller enqueues a slot twice.
-- Slots missed while nothing ran (server down) are not made up: only the latest one is
-- enqueued. Each schedule's jobs share the dedupe key 'jobcap.schedule:<name>': while one is
-- pending, running or dead, a slot enqueues nothing (counted in skipped). Cron runs on UTC.
CREATE TABLE jobcap.job_schedules (
    name         text PRIMARY KEY,
    cron         text NOT NULL,
    queue        text NOT NULL REFERENCES jobcap.queues ON DELETE CASCADE ON UPDATE CASCADE,
    payload      jsonb NOT NULL DEFAULT '{}',
    priority     integer NOT NULL DEFAULT 0,
    max_attempts integer,
    last_slot    timestamptz NOT NULL,
    last_run_at  timestamptz,
    last_job_id  bigint,
    skipped      bigint NOT NULL DEFAULT 0,
    created_at   timestamptz NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE jobcap.job_schedules IS 'Periodic jobs (jobcap.schedule_job); read them through jobcap.schedules.';
COMMENT ON COLUMN jobcap.job_schedules.last_slot IS 'The latest slot handled (enqueued or skipped); the next slot after it is due.';
CREATE INDEX job_schedules_queue ON jobcap.job_schedules (queue);

CREATE FUNCTION jobcap.cron_next(cron text, after timestamptz)
RETURNS timestamptz
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_cron_next';
COMMENT ON FUNCTION jobcap.cron_next(text, timestamptz) IS
    'The first slot of a five-field cron expression (UTC) after a time; 22023 for a bad expression.';

CREATE FUNCTION jobcap.schedule_job(
    name text,
    cron text,
    queue text,
    payload jsonb DEFAULT '{}',
    priority integer DEFAULT 0,
    max_attempts integer DEFAULT NULL)
RETURNS timestamptz
LANGUAGE C VOLATILE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_schedule_job';
COMMENT ON FUNCTION jobcap.schedule_job(text, text, text, jsonb, integer, integer) IS
    'Creates or replaces a periodic job: a job of queue at every slot of cron (UTC); returns the next slot.';

CREATE FUNCTION jobcap.unschedule_job(name text)
RETURNS boolean
LANGUAGE C VOLATILE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_unschedule_job';
COMMENT ON FUNCTION jobcap.unschedule_job(text) IS 'Removes a periodic job; false if there was none.';

CREATE FUNCTION jobcap.run_schedules()
RETURNS integer
LANGUAGE C VOLATILE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_run_schedules';
COMMENT ON FUNCTION jobcap.run_schedules() IS
    'Enqueues the due slots of every schedule, as the background worker does; returns how many jobs it enqueued.';

CREATE VIEW jobcap.schedules AS
SELECT s.name, s.cron, s.queue, s.payload, s.priority, s.max_attempts,
       jobcap.cron_next(s.cron, s.last_slot) AS next_run,
       s.last_slot, s.last_run_at, s.last_job_id, j.state AS last_job_state, s.skipped,
       s.created_at
  FROM jobcap.job_schedules s
  LEFT JOIN jobcap.jobs j ON j.job_id OPERATOR(pg_catalog.=) s.last_job_id;
COMMENT ON VIEW jobcap.schedules IS
    'Periodic jobs: the next slot not handled yet (due when past), the last slot handled and the job it enqueued.';

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

-- The hot path. claim_job, complete_and_claim, complete_job, complete_jobs, heartbeat and
-- assert_fence change jobcap.jobs through its indexes and heap, without SQL (the direct path,
-- src/direct/jobs.hpp; jobcap.hot_path = sql runs their SQL statements instead). A SET clause
-- would cost each call a GUC nest level, a search_path parse and its undo (about 20,000
-- instructions, as much as a twentieth of a job) for a path that looks nothing up by name. They
-- pin search_path in C instead, to the same value, around every SQL statement they run (the
-- SQL path and every error report: spi_open in src/spi/access.cpp), so no caller's search_path
-- ever reaches a statement; test/sql/direct_path.sql shows it.
ALTER FUNCTION jobcap.claim_job(text, text, integer, interval) RESET search_path;
ALTER FUNCTION jobcap.complete_and_claim(bigint, bigint, text, text, integer, interval, jsonb)
    RESET search_path;
ALTER FUNCTION jobcap.complete_job(bigint, bigint, jsonb) RESET search_path;
ALTER FUNCTION jobcap.complete_jobs(bigint[], bigint[], jsonb[]) RESET search_path;
ALTER FUNCTION jobcap.heartbeat(bigint, bigint, interval) RESET search_path;
ALTER FUNCTION jobcap.assert_fence(bigint, bigint) RESET search_path;
-- enqueue_job and enqueue_jobs run SQL only, all of it inside spi_open: the same pin, without
-- the clause's cost on every call.
ALTER FUNCTION jobcap.enqueue_job(text, jsonb, timestamptz, integer, integer, text)
    RESET search_path;
ALTER FUNCTION jobcap.enqueue_jobs(text, jsonb[], timestamptz, integer, integer)
    RESET search_path;

-- Smaller holes: intervals added to a time, dead_jobs' payload.

-- Intervals jobcap adds to a time (leases, backoffs, retry delays) may no longer have months, or
-- days and time of opposite signs (src/core/rules.cpp): PostgreSQL adds a month as a calendar
-- month and a day as a calendar day in the session's time zone, so '-2 mons +60 days 00:00:01'
-- passed as one second and made leases that expired at birth. Settings stored under 0.1.0 that
-- break the rule (queues' settings, running jobs' leases) are rewritten as the plain length of
-- time 0.1.0 checked them as: a month 30 days, a day 24 hours. The helper returns NULL for an
-- interval that keeps the rule; extract(epoch) counts a year as 365.25 days, so 5.25 days
-- (453600 s) per year are taken off. It exists only while this script runs. (Operators written
-- OPERATOR(pg_catalog.x) all bind alike, left to right: hence the parentheses.)
CREATE FUNCTION jobcap.upgrade_plain_span(x pg_catalog.interval)
RETURNS pg_catalog.interval
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, jobcap, pg_temp
AS $$
SELECT CASE
         WHEN pg_catalog.date_part('month', x) OPERATOR(pg_catalog.<>) 0
           OR pg_catalog.date_part('year', x) OPERATOR(pg_catalog.<>) 0
           OR (pg_catalog.date_part('day', x) OPERATOR(pg_catalog.*)
               pg_catalog.date_part('epoch', x OPERATOR(pg_catalog.-) pg_catalog.make_interval(
                   days => pg_catalog.date_part('day', x)::pg_catalog.int4)))
              OPERATOR(pg_catalog.<) 0
         THEN pg_catalog.make_interval(secs => pg_catalog.date_part('epoch', x)
                  OPERATOR(pg_catalog.-) (pg_catalog.date_part('year', x) OPERATOR(pg_catalog.*) 453600))
       END
$$;
UPDATE jobcap.queues
   SET lease = coalesce(jobcap.upgrade_plain_span(lease), lease),
       backoff_base = coalesce(jobcap.upgrade_plain_span(backoff_base), backoff_base),
       backoff_max = coalesce(jobcap.upgrade_plain_span(backoff_max), backoff_max)
 WHERE jobcap.upgrade_plain_span(lease) IS NOT NULL
    OR jobcap.upgrade_plain_span(backoff_base) IS NOT NULL
    OR jobcap.upgrade_plain_span(backoff_max) IS NOT NULL;
UPDATE jobcap.jobs SET lease = jobcap.upgrade_plain_span(lease)
 WHERE state OPERATOR(pg_catalog.=) 'running'::jobcap.job_state
   AND jobcap.upgrade_plain_span(lease) IS NOT NULL;
DROP FUNCTION jobcap.upgrade_plain_span(pg_catalog.interval);

-- dead_jobs shows what each dead job was given: the first 200 characters of its payload as
-- text, marked when cut (an operator should not need jobcap.jobs to learn which file died).
-- Its cap by the rule of "Caps", its history's crashes ('crashed', 'lease_expired',
-- 'claim_rolled_back'), 'released' rows skipped (no failure), payload_excerpt the last column.
CREATE OR REPLACE VIEW jobcap.dead_jobs AS
SELECT j.job_id, j.queue, j.attempts,
       CASE WHEN (j.cap_epoch OPERATOR(pg_catalog.=) q.cap_epoch) IS TRUE THEN j.max_attempts
            ELSE least(j.max_attempts, q.max_attempts) END AS max_attempts,
       j.finished_at AS died_at, j.enqueued_at, j.worker AS last_worker, j.dedupe_key,
       e.kind AS last_outcome, e.error AS last_error,
       h.errors, h.crashes, h.first_failure_at, h.last_failure_at,
       CASE WHEN pg_catalog.length(p.text) OPERATOR(pg_catalog.>) 200
            THEN pg_catalog.left(p.text, 200) OPERATOR(pg_catalog.||) '...'
            ELSE p.text END AS payload_excerpt
  FROM jobcap.jobs j
  LEFT JOIN jobcap.queues q ON q.queue OPERATOR(pg_catalog.=) j.queue
  LEFT JOIN LATERAL (SELECT e.kind, e.error FROM jobcap.job_errors e
                      WHERE e.job_id OPERATOR(pg_catalog.=) j.job_id
                        AND e.kind OPERATOR(pg_catalog.<>) 'released'
                      ORDER BY e.seq DESC LIMIT 1) e ON true
  LEFT JOIN LATERAL (SELECT count(*) FILTER (WHERE h.kind OPERATOR(pg_catalog.=) 'error') AS errors,
                            count(*) FILTER (WHERE h.kind OPERATOR(pg_catalog.=) ANY ('{lease_expired,claim_rolled_back,crashed}')) AS crashes,
                            min(h.at) FILTER (WHERE h.kind OPERATOR(pg_catalog.<>) ALL ('{requeued,released}')) AS first_failure_at,
                            max(h.at) FILTER (WHERE h.kind OPERATOR(pg_catalog.<>) ALL ('{requeued,released}')) AS last_failure_at
                       FROM jobcap.job_errors h
                      WHERE h.job_id OPERATOR(pg_catalog.=) j.job_id) h ON true
  CROSS JOIN LATERAL (SELECT j.payload::pg_catalog.text AS text) p
 WHERE j.state OPERATOR(pg_catalog.=) 'dead'::jobcap.job_state;

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
REVOKE ALL ON FUNCTION jobcap.restore_stats_progress(), jobcap.before_drop_extension() FROM PUBLIC;
REVOKE ALL ON FUNCTION jobcap.release_job(bigint, bigint), jobcap.crash_job(bigint, bigint, text)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION jobcap.release_job(bigint, bigint), jobcap.crash_job(bigint, bigint, text)
    TO jobcap_worker;

-- Queue controls.
REVOKE ALL ON FUNCTION
    jobcap.pause_queue(text),
    jobcap.resume_queue(text),
    jobcap.create_queue(text, integer, interval, interval, interval, boolean, integer),
    jobcap.alter_queue(text, integer, interval, interval, interval, boolean, integer),
    jobcap.complete_job(bigint, bigint, jsonb),
    jobcap.complete_jobs(bigint[], bigint[], jsonb[]),
    jobcap.complete_and_claim(bigint, bigint, text, text, integer, interval, jsonb),
    jobcap.queue_stats_between(timestamptz, timestamptz)
FROM PUBLIC;
REVOKE ALL ON FUNCTION
    jobcap.cron_next(text, timestamptz),
    jobcap.schedule_job(text, text, text, jsonb, integer, integer),
    jobcap.unschedule_job(text),
    jobcap.run_schedules()
FROM PUBLIC;
REVOKE ALL ON jobcap.queue_stats, jobcap.job_schedules, jobcap.schedules FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    jobcap.complete_job(bigint, bigint, jsonb),
    jobcap.complete_jobs(bigint[], bigint[], jsonb[]),
    jobcap.complete_and_claim(bigint, bigint, text, text, integer, interval, jsonb)
TO jobcap_worker;
GRANT EXECUTE ON FUNCTION
    jobcap.pause_queue(text),
    jobcap.resume_queue(text),
    jobcap.create_queue(text, integer, interval, interval, interval, boolean, integer),
    jobcap.alter_queue(text, integer, interval, interval, interval, boolean, integer),
    jobcap.queue_stats_between(timestamptz, timestamptz),
    jobcap.cron_next(text, timestamptz),
    jobcap.schedule_job(text, text, text, jsonb, integer, integer),
    jobcap.unschedule_job(text),
    jobcap.run_schedules()
TO jobcap_operator;
GRANT SELECT ON jobcap.queue_stats, jobcap.job_schedules, jobcap.schedules TO jobcap_operator;


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
