-- jobcap 0.2.0 -> 0.3.0. As for 0.2.0, there is no jobcap--0.3.0.sql: CREATE EXTENSION jobcap runs
-- jobcap--0.1.0.sql, jobcap--0.1.0--0.2.0.sql and then this script, so a new install and an
-- upgraded one get the same schema. The rules of the scripts before hold: every name qualified,
-- every function pins search_path, none is SECURITY DEFINER. Of the functions a worker calls,
-- only enqueue_job and enqueue_jobs are replaced (new parameters last): a statement that resolved
-- them before the update commits can fail once and is retried (UPDATING.md).
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

-- Citus (issue 35). jobcap.distribute() spreads jobcap over a Citus cluster (docs/scaling.md):
-- jobs and their history distributed by queue and colocated, with the statistics tables;
-- queues, grants and schedules reference tables; the hot-path functions delegated by Citus to
-- the node that holds their shard. Nothing changes until it is called: a single server keeps
-- the tables, keys and sequences of a fresh install (the primary keys that Citus needs, which
-- hold the distribution column, are wider and cost every insert: distribute() makes them).

-- A claim's or requeue's new fence on a Citus node: a value of jobcap.fences made into a fence
-- whose hash (Citus's, of its text) falls in the shard's range [lo, hi], so that Citus delegates
-- the job's settles, which it routes by fence, to the job's shard (src/spi/citus_shards.cpp puts
-- the call in the statements; src/functions/distribute.cpp). No SET clause: it looks nothing up
-- by name, and it runs once per claimed job.
CREATE FUNCTION jobcap.shard_fence(lo integer, hi integer)
RETURNS bigint
LANGUAGE C VOLATILE STRICT
AS 'MODULE_PATHNAME', 'jobcap_shard_fence';
COMMENT ON FUNCTION jobcap.shard_fence(integer, integer) IS
    'On a Citus node: a new fence whose hash as text is in [lo, hi] (the claims and requeues of jobcap''s statements on a shard call it).';

-- One node's part of distribute(): run on every node (the coordinator runs it on the workers).
-- Before the tables are distributed: the primary keys of jobs and job_errors take the
-- distribution column (Citus refuses a unique key without it), and the foreign keys to queues
-- go (re-made between reference tables once they are). On every node, also one added later: the
-- node's sequences start in a range of their own, so ids, history rows and fences are unique
-- across the cluster (extension sequences get no node ranges from Citus): node group g makes
-- job ids and history numbers from (g + 1) * 2^48 and fences from 256 * (g + 16) * 2^48, above
-- everything a single server made before. setval only: Citus refuses ALTER SEQUENCE on them.
CREATE FUNCTION jobcap.distribute_node()
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, jobcap, pg_temp
AS $$
DECLARE
    g pg_catalog.int8 := (SELECT l.groupid FROM pg_catalog.pg_dist_local_group l);
    ids pg_catalog.int8;
    fences pg_catalog.int8;
BEGIN
    IF g OPERATOR(pg_catalog.>) 110 THEN
        RAISE EXCEPTION 'jobcap on Citus supports node groups up to 110, not %', g
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition p
                    WHERE p.logicalrelid OPERATOR(pg_catalog.=) 'jobcap.jobs'::pg_catalog.regclass) THEN
        IF (SELECT i.indnatts FROM pg_catalog.pg_index i
             WHERE i.indexrelid OPERATOR(pg_catalog.=) 'jobcap.jobs_pkey'::pg_catalog.regclass) OPERATOR(pg_catalog.=) 1 THEN
            ALTER TABLE jobcap.jobs DROP CONSTRAINT jobs_pkey,
                ADD CONSTRAINT jobs_pkey PRIMARY KEY (job_id, queue);
        END IF;
        IF (SELECT i.indnatts FROM pg_catalog.pg_index i
             WHERE i.indexrelid OPERATOR(pg_catalog.=) 'jobcap.job_errors_pkey'::pg_catalog.regclass) OPERATOR(pg_catalog.=) 1 THEN
            ALTER TABLE jobcap.job_errors DROP CONSTRAINT job_errors_pkey,
                ADD CONSTRAINT job_errors_pkey PRIMARY KEY (seq, queue);
        END IF;
        ALTER TABLE jobcap.queue_grants DROP CONSTRAINT IF EXISTS queue_grants_queue_fkey;
        ALTER TABLE jobcap.job_schedules DROP CONSTRAINT IF EXISTS job_schedules_queue_fkey;
    END IF;
    ids := (g OPERATOR(pg_catalog.+) 1) OPERATOR(pg_catalog.*) 281474976710656;
    fences := (g OPERATOR(pg_catalog.+) 16) OPERATOR(pg_catalog.*) 281474976710656;
    PERFORM pg_catalog.setval('jobcap.jobs_job_id_seq', ids, false)
       FROM jobcap.jobs_job_id_seq s
      WHERE s.last_value OPERATOR(pg_catalog.<) ids;
    PERFORM pg_catalog.setval('jobcap.job_errors_seq_seq', ids, false)
       FROM jobcap.job_errors_seq_seq s
      WHERE s.last_value OPERATOR(pg_catalog.<) ids;
    PERFORM pg_catalog.setval('jobcap.fences', fences, false)
       FROM jobcap.fences s
      WHERE s.last_value OPERATOR(pg_catalog.<) fences;
