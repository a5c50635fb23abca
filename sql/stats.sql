-- The incident, counted: four poison jobs fail ten times each among 1,000 jobs that succeed.
-- The figures must say four failing jobs (beside 40 failed attempts), name exactly those four,
-- and after they die a new window must show no new failure.
\set VERBOSITY terse
SELECT jobcap.create_queue('media', max_attempts => 10, backoff_base => '0', backoff_max => '0');
SHOW jobcap.stats_window;
SELECT jobcap.create_queue('mail', backoff_base => '0', backoff_max => '0');

SELECT cardinality(jobcap.enqueue_jobs('media', array_agg(jsonb_build_object('file', 'clip-' || i || '.mp4'))))
  FROM generate_series(1, 1000) i;
CREATE TEMP TABLE poison AS
SELECT unnest(jobcap.enqueue_jobs('media', array_agg(jsonb_build_object('file', 'corrupt-' || i || '.mp4', 'poison', true)))) AS job_id
  FROM generate_series(1, 4) i;

-- A worker: claims in batches, completes good files, reports a long decoder error for the
-- corrupt ones (backoff 0: a failed job is due again at once). Runs until the queue is empty.
CREATE PROCEDURE pg_temp.work(queue text) LANGUAGE plpgsql AS $$
DECLARE
    c record;
    n int;
BEGIN
    LOOP
        n := 0;
        FOR c IN SELECT * FROM jobcap.claim_job(queue, 'decoder-1', 100) LOOP
            n := n + 1;
            IF c.payload ? 'poison' THEN
                PERFORM jobcap.fail_job(c.job_id, c.fence,
                    'ffmpeg: ' || (c.payload->>'file') || ': invalid data found when processing input'
                    || repeat(' (moov atom not found)', 20));
            ELSE
                PERFORM jobcap.complete_job(c.job_id, c.fence);
            END IF;
        END LOOP;
        EXIT WHEN n = 0;
    END LOOP;
END $$;
CALL pg_temp.work('media');

-- The worker's counting (the background worker runs it every second; here by hand).
SELECT jobcap.refresh_stats() AS counted;
SELECT jobcap.refresh_stats() AS counted_again;

SELECT queue, pending, scheduled, running, succeeded, dead, cancelled, failed_attempts,
       failing_jobs, lost_leases, crashed_jobs, new_dead, claim_latency_p50 IS NOT NULL AS latency,
       oldest_pending_age, window_end - window_start AS window, counted_until <= window_end AS counted
  FROM jobcap.queue_stats ORDER BY queue;

-- The worst repeaters: exactly the four poison jobs, ten failures each, last errors cut short.
SELECT t.job_id IN (SELECT job_id FROM poison) AS poison, t.queue, t.state, t.attempts,
       t.max_attempts, t.failures, t.errors, t.crashes, t.first_failure_at < t.last_failure_at AS spread,
       cardinality(t.last_errors) AS errors_shown, length(t.last_errors[1]) AS error_length
  FROM jobcap.top_failing_jobs('media', 10) t;
SELECT (SELECT array_agg(job_id ORDER BY job_id) FROM jobcap.top_failing_jobs('media', 10))
     = (SELECT array_agg(job_id ORDER BY job_id) FROM poison) AS exactly_the_four;
SELECT t.last_errors[1] FROM jobcap.top_failing_jobs('media', 1) t;
SELECT count(*) AS everywhere FROM jobcap.top_failing_jobs();
SELECT count(*) AS quiet_queue FROM jobcap.top_failing_jobs('mail');
SELECT count(*) FROM jobcap.top_failing_jobs('nope');
SELECT count(*) FROM jobcap.top_failing_jobs('media', 0);

-- dead_jobs: each with what its history says.
SELECT d.job_id IN (SELECT job_id FROM poison) AS poison, d.attempts, d.max_attempts, d.last_outcome,
       d.errors, d.crashes, d.first_failure_at < d.last_failure_at AS spread, d.died_at = d.last_failure_at AS died_at_last
  FROM jobcap.dead_jobs d WHERE d.queue = 'media' ORDER BY d.job_id;

-- The next window, after they died: 100 more jobs succeed, and nothing new fails.
SELECT clock_timestamp() AS after_deaths \gset
SELECT cardinality(jobcap.enqueue_jobs('media', array_agg(jsonb_build_object('file', 'late-' || i || '.mp4'))))
  FROM generate_series(1, 100) i;
CALL pg_temp.work('media');
SELECT jobcap.refresh_stats() AS counted;
SELECT queue, pending, running, dead, failed_attempts, failing_jobs, lost_leases, crashed_jobs,
       new_dead, succeeded >= 100 AS succeeded
  FROM jobcap.queue_stats_between(:'after_deaths') WHERE queue = 'media';
