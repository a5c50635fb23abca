-- Without shared_preload_libraries: no background worker, and everything still works; the reaper
-- runs when called (pg_cron, cron + psql: docs/worker.md), with the statements shown there.
\set VERBOSITY terse
SELECT count(*) AS reapers FROM pg_stat_activity WHERE backend_type = 'jobcap reaper';
-- The workers' settings exist once the library is loaded, with their units; they are used only
-- by a preloaded jobcap.
LOAD 'jobcap';
SELECT name, boot_val, unit, context FROM pg_settings WHERE name LIKE 'jobcap.%' ORDER BY name;

SELECT jobcap.create_queue('np', max_attempts => 2, lease => '1 second', backoff_base => '0',
                           backoff_max => '0');
SELECT jobcap.enqueue_job('np') AS a \gset
SELECT jobcap.enqueue_job('np') AS b \gset
SELECT count(*) AS claimed FROM jobcap.claim_job('np', 'w', batch => 2);
UPDATE jobcap.jobs SET lease_expires_at = now() - interval '1 second' WHERE queue = 'np';
-- Nobody reaps on their own: the expired leases stay until someone calls the reaper.
SELECT pg_sleep(0.3);
SELECT job_id = :a AS is_a, state FROM jobcap.jobs WHERE queue = 'np' ORDER BY job_id;

-- The cron + psql recipe: psql -c "SELECT count(*) FROM jobcap.reap_jobs()" every minute.
SELECT count(*) FROM jobcap.reap_jobs();
SELECT job_id = :a AS is_a, state, attempts FROM jobcap.jobs WHERE queue = 'np' ORDER BY job_id;
-- A second call finds nothing: the reaper is idempotent, so overlapping schedules are harmless.
SELECT count(*) FROM jobcap.reap_jobs();

-- Claimed again and lost again: the second lost lease is the last attempt.
SELECT count(*) AS claimed FROM jobcap.claim_job('np', 'w', batch => 2);
UPDATE jobcap.jobs SET lease_expires_at = now() - interval '1 second' WHERE queue = 'np';
SELECT job_id = :a AS is_a, outcome FROM jobcap.reap_jobs() ORDER BY job_id;

-- Statistics without the worker: failures, lost leases and deaths are read from the tables at
-- once; finished jobs enter the counts (succeeded, cancelled, claim latency) when something
-- calls jobcap.refresh_stats(), as a scheduler would (docs/observability.md).
SELECT succeeded, dead, new_dead, lost_leases, crashed_jobs FROM jobcap.queue_stats WHERE queue = 'np';
SELECT jobcap.enqueue_job('np') AS c \gset
SELECT jobcap.complete_job(job_id, fence) = 'succeeded' AS completed FROM jobcap.claim_job('np', 'w');
SELECT succeeded AS not_counted_yet FROM jobcap.queue_stats WHERE queue = 'np';
SELECT jobcap.refresh_stats() AS counted;
SELECT succeeded, counted_until <= now() AS counted_until_now FROM jobcap.queue_stats WHERE queue = 'np';

-- Retention by hand (what the worker does with jobcap.succeeded_retention / dead_retention):
-- the recipe from docs/worker.md, run in a loop until it deletes nothing. Like the worker, it
-- deletes only jobs that refresh_stats has counted.
UPDATE jobcap.jobs SET finished_at = now() - interval '8 days' WHERE job_id = :a;
WITH doomed AS MATERIALIZED (
  SELECT job_id FROM jobcap.jobs
   WHERE state IN ('dead', 'cancelled')
     AND finished_at < least(now() - interval '7 days', (SELECT counted_until FROM jobcap.stats_progress))
   LIMIT 1000 FOR UPDATE SKIP LOCKED),
 gone AS (DELETE FROM jobcap.jobs j USING doomed d
   WHERE j.job_id = d.job_id AND j.state IN ('dead', 'cancelled')
   RETURNING j.job_id),
 history AS (DELETE FROM jobcap.job_errors e USING gone g WHERE e.job_id = g.job_id)
SELECT count(*) AS pruned FROM gone;
SELECT job_id = :b AS is_b, state FROM jobcap.jobs WHERE queue = 'np' ORDER BY job_id;
SELECT count(*) AS orphaned_history FROM jobcap.job_errors e
 WHERE NOT EXISTS (SELECT FROM jobcap.jobs j WHERE j.job_id = e.job_id);

SELECT jobcap.drop_queue('np', force => true);