END
$$;
COMMENT ON FUNCTION jobcap.distribute_node() IS
    'One node''s part of jobcap.distribute() (keys before distribution; the node''s ranges of ids and fences).';

-- The functions Citus delegates to the node that holds their shard, by the argument that names
-- it: a queue, or a fence (whose hash falls in its job's shard). force_delegation: also inside a
-- transaction block, where the call joins the distributed transaction. The C side routes the
-- same functions by the same arguments (kRules in src/spi/citus.cpp).
CREATE FUNCTION jobcap.distribute(shard_count integer DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, jobcap, pg_temp
AS $$
DECLARE
    f record;
    failed pg_catalog.text;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension e WHERE e.extname OPERATOR(pg_catalog.=) 'citus') THEN
        RAISE EXCEPTION 'extension "citus" is not installed in this database'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'jobcap.distribute() spreads jobcap over a Citus cluster: CREATE EXTENSION citus and add the worker nodes first (docs/scaling.md).';
    END IF;
    IF (SELECT l.groupid FROM pg_catalog.pg_dist_local_group l) OPERATOR(pg_catalog.<>) 0 THEN
        RAISE EXCEPTION 'jobcap.distribute() runs on the coordinator'
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF shard_count IS NOT NULL AND shard_count OPERATOR(pg_catalog.<) 1 THEN
        RAISE EXCEPTION 'shard_count must be positive' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition p
                    WHERE p.logicalrelid OPERATOR(pg_catalog.=) 'jobcap.jobs'::pg_catalog.regclass)
       AND EXISTS (SELECT FROM jobcap.jobs j WHERE j.state OPERATOR(pg_catalog.=) 'running') THEN
        RAISE EXCEPTION 'cannot distribute jobcap while jobs are running'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'A running job''s fence was not made to route: its settles would not reach its shard.',
                  HINT = 'Pause the queues (jobcap.pause_queue) and let the running jobs settle, then call it again.';
    END IF;

    -- Foreign keys to a reference table made in the transaction that distributed tables: Citus
    -- then needs one connection per node.
    PERFORM pg_catalog.set_config('citus.multi_shard_modify_mode', 'sequential', true);

    -- Every node's part, the workers' first (each in a transaction of its own: calling this
    -- again finishes what a failure left).
    SELECT pg_catalog.string_agg(r.result, '; ') INTO failed
      FROM pg_catalog.run_command_on_workers('SELECT jobcap.distribute_node()') r
     WHERE NOT r.success;
    IF failed IS NOT NULL THEN
        RAISE EXCEPTION 'could not prepare every node for jobcap: %', failed
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Install jobcap on every node (CREATE EXTENSION jobcap, at the coordinator''s version), then call jobcap.distribute() again.';
    END IF;
    PERFORM jobcap.distribute_node();

    IF NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition p
                    WHERE p.logicalrelid OPERATOR(pg_catalog.=) 'jobcap.jobs'::pg_catalog.regclass) THEN
        PERFORM pg_catalog.create_distributed_table('jobcap.jobs', 'queue', shard_count => shard_count);
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition p
                    WHERE p.logicalrelid OPERATOR(pg_catalog.=) 'jobcap.job_errors'::pg_catalog.regclass) THEN
        PERFORM pg_catalog.create_distributed_table('jobcap.job_errors', 'queue', colocate_with => 'jobcap.jobs');
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition p
                    WHERE p.logicalrelid OPERATOR(pg_catalog.=) 'jobcap.stats_minutes'::pg_catalog.regclass) THEN
        PERFORM pg_catalog.create_distributed_table('jobcap.stats_minutes', 'queue', colocate_with => 'jobcap.jobs');
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition p
                    WHERE p.logicalrelid OPERATOR(pg_catalog.=) 'jobcap.stats_latency'::pg_catalog.regclass) THEN
        PERFORM pg_catalog.create_distributed_table('jobcap.stats_latency', 'queue', colocate_with => 'jobcap.jobs');
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition p
                    WHERE p.logicalrelid OPERATOR(pg_catalog.=) 'jobcap.queues'::pg_catalog.regclass) THEN
        PERFORM pg_catalog.create_reference_table('jobcap.queues');
        PERFORM pg_catalog.create_reference_table('jobcap.queue_grants');
        PERFORM pg_catalog.create_reference_table('jobcap.job_schedules');
        ALTER TABLE jobcap.queue_grants ADD CONSTRAINT queue_grants_queue_fkey
            FOREIGN KEY (queue) REFERENCES jobcap.queues ON DELETE CASCADE ON UPDATE CASCADE;
        ALTER TABLE jobcap.job_schedules ADD CONSTRAINT job_schedules_queue_fkey
            FOREIGN KEY (queue) REFERENCES jobcap.queues ON DELETE CASCADE ON UPDATE CASCADE;
    END IF;

    -- The rows copied into shards stay on the coordinator's disk, invisible, until truncated.
    PERFORM pg_catalog.truncate_local_data_after_distributing_table(t::pg_catalog.regclass)
       FROM pg_catalog.unnest(ARRAY['jobcap.jobs', 'jobcap.job_errors', 'jobcap.stats_minutes',
                                    'jobcap.stats_latency', 'jobcap.queues', 'jobcap.queue_grants',
                                    'jobcap.job_schedules']) t;

    FOR f IN
        SELECT p.oid::pg_catalog.regprocedure AS fn, r.arg
          FROM (VALUES ('claim_job', 'queue'), ('complete_and_claim', 'queue'),
                       ('enqueue_job', 'queue'), ('enqueue_jobs', 'queue'),
                       ('queue_depth', 'queue'), ('complete_job', 'fence'),
                       ('fail_job', 'fence'), ('heartbeat', 'fence'), ('assert_fence', 'fence'),
                       ('release_job', 'fence'), ('crash_job', 'fence'),
                       ('give_up_job', 'fence'), ('snooze_job', 'fence'),
                       ('time_out_job', 'fence'), ('count_rolled_back_claim', 'fence')) r(name, arg)
          JOIN pg_catalog.pg_proc p ON p.proname OPERATOR(pg_catalog.=) r.name
                                   AND p.pronamespace OPERATOR(pg_catalog.=) 'jobcap'::pg_catalog.regnamespace
    LOOP
        PERFORM pg_catalog.create_distributed_function(f.fn, f.arg, colocate_with => 'jobcap.jobs',
                                                       force_delegation => true);
    END LOOP;
