-- A heartbeat is a HOT update: lease_expires_at is in no index, and nothing a heartbeat
-- writes is in an index's key or predicate, so a worker extending its lease adds no index
-- entries and leaves no dead ones behind. (Claims and completions change state, which the
-- partial indexes' predicates read: they cannot be HOT.)
\set VERBOSITY terse
SELECT jobcap.create_queue('hot');
SELECT count(jobcap.enqueue_job('hot', jsonb_build_object('n', n))) FROM generate_series(1, 10) n;
CREATE TABLE hot_claimed AS SELECT job_id, fence FROM jobcap.claim_job('hot', 'w', 10);
SELECT count(*) AS claimed FROM hot_claimed;

SELECT pg_stat_force_next_flush();
SELECT n_tup_upd AS u0, n_tup_hot_upd AS h0 FROM pg_stat_user_tables
 WHERE relid = 'jobcap.jobs'::regclass \gset

-- Three rounds of heartbeats, each its own transaction, as a worker's would be.
DO $$
DECLARE
    j record;
BEGIN
    FOR round IN 1..3 LOOP
        FOR j IN SELECT job_id, fence FROM hot_claimed ORDER BY job_id LOOP
            PERFORM jobcap.heartbeat(j.job_id, j.fence);
            COMMIT;
        END LOOP;
    END LOOP;
END $$;

SELECT pg_stat_force_next_flush();
SELECT n_tup_upd - :u0 AS updates, n_tup_hot_upd - :h0 AS hot_updates
  FROM pg_stat_user_tables WHERE relid = 'jobcap.jobs'::regclass;

DROP TABLE hot_claimed;
SELECT jobcap.drop_queue('hot', force => true);
