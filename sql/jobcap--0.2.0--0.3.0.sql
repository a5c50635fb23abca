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
                       ('give_up_job', 'fence')) r(name, arg)
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

-- As the sweep above, for this section's functions (made after it): default privileges of the
-- role running this script may have granted them to others.
DO $acl$
DECLARE
    o record;
    revoked pg_catalog.text[] := '{}';
BEGIN
    FOR o IN
        SELECT DISTINCT p.oid::pg_catalog.regprocedure::pg_catalog.text AS what,
               CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                    ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)) END AS who
          FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
         WHERE p.oid OPERATOR(pg_catalog.=) ANY (ARRAY['jobcap.shard_fence(integer, integer)'::pg_catalog.regprocedure,
                                                      'jobcap.distribute_node()'::pg_catalog.regprocedure,
                                                      'jobcap.distribute(integer)'::pg_catalog.regprocedure]::pg_catalog.oid[])
           AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
         ORDER BY 1, 2
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM %s', o.what, o.who);
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