END
$$;
COMMENT ON FUNCTION jobcap.distribute(integer) IS
    'Spreads jobcap over the Citus cluster (run on the coordinator; again after adding nodes): docs/scaling.md.';

REVOKE ALL ON FUNCTION jobcap.shard_fence(integer, integer), jobcap.distribute_node(),
    jobcap.distribute(integer) FROM PUBLIC;

-- Workflows (issue 37): dependencies with exactly-once fan-in, bounded snoozes, run-time limits,
-- start-by deadlines, and cancellation that reaches the worker (docs/workflows.md).

-- A job that depends on others waits in a state of its own, never claimable, until every one of
-- them has succeeded. PostgreSQL refuses a new enum value in the transaction that adds it ("unsafe
-- use of new value"), and CREATE EXTENSION and ALTER EXTENSION UPDATE run this script in one
-- transaction: below, 'waiting' is never written; the index predicates name it as "none of the
-- other states". The statements that name it are jobcap's, prepared after the update commits.
ALTER TYPE jobcap.job_state ADD VALUE 'waiting' BEFORE 'pending';

-- Per queue: how many snoozes a job gets before a snooze counts as an attempt, and how long a
-- claimed job may run (NULL: no limit) before the background worker ends the attempt.
ALTER TABLE jobcap.queues
    ADD COLUMN max_snoozes integer NOT NULL DEFAULT 10 CHECK (max_snoozes OPERATOR(pg_catalog.>=) 0),
    ADD COLUMN max_run_time interval CHECK (max_run_time OPERATOR(pg_catalog.>) interval '0');
COMMENT ON COLUMN jobcap.queues.max_snoozes IS
    'snooze_job gives a job''s attempt back this many times; later snoozes count as attempts.';
COMMENT ON COLUMN jobcap.queues.max_run_time IS
    'A running job whose attempt is older than this (or than its own, whichever is shorter) is ended by the background worker; NULL: no limit.';

-- Per job, every one NULL for a job enqueued without them, so an ordinary enqueue writes nothing
-- more and the columns cost the hot path nothing (no default, no table rewrite here).
ALTER TABLE jobcap.jobs
    ADD COLUMN waiting_on integer,
    ADD COLUMN has_dependents boolean,
    ADD COLUMN snoozes integer,
    ADD COLUMN max_run_time interval,
    ADD COLUMN start_by timestamptz;
COMMENT ON COLUMN jobcap.jobs.waiting_on IS
    'For a job enqueued with depends_on: how many of the jobs it depends on have not succeeded yet; it waits until 0.';
COMMENT ON COLUMN jobcap.jobs.has_dependents IS
    'Some job was enqueued depending on this one: its completion releases them, its death cancels them.';
COMMENT ON COLUMN jobcap.jobs.snoozes IS 'Times snooze_job put the job back (NULL: never).';
COMMENT ON COLUMN jobcap.jobs.max_run_time IS
    'This job''s own run-time limit; the shorter of it and its queue''s applies. NULL: the queue''s.';
COMMENT ON COLUMN jobcap.jobs.start_by IS
    'A job not claimed by then is cancelled (reason "expired"); NULL: no deadline.';

-- The edges of workflows: job_id waits for depends_on. Written once, when job_id is enqueued (so
-- a job can depend only on jobs that exist before it, and no cycle can form), and deleted with
-- job_id. pass_output: job_id's payload receives depends_on's output when it is released.
CREATE TABLE jobcap.job_dependencies (
    depends_on  bigint NOT NULL,
    job_id      bigint NOT NULL,
    pass_output boolean NOT NULL DEFAULT false,
    PRIMARY KEY (depends_on, job_id)
);
CREATE INDEX job_dependencies_job ON jobcap.job_dependencies (job_id, depends_on);
COMMENT ON TABLE jobcap.job_dependencies IS
    'Workflow edges: job_id runs only after depends_on has succeeded (enqueue_job''s depends_on).';
SELECT pg_catalog.pg_extension_config_dump('jobcap.job_dependencies', '');

-- History kinds: a snooze (snooze_job), an attempt ended by max_run_time or a worker's hard time
-- limit (the background worker, time_out_job), and a cancellation with its reason (cancel_job, an
-- expired start_by, a job depended on that died or was cancelled).
ALTER TABLE jobcap.job_errors DROP CONSTRAINT job_errors_kind_check;
ALTER TABLE jobcap.job_errors ADD CONSTRAINT job_errors_kind_check
    CHECK (kind OPERATOR(pg_catalog.=) ANY ('{error,lease_expired,crashed,requeued,claim_rolled_back,released,snoozed,timed_out,cancelled}'));
COMMENT ON TABLE jobcap.job_errors IS
    'Attempts that ended badly (reported errors, crashes seen by the worker, leases that expired without a report, claims that rolled back, attempts past their run-time limit), requeues, releases, snoozes and cancellations.';

-- Waiting jobs, for the statistics (per queue) and the start-by sweep. "None of the other
-- states" is 'waiting' (see above). Ordered so that the states an enqueue, a claim and a
-- completion write fail the test at the first element.
CREATE INDEX jobs_waiting ON jobcap.jobs (queue)
    WHERE state OPERATOR(pg_catalog.<>) ALL ('{pending,running,succeeded,dead,cancelled}');
-- Jobs with a start_by, pending or waiting: the background worker cancels those never claimed
-- once it passes (first_claimed_at, read from the row: a claimed job that waits for a retry is
-- in the index too). A job without a deadline fails the first test. first_claimed_at stays out
-- of the predicate: as an indexed column, every update's HOT check read it, a late column after
-- NULLs, from both rows, about 1,700 instructions per claimed and completed job.
CREATE INDEX jobs_start_by ON jobcap.jobs (start_by)
    WHERE start_by IS NOT NULL
      AND state OPERATOR(pg_catalog.<>) ALL ('{running,succeeded,dead,cancelled}');

-- Dedupe windows (enqueue_job's dedupe_window): a key's succeeded and cancelled jobs, the latest
-- (highest id) first, one entry read per lookup. A job enters once, when it ends; a job without
-- a key fails the first test. Its columns are indexed already (jobs_dedupe, the primary key):
-- with enqueued_at as a key, every update's HOT check read that late column from both rows,
-- +2,632 instructions per claimed and completed job (make bench-profile), for jobs that never
-- enter the index.
CREATE INDEX jobs_dedupe_done ON jobcap.jobs (queue, dedupe_key, job_id)
    WHERE dedupe_key IS NOT NULL AND state OPERATOR(pg_catalog.=) ANY ('{succeeded,cancelled}');

-- New parameters of create_queue, alter_queue, enqueue_job and enqueue_jobs (max_snoozes,
-- max_run_time; depends_on, parent_outputs, max_run_time, start_by): their one declaration each
-- is in the per-key concurrency section below, with every section's parameters.

CREATE FUNCTION jobcap.snooze_job(job_id bigint, fence bigint, delay interval)
RETURNS jobcap.job_state
LANGUAGE C VOLATILE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_snooze_job';
COMMENT ON FUNCTION jobcap.snooze_job(bigint, bigint, interval) IS
    'Puts a running job back for delay: its attempt given back up to its queue''s max_snoozes times, counted after (dead at its cap); history kind snoozed; a stale fence raises JC001.';

CREATE FUNCTION jobcap.time_out_job(job_id bigint, fence bigint, error text)
RETURNS jobcap.job_state
LANGUAGE C VOLATILE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_time_out_job';
COMMENT ON FUNCTION jobcap.time_out_job(bigint, bigint, text) IS
    'fail_job for a handler stopped by the worker''s own time limit (history kind timed_out, as max_run_time): retried after backoff, or dead at the cap; a stale fence raises JC001.';

-- The background worker's count of a rolled-back claim, on the node that holds the job: on a
-- Citus cluster a node whose shard moved away after the rollback calls it, delegated by the
-- fence (docs/scaling.md). Granted to nobody.
CREATE FUNCTION jobcap.count_rolled_back_claim(job_id bigint, fence bigint, worker text)
RETURNS boolean
LANGUAGE C VOLATILE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_count_rolled_back_claim';
COMMENT ON FUNCTION jobcap.count_rolled_back_claim(bigint, bigint, text) IS
    'For the background worker: counts a rolled-back claim of a job still pending below its cap with a lower fence; true when counted.';
REVOKE ALL ON FUNCTION jobcap.count_rolled_back_claim(bigint, bigint, text) FROM PUBLIC;

CREATE FUNCTION jobcap.job_tree(job_id bigint)
RETURNS TABLE (job_id bigint, queue text, state jobcap.job_state, depth integer,
               depends_on bigint[], waiting_on integer, attempts integer,
               enqueued_at timestamptz, finished_at timestamptz, reason text)
LANGUAGE C STABLE ROWS 10
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_job_tree';
COMMENT ON FUNCTION jobcap.job_tree(bigint) IS
    'The workflow of a job: its ancestors up to their roots and everything that depends on those, with states, the longest chain from a root (depth), and why a job died or was cancelled.';

-- top_failing_jobs shows attempts past their run-time limit (among crashes) and snoozes: two
-- columns at the end.
DROP FUNCTION jobcap.top_failing_jobs(text, integer, timestamptz, timestamptz);
CREATE FUNCTION jobcap.top_failing_jobs(queue text DEFAULT NULL, n integer DEFAULT 10,
                                        since timestamptz DEFAULT NULL,
                                        until timestamptz DEFAULT NULL)
RETURNS TABLE (job_id bigint, queue text, state jobcap.job_state, attempts integer,
               max_attempts integer, failures bigint, errors bigint, crashes bigint,
               first_failure_at timestamptz, last_failure_at timestamptz, last_errors text[],
               timed_out bigint, snoozes bigint)
LANGUAGE C VOLATILE ROWS 10
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_top_failing_jobs';
COMMENT ON FUNCTION jobcap.top_failing_jobs(text, integer, timestamptz, timestamptz) IS
    'The n jobs (of queue, or of every queue) with the most failed attempts in the window, worst first, then those that snoozed most.';

-- queue_stats counts the jobs waiting for others, and the due jobs that each limit of the queue
-- holds back (NULL: the queue has no such limit): columns at the end.
DROP VIEW jobcap.queue_stats;
DROP FUNCTION jobcap.queue_stats_between(timestamptz, timestamptz);
CREATE FUNCTION jobcap.queue_stats_between(since timestamptz, until timestamptz DEFAULT NULL)
RETURNS TABLE (queue text, pending bigint, scheduled bigint, running bigint, succeeded bigint,
               dead bigint, cancelled bigint, failed_attempts bigint, failing_jobs bigint,
               lost_leases bigint, crashed_jobs bigint, new_dead bigint,
               claim_latency_p50 interval, claim_latency_p95 interval,
               oldest_pending_age interval, window_start timestamptz, window_end timestamptz,
               counted_until timestamptz, paused boolean, max_running integer, waiting bigint,
               held_by_max_running bigint, held_by_rate bigint, held_by_key bigint)
LANGUAGE C VOLATILE ROWS 10
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_queue_stats_between';
COMMENT ON FUNCTION jobcap.queue_stats_between(timestamptz, timestamptz) IS
    'Per queue: jobs by state now, and failures, deaths, completions and claim latency in (since, until]; NULL since = until - jobcap.stats_window, NULL until = now.';
CREATE VIEW jobcap.queue_stats AS SELECT * FROM jobcap.queue_stats_between(NULL, NULL);
COMMENT ON VIEW jobcap.queue_stats IS
    'Per queue: jobs by state now, and failures, deaths, completions and claim latency over the last jobcap.stats_window.';

-- dead_jobs counts an attempt past its run-time limit (timed_out) among crashes; snoozes and
-- cancellations are no failures.
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
                            count(*) FILTER (WHERE h.kind OPERATOR(pg_catalog.=) ANY ('{lease_expired,claim_rolled_back,crashed,timed_out}')) AS crashes,
                            min(h.at) FILTER (WHERE h.kind OPERATOR(pg_catalog.<>) ALL ('{requeued,released,snoozed,cancelled}')) AS first_failure_at,
                            max(h.at) FILTER (WHERE h.kind OPERATOR(pg_catalog.<>) ALL ('{requeued,released,snoozed,cancelled}')) AS last_failure_at
                       FROM jobcap.job_errors h
                      WHERE h.job_id OPERATOR(pg_catalog.=) j.job_id) h ON true
  CROSS JOIN LATERAL (SELECT j.payload::pg_catalog.text AS text) p
 WHERE j.state OPERATOR(pg_catalog.=) 'dead'::jobcap.job_state;

-- Privileges of the workflow objects (PUBLIC gets nothing). cancel_job: a worker role cancels the
-- jobs of the queues granted to it (an operator, every job); job_tree: a worker sees its queues'.
REVOKE ALL ON FUNCTION
    jobcap.snooze_job(bigint, bigint, interval),
    jobcap.time_out_job(bigint, bigint, text),
    jobcap.job_tree(bigint),
    jobcap.top_failing_jobs(text, integer, timestamptz, timestamptz),
    jobcap.queue_stats_between(timestamptz, timestamptz)
FROM PUBLIC;
REVOKE ALL ON jobcap.job_dependencies, jobcap.queue_stats FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    jobcap.snooze_job(bigint, bigint, interval),
    jobcap.time_out_job(bigint, bigint, text),
    jobcap.cancel_job(bigint),
    jobcap.job_tree(bigint)
TO jobcap_worker;
GRANT EXECUTE ON FUNCTION
    jobcap.job_tree(bigint),
    jobcap.top_failing_jobs(text, integer, timestamptz, timestamptz),
    jobcap.queue_stats_between(timestamptz, timestamptz)
TO jobcap_operator;
GRANT SELECT ON jobcap.job_dependencies, jobcap.queue_stats TO jobcap_operator;

-- Flow control (issue 36): rate limits (docs/flow_control.md).

-- rate_limit: at most that many claims of the queue's jobs in any window of rate_period (NULL:
-- no limit). A claim of a queue without one reads nothing more than before.
ALTER TABLE jobcap.queues
    ADD COLUMN rate_limit integer CHECK (rate_limit OPERATOR(pg_catalog.>) 0),
    ADD COLUMN rate_period interval NOT NULL DEFAULT '1 second'
        CHECK (rate_period OPERATOR(pg_catalog.>) interval '0');