SELECT count(*) AS failing_now FROM jobcap.top_failing_jobs('media', 10, since => :'after_deaths');

-- Crashes apart from errors: a mail job whose lease expires (its worker was killed), then a
-- flaky one that fails once, each retried and done. Claim latency from a known enqueue time
-- (2 s and a little): the histogram tells it within one bin (19%).
SELECT jobcap.enqueue_job('mail', '{"to": "a@example.org"}') AS crash \gset
UPDATE jobcap.jobs SET enqueued_at = enqueued_at - interval '2 seconds' WHERE job_id = :crash;
SELECT attempt FROM jobcap.claim_job('mail', 'mailer-1');
UPDATE jobcap.jobs SET lease_expires_at = now() - interval '1 second' WHERE job_id = :crash;
SELECT outcome FROM jobcap.reap_jobs();
SELECT jobcap.complete_job(job_id, fence) FROM jobcap.claim_job('mail', 'mailer-2');
SELECT jobcap.enqueue_job('mail', '{"to": "b@example.org"}') AS flaky \gset
UPDATE jobcap.jobs SET enqueued_at = enqueued_at - interval '2 seconds' WHERE job_id = :flaky;
SELECT jobcap.fail_job(job_id, fence, 'smtp: 421 try again later') FROM jobcap.claim_job('mail', 'mailer-1');
SELECT jobcap.complete_job(job_id, fence) FROM jobcap.claim_job('mail', 'mailer-2');
SELECT jobcap.enqueue_job('mail', '{"to": "c@example.org"}', run_at => now() + interval '1 hour') IS NOT NULL AS scheduled;
SELECT jobcap.cancel_job(jobcap.enqueue_job('mail', '{"to": "d@example.org"}'));
SELECT jobcap.enqueue_job('mail', '{"to": "e@example.org"}') AS waiting \gset
UPDATE jobcap.jobs SET run_at = run_at - interval '90 seconds' WHERE job_id = :waiting;
SELECT jobcap.refresh_stats() AS counted;
SELECT queue, pending, scheduled, running, succeeded, dead, cancelled, failed_attempts, failing_jobs,
       lost_leases, crashed_jobs, new_dead,
       claim_latency_p50 BETWEEN interval '1.7 seconds' AND interval '2.4 seconds' AS p50_about_2s,
       claim_latency_p95 BETWEEN interval '1.7 seconds' AND interval '2.4 seconds' AS p95_about_2s,
       oldest_pending_age BETWEEN interval '90 seconds' AND interval '100 seconds' AS waited_90s
  FROM jobcap.queue_stats WHERE queue = 'mail';
SELECT t.job_id = :crash AS crashed_job, t.failures, t.errors, t.crashes, t.last_errors
  FROM jobcap.top_failing_jobs('mail') t ORDER BY t.job_id;

-- The window follows jobcap.stats_window; explicit windows must make sense.
SET jobcap.stats_window = '10min';
SELECT DISTINCT window_end - window_start AS window FROM jobcap.queue_stats;
RESET jobcap.stats_window;
SELECT count(*) FROM jobcap.queue_stats_between(now(), now() - interval '1 minute');
SELECT count(*) FROM jobcap.queue_stats_between('infinity');
SELECT count(*) FROM jobcap.top_failing_jobs('media', 10, since => now() + interval '1 hour');
-- A window below jobcap.stats_window's minimum is refused (22023, invalid parameter value) and
-- the setting keeps its value. PostgreSQL words the range differently from version to version
-- (17 adds units), so the error is shown by its SQLSTATE and the range read from pg_settings.
\set VERBOSITY sqlstate
SET jobcap.stats_window = '10s';
\set VERBOSITY terse
SHOW jobcap.stats_window;
SELECT min_val, max_val, unit FROM pg_settings WHERE name = 'jobcap.stats_window';
SELECT jobcap.refresh_stats(0);
BEGIN TRANSACTION ISOLATION LEVEL REPEATABLE READ;
SELECT jobcap.refresh_stats();
ROLLBACK;

-- Dead letters in bulk. Requeue the one whose error names corrupt-1 (the decoder was fixed for
-- it): requeue_job's rules, budget raised by the queue's cap, the reason in its history.
SELECT jobcap.requeue_dead('media', 'decoder 6.1 reads corrupt-1', error_like => '%corrupt-1.mp4%') AS requeued;
SELECT j.state, j.attempts, j.max_attempts, j.finished_at IS NULL AS unfinished,
       (SELECT e.kind || ': ' || e.error FROM jobcap.job_errors e WHERE e.job_id = j.job_id ORDER BY e.seq DESC LIMIT 1) AS history
  FROM jobcap.jobs j WHERE j.payload->>'file' = 'corrupt-1.mp4';
