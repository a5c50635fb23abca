-- Periodic jobs: schedule_job, the schedules view, run_schedules (what the background worker
-- runs each cycle), unschedule_job. Times are checked relative to now(): slots are minutes, UTC.
\set VERBOSITY terse
SET timezone = 'UTC';
SELECT jobcap.create_queue('periodic');

-- cron_next: the first slot after a time.
SELECT jobcap.cron_next('*/15 * * * *', '2026-12-01 15:07:30+00') AS every_15,
       jobcap.cron_next('0 9 * * mon-fri', '2026-12-04 10:00+00') AS weekdays_at_9,
       jobcap.cron_next('0 0 13 * fri', '2026-12-01 00:00+00') AS the_13th_or_a_friday,
       jobcap.cron_next('@monthly', '2026-12-01 00:00+00') AS monthly,
       jobcap.cron_next('0 12 29 feb *', '2026-03-01 00:00+00') AS leap_day;
-- Slots far apart, and the end of time: 29 February on a Sunday comes 40 years after 2088 (2100
-- is not a leap year); past the last representable minute there is no next slot (NULL, not an
-- error, so the schedules view still shows every row).
SELECT jobcap.cron_next('0 0 29 2 */7', '2088-03-01 00:00+00') AS sunday_leap_day,
       jobcap.cron_next('* * * * *', '294276-12-31 23:58:00+00') AS the_last_minute,
       jobcap.cron_next('* * * * *', '294276-12-31 23:59:00+00') AS after_the_last,
       jobcap.cron_next('@yearly', '294276-06-01 00:00+00') AS yearly_past_the_end,
       jobcap.cron_next('* * * * *', 'infinity') AS after_infinity,
       jobcap.cron_next('0 0 1 1 *', '-infinity') AS from_the_beginning;
-- Bad expressions: 22023, saying what is wrong.
\set VERBOSITY default
SELECT jobcap.cron_next('61 * * * *', now());
\set VERBOSITY terse
SELECT jobcap.cron_next('* * * *', now());
SELECT jobcap.cron_next('0 0 30 2 *', now());
SELECT jobcap.cron_next('* * * * mon-', now());
SELECT jobcap.schedule_job('bad', 'every minute', 'periodic');
\echo :LAST_ERROR_SQLSTATE
SELECT jobcap.schedule_job('nowhere', '* * * * *', 'no_such_queue');
\echo :LAST_ERROR_SQLSTATE
SELECT jobcap.schedule_job(NULL, '* * * * *', 'periodic');
SELECT jobcap.schedule_job('tick', NULL, 'periodic');

-- One transaction from here on, so that now() (the time run_schedules goes by) stays put.
BEGIN;
-- A schedule's first slot is the next minute.
SELECT jobcap.schedule_job('tick', '* * * * *', 'periodic', '{"task": "tick"}', priority => 3)
       = date_trunc('minute', now()) + interval '1 minute' AS first_slot_is_next_minute;
SELECT name, cron, queue, payload, priority, next_run > now() AS next_ahead,
       last_slot = date_trunc('minute', now()) AS last_slot_now, last_run_at, last_job_id,
       skipped
  FROM jobcap.schedules;
SELECT jobcap.run_schedules() AS nothing_due_yet;

-- Slots missed while nothing ran (ten minutes of them): only the latest is enqueued, once.
UPDATE jobcap.job_schedules SET last_slot = date_trunc('minute', now()) - interval '10 minutes';
SELECT jobcap.run_schedules() AS enqueued;
SELECT jobcap.run_schedules() AS enqueued_again;
SELECT queue, payload, priority, dedupe_key, run_at = date_trunc('minute', now()) AS run_at_slot
  FROM jobcap.jobs WHERE queue = 'periodic';
SELECT last_slot = date_trunc('minute', now()) AS last_slot_now, last_run_at IS NOT NULL AS ran,
       last_job_id = (SELECT job_id FROM jobcap.jobs WHERE queue = 'periodic') AS last_job,
       last_job_state, skipped
  FROM jobcap.schedules;

-- A slow job holds the schedule's dedupe key: the next slot is skipped, not piled up.
UPDATE jobcap.job_schedules SET last_slot = last_slot - interval '1 minute';
SELECT jobcap.run_schedules() AS enqueued_while_pending;
SELECT count(*) AS jobs FROM jobcap.jobs WHERE queue = 'periodic';
SELECT skipped, last_slot = date_trunc('minute', now()) AS slot_consumed FROM jobcap.schedules;
-- Once it finished, the next slot enqueues again.
SELECT job_id, fence FROM jobcap.claim_job('periodic', 'w') \gset
SELECT jobcap.complete_job(:job_id, :fence);
UPDATE jobcap.job_schedules SET last_slot = last_slot - interval '1 minute';
SELECT jobcap.run_schedules() AS enqueued_after_success;
SELECT state, count(*) FROM jobcap.jobs WHERE queue = 'periodic' GROUP BY state ORDER BY state;

-- Replacing a schedule keeps its last slot: the slot it handled is not enqueued again.
SELECT jobcap.schedule_job('tick', '*/5 * * * *', 'periodic', '{"task": "tock"}') > now() AS replaced;
SELECT cron, payload, priority, last_slot = date_trunc('minute', now()) AS same_last_slot
  FROM jobcap.schedules;
SELECT jobcap.run_schedules() AS enqueued_after_replace;

-- unschedule_job; dropping the queue drops its schedules.
SELECT jobcap.unschedule_job('tick') AS removed, jobcap.unschedule_job('tick') AS removed_again;
SELECT jobcap.schedule_job('daily', '@daily', 'periodic') IS NOT NULL AS scheduled;
-- A schedule whose last slot is the end of time has no next run; the view still shows it.
UPDATE jobcap.job_schedules SET last_slot = '294276-12-31 23:59:00+00' WHERE name = 'daily';
SELECT name, next_run FROM jobcap.schedules;
SELECT jobcap.drop_queue('periodic', force => true);
SELECT count(*) AS schedules_left FROM jobcap.schedules;
COMMIT;