COMMENT ON COLUMN jobcap.queues.rate_limit IS
    'At most this many claims of the queue''s jobs in any window of rate_period; NULL: no limit.';
COMMENT ON COLUMN jobcap.queues.rate_period IS 'The window of rate_limit.';

-- A rate-limited queue's claims per slot of ceil(rate_period / 16), over the last 17 slots
-- (src/core/flow.hpp), in a row per claim turn: slot -1 for the claims that take the queue's
-- claim turn exclusive, 0 to 15 for those under each slot of the shared turn (spi/queue_lock.hpp),
-- so claims that share the turn never write one row. A claim reads every row of its queue with a
-- fresh snapshot, their sum being the window, and charges what it claimed to its own row in its
-- own transaction, so a claim that rolls back gives its charge back. No foreign key (a claim
-- would take a key-share lock on the queue's row for nothing); drop_queue deletes the rows. Not
-- dumped: after a restore the window starts empty.
CREATE TABLE jobcap.queue_rates (
    queue   text NOT NULL,
    slot    integer NOT NULL,
    slot_us bigint NOT NULL,
    newest  bigint NOT NULL,
    counts  integer[] NOT NULL,
    PRIMARY KEY (queue, slot)
);
COMMENT ON TABLE jobcap.queue_rates IS
    'Claims of each rate-limited queue per slot of its window (the last 17 slots of rate_period / 16), a row per claim turn.';
COMMENT ON COLUMN jobcap.queue_rates.slot IS 'The claims counted: -1 those that took the claim turn exclusive, 0 to 15 those under that slot of the shared turn.';
COMMENT ON COLUMN jobcap.queue_rates.slot_us IS 'The width of a slot in microseconds: ceil(rate_period / 16).';
COMMENT ON COLUMN jobcap.queue_rates.newest IS 'The newest slot counted (microseconds since 2000 / slot_us).';
COMMENT ON COLUMN jobcap.queue_rates.counts IS 'Claims per slot, the 17 slots of the window, slot s at s % 17.';

-- create_queue's and alter_queue's rate_limit and rate_period: in their one declaration, in the
-- per-key concurrency section below. queue_rates is read and written only by jobcap's functions,
-- as the owner of its tables.
REVOKE ALL ON jobcap.queue_rates FROM PUBLIC;

-- Per-key concurrency and fairness (issue 36): concurrency keys, max_running_per_key and
-- round-robin fairness (docs/flow_control.md).

-- A job's concurrency key (a tenant, a customer, an account): NULL for a job enqueued without
-- one, so an ordinary enqueue writes nothing more (no default, no table rewrite here).
ALTER TABLE jobcap.jobs ADD COLUMN concurrency_key text;
COMMENT ON COLUMN jobcap.jobs.concurrency_key IS
    'The job''s concurrency key: its queue''s max_running_per_key caps the running jobs of each key, and round-robin fairness takes keys in turn; NULL: none.';

-- The pending jobs that have a key, by queue, key and then claim order. A round-robin claim walks
-- a queue's keys through it, one descent per key from the one its turn ended on, and takes each
-- key's first due jobs from it, where without it every claim ranked the queue's whole backlog
-- (functions/claim_keyed.cpp). A claim and a completion fail the first test, on a column read
-- already (concurrency_key comes last in the row); a job enqueued without a key fails the second
-- and writes no entry (the direct path tests it once per call, the key NULL in every row). The
-- key's null bit is all the HOT check reads of a job without one.
CREATE INDEX jobs_keys
    ON jobcap.jobs (pg_catalog.hashtextextended(queue, 0), concurrency_key, priority, run_at, job_id)
    WHERE state OPERATOR(pg_catalog.=) 'pending' AND concurrency_key IS NOT NULL;

-- The running jobs by queue: jobs_running's first key is now the queue's hash, as jobs_claim's
-- (0.1.0--0.2.0), then the id. A capped claim counts its queue's running jobs (max_running, and
-- per key), and the count read the running jobs of every queue through the old index, (job_id),
-- and the dead entries the completions left: with many queues each claim paid for all of them
-- (docs/flow_control.md). The reaper's and the statistics' scans of every running job read the
-- same entries as before. The fenced calls (job_id = $1 AND fence AND state = 'running'), which
-- the old key served as directly as the primary key, keep their state test out of the planner's
-- reach (inside IS TRUE) and find the row by the primary key: with job_id second here, a plan
-- through this index would walk every running job. Built under the update's lock on jobs, as
-- the claim index was.
DROP INDEX jobcap.jobs_running;
CREATE INDEX jobs_running ON jobcap.jobs (pg_catalog.hashtextextended(queue, 0), job_id)
    WHERE state OPERATOR(pg_catalog.=) 'running';