SELECT jobcap.requeue_dead('media', 'again', error_like => '%corrupt-1.mp4%') AS requeued_again;
-- Purge the rest in batches of two: 2, 1, 0, with their history.
SELECT jobcap.purge_dead('media', died_before => :'after_deaths', max_jobs => 2) AS purged;
SELECT jobcap.purge_dead('media', died_before => :'after_deaths', max_jobs => 2) AS purged;
SELECT jobcap.purge_dead('media', died_before => :'after_deaths', max_jobs => 2) AS purged;
SELECT count(*) AS dead_left FROM jobcap.dead_jobs WHERE queue = 'media';
SELECT count(*) AS history_left FROM jobcap.job_errors e JOIN poison p USING (job_id)
 WHERE NOT EXISTS (SELECT FROM jobcap.jobs j WHERE j.job_id = e.job_id);
-- Filters: by age and by pattern, and a dead job with a dedupe key keeps it when requeued.
SELECT jobcap.enqueue_job('mail', '{"to": "x@example.org"}', max_attempts => 1, dedupe_key => 'x') AS keyed \gset
SELECT jobcap.fail_job(job_id, fence, 'smtp: 550 no such user') FROM jobcap.claim_job_by_id(:keyed, 'mailer-1');
SELECT jobcap.requeue_dead('mail', 'user exists now', died_after => now() + interval '1 minute') AS too_new;
SELECT jobcap.requeue_dead('mail', 'user exists now', error_like => '%421%') AS wrong_error;
SELECT jobcap.requeue_dead('mail', 'user exists now', error_like => 'smtp: 550%', extra_attempts => 2) AS requeued;
SELECT state, attempts, max_attempts, dedupe_key FROM jobcap.jobs WHERE job_id = :keyed;
SELECT jobcap.enqueue_job('mail', '{}', dedupe_key => 'x') = :keyed AS same_job;
-- Bad calls.
SELECT jobcap.requeue_dead('nope', 'why');
SELECT jobcap.requeue_dead('media', '');
SELECT jobcap.requeue_dead('media', NULL);
SELECT jobcap.purge_dead(NULL);
SELECT jobcap.purge_dead('media', max_jobs => 0);
SELECT jobcap.purge_dead('media', max_jobs => 100000);
SELECT jobcap.purge_dead('media', died_after => now(), died_before => now() - interval '1 day');
SELECT jobcap.purge_dead('media', died_before => 'infinity');
SELECT jobcap.requeue_dead('media', 'why', extra_attempts => 0);

-- The counts never pass a transaction that may still commit a finished job. Another session
-- (dblink) completes a job in a transaction it keeps open; a job completed here after it
-- started is not counted until that transaction ends, then both are, once.
CREATE EXTENSION dblink;
SELECT jobcap.enqueue_job('mail', '{"to": "f@example.org"}') > 0 AS enqueued;
SELECT jobcap.enqueue_job('mail', '{"to": "g@example.org"}') > 0 AS enqueued;
SELECT jobcap.refresh_stats() >= 0 AS caught_up;
SELECT dblink_connect('other', 'dbname=' || current_database());
SELECT dblink_exec('other', 'BEGIN');
SELECT * FROM dblink('other', $$SELECT jobcap.complete_job(job_id, fence)::text
                                 FROM jobcap.claim_job('mail', 'slow-worker')$$) AS t(state text);
SELECT jobcap.complete_job(job_id, fence) FROM jobcap.claim_job('mail', 'quick-worker');
SELECT jobcap.refresh_stats() AS counted_while_open;
SELECT dblink_exec('other', 'COMMIT');
SELECT jobcap.refresh_stats() AS counted_after_commit;
SELECT jobcap.refresh_stats() AS counted_again;
-- An operator role that cannot see other sessions' activity itself still counts them right:
-- the statements run as the tables' owner, who sees every session.
CREATE ROLE stats_reader IN ROLE jobcap_operator;
SELECT jobcap.enqueue_job('mail', '{"to": "h@example.org"}') > 0 AS enqueued;
SELECT jobcap.complete_job(job_id, fence) FROM jobcap.claim_job('mail', 'quick-worker');
SET ROLE stats_reader;
SELECT count(*) > 0 AS other_sessions_hidden FROM pg_stat_activity
 WHERE datname = current_database() AND query = '<insufficient privilege>';
SELECT jobcap.refresh_stats() AS counted_by_the_operator;
RESET ROLE;
SELECT dblink_disconnect('other');
DROP EXTENSION dblink;
DROP ROLE stats_reader;

SELECT jobcap.drop_queue('media', force => true);
SELECT jobcap.drop_queue('mail', force => true);