-- max_running_per_key: at most that many running jobs of each concurrency key (NULL: no limit;
-- jobs without a key are not limited by it). fairness: 'fifo' hands due jobs out by priority,
-- run_at and id; 'round_robin' across concurrency keys in turn first. A queue with either is
-- capped: its claims take turns on its row, as with max_running.
ALTER TABLE jobcap.queues
    ADD COLUMN max_running_per_key integer CHECK (max_running_per_key OPERATOR(pg_catalog.>) 0),
    ADD COLUMN fairness text NOT NULL DEFAULT 'fifo'
        CHECK (fairness OPERATOR(pg_catalog.=) ANY ('{fifo,round_robin}'));
COMMENT ON COLUMN jobcap.queues.max_running_per_key IS
    'At most this many running jobs of each concurrency key; NULL: no limit (jobs without a key are never limited by it).';
COMMENT ON COLUMN jobcap.queues.fairness IS
    'fifo: due jobs by priority, run_at, id; round_robin: across concurrency keys in turn, then so within a key.';

-- A round-robin queue's turn: the key its last claim ended on (jobs without a key take no turn),
-- written by the claim under the queue's row lock. No foreign key, as queue_rates; drop_queue
-- deletes the row. Not dumped: after a restore the turn starts at the first key.
CREATE TABLE jobcap.queue_turns (
    queue    text PRIMARY KEY,
    last_key text NOT NULL
);
COMMENT ON TABLE jobcap.queue_turns IS
    'The concurrency key each round-robin queue''s last claim ended on; the next claim starts after it.';

-- The one declaration of each of the four functions whose parameters 0.3.0 extends, with every
-- section's parameters in their order (issue 37's, rate limits', then this section's), each new
-- one last with a default that keeps the 0.2.0 behaviour. The C functions still accept the 0.2.0
-- number of arguments, so a call that resolved an old declaration before this update commits
-- runs as it would have.
DROP FUNCTION jobcap.create_queue(text, integer, interval, interval, interval, boolean, integer);
CREATE FUNCTION jobcap.create_queue(
    queue text,
    max_attempts integer DEFAULT NULL,
    lease interval DEFAULT '5 minutes',
    backoff_base interval DEFAULT '10 seconds',
    backoff_max interval DEFAULT '1 hour',
    notify boolean DEFAULT false,
    max_running integer DEFAULT NULL,
    max_snoozes integer DEFAULT 10,
    max_run_time interval DEFAULT NULL,
    rate_limit integer DEFAULT NULL,
    rate_period interval DEFAULT '1 second',
    max_running_per_key integer DEFAULT NULL,
    fairness text DEFAULT 'fifo')
RETURNS void
LANGUAGE C VOLATILE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_create_queue';
COMMENT ON FUNCTION jobcap.create_queue(text, integer, interval, interval, interval, boolean, integer, integer, interval, integer, interval, integer, text) IS
    'Creates a queue; max_running (NULL or 0: no limit) caps the jobs of the queue that run at once; max_snoozes snoozes per job are free; max_run_time (NULL or 0: none) ends longer attempts; rate_limit (NULL or 0: none) caps its claims in any window of rate_period; max_running_per_key (NULL or 0: none) caps the running jobs of each concurrency key; fairness ''round_robin'' takes keys in turn.';

DROP FUNCTION jobcap.alter_queue(text, integer, interval, interval, interval, boolean, integer);
CREATE FUNCTION jobcap.alter_queue(
    queue text,
    max_attempts integer DEFAULT NULL,
    lease interval DEFAULT NULL,
    backoff_base interval DEFAULT NULL,
    backoff_max interval DEFAULT NULL,
    notify boolean DEFAULT NULL,
    max_running integer DEFAULT NULL,
    max_snoozes integer DEFAULT NULL,
    max_run_time interval DEFAULT NULL,
    rate_limit integer DEFAULT NULL,
    rate_period interval DEFAULT NULL,
    max_running_per_key integer DEFAULT NULL,
    fairness text DEFAULT NULL)
RETURNS void
LANGUAGE C VOLATILE
SET search_path = pg_catalog, jobcap, pg_temp
AS 'MODULE_PATHNAME', 'jobcap_alter_queue';
COMMENT ON FUNCTION jobcap.alter_queue(text, integer, interval, interval, interval, boolean, integer, integer, interval, integer, interval, integer, text) IS
    'Changes the settings given (NULL: unchanged); max_running => 0 removes the limit, as max_run_time => ''0'', rate_limit => 0 and max_running_per_key => 0 do.';

-- enqueue_job and enqueue_jobs pin search_path in C, as in 0.2.0 (no SET clause: see "The hot
-- path" in jobcap--0.1.0--0.2.0.sql).
DROP FUNCTION jobcap.enqueue_job(text, jsonb, timestamptz, integer, integer, text);
CREATE FUNCTION jobcap.enqueue_job(
    queue text,
    payload jsonb DEFAULT '{}',
    run_at timestamptz DEFAULT pg_catalog.now(),
    priority integer DEFAULT 0,
    max_attempts integer DEFAULT NULL,
    dedupe_key text DEFAULT NULL,
    depends_on bigint[] DEFAULT NULL,
    parent_outputs boolean DEFAULT false,
    max_run_time interval DEFAULT NULL,
    start_by timestamptz DEFAULT NULL,
    concurrency_key text DEFAULT NULL,
    dedupe_window interval DEFAULT NULL,
    dedupe text DEFAULT 'keep')
RETURNS bigint
LANGUAGE C VOLATILE
AS 'MODULE_PATHNAME', 'jobcap_enqueue_job';
COMMENT ON FUNCTION jobcap.enqueue_job(text, jsonb, timestamptz, integer, integer, text, bigint[], boolean, interval, timestamptz, text, interval, text) IS
    'Inserts a job; with depends_on it waits until each of those jobs has succeeded (parent_outputs: their outputs join its payload) and is cancelled when one dies or is cancelled; max_run_time bounds each attempt; a job not claimed by start_by is cancelled; concurrency_key is the key its queue''s max_running_per_key and fairness apply to; dedupe_window: a dedupe_key also returns the key''s succeeded or cancelled job enqueued within it; dedupe => ''replace'': a pending job holding the key takes this payload and run_at.';

DROP FUNCTION jobcap.enqueue_jobs(text, jsonb[], timestamptz, integer, integer);
CREATE FUNCTION jobcap.enqueue_jobs(
    queue text,
    payloads jsonb[],
    run_at timestamptz DEFAULT pg_catalog.now(),
    priority integer DEFAULT 0,
    max_attempts integer DEFAULT NULL,
    depends_on bigint[] DEFAULT NULL,
    parent_outputs boolean DEFAULT false,
    max_run_time interval DEFAULT NULL,
    start_by timestamptz DEFAULT NULL,
    concurrency_keys text[] DEFAULT NULL)
RETURNS bigint[]
LANGUAGE C VOLATILE
AS 'MODULE_PATHNAME', 'jobcap_enqueue_jobs';
COMMENT ON FUNCTION jobcap.enqueue_jobs(text, jsonb[], timestamptz, integer, integer, bigint[], boolean, interval, timestamptz, text[]) IS
    'Inserts a job per payload in one statement (ids in payload order), each with enqueue_job''s workflow options; concurrency_keys: one key (or NULL) per payload.';

-- Privileges of the four (PUBLIC gets nothing) and of queue_turns (jobcap's functions only).
REVOKE ALL ON FUNCTION
    jobcap.create_queue(text, integer, interval, interval, interval, boolean, integer, integer, interval, integer, interval, integer, text),
    jobcap.alter_queue(text, integer, interval, interval, interval, boolean, integer, integer, interval, integer, interval, integer, text),
    jobcap.enqueue_job(text, jsonb, timestamptz, integer, integer, text, bigint[], boolean, interval, timestamptz, text, interval, text),
    jobcap.enqueue_jobs(text, jsonb[], timestamptz, integer, integer, bigint[], boolean, interval, timestamptz, text[])
FROM PUBLIC;
REVOKE ALL ON jobcap.queue_turns FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    jobcap.enqueue_job(text, jsonb, timestamptz, integer, integer, text, bigint[], boolean, interval, timestamptz, text, interval, text),
    jobcap.enqueue_jobs(text, jsonb[], timestamptz, integer, integer, bigint[], boolean, interval, timestamptz, text[])
TO jobcap_worker;
GRANT EXECUTE ON FUNCTION
    jobcap.create_queue(text, integer, interval, interval, interval, boolean, integer, integer, interval, integer, interval, integer, text),
    jobcap.alter_queue(text, integer, interval, interval, interval, boolean, integer, integer, interval, integer, interval, integer, text)
TO jobcap_operator;

-- Last, for every section above (keep it at the end of the file): as in 0.2.0, default
-- privileges of the role running this script may have granted more on the objects above; take
-- back anything held by a role other than the owner and jobcap's two roles.
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
