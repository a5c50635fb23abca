-- The whole life of jobs: queue, enqueue, claim in order, heartbeat, complete, fail and retry.
\set VERBOSITY default
SELECT jobcap.create_queue('mail', backoff_base => '0', backoff_max => '0');
SELECT queue, max_attempts, lease, backoff_base, backoff_max, notify FROM jobcap.queues;

SELECT jobcap.enqueue_job('mail', '{"to": "a@example.com"}') AS a \gset
SELECT jobcap.enqueue_job('mail', '{"to": "b@example.com"}', priority => -1) AS b \gset
SELECT jobcap.enqueue_job('mail', '{"to": "later@example.com"}', run_at => now() + interval '1 hour') AS later \gset
SELECT state, attempts, fence, max_attempts FROM jobcap.jobs WHERE job_id = :a;

-- Claim order: priority (lower first), then run_at, then id. A job scheduled for later waits.
SELECT job_id = :b AS is_b, fence > 0 AS fenced, attempt, max_attempts, payload,
       lease_expires_at > now() + interval '4 minutes' AS leased
  FROM jobcap.claim_job('mail', 'worker-1', batch => 5);
SELECT job_id = :a AS is_a, attempt FROM jobcap.claim_job('mail', 'worker-1', batch => 5);
SELECT count(*) AS nothing_due FROM jobcap.claim_job('mail', 'worker-1', batch => 5);
SELECT job_id, state, attempts, worker, lease FROM jobcap.jobs ORDER BY job_id;
-- Each claim got its own fence (from a sequence, so a rolled-back claim never reuses one).
SELECT fence AS fa FROM jobcap.jobs WHERE job_id = :a \gset
SELECT fence AS fb FROM jobcap.jobs WHERE job_id = :b \gset
SELECT :fa <> :fb AS distinct_fences;

-- A heartbeat extends (never shortens) the lease.
SELECT jobcap.heartbeat(:b, :fb, '2 hours') > now() + interval '119 minutes' AS extended;
SELECT jobcap.heartbeat(:b, :fb, '1 second') > now() + interval '119 minutes' AS not_shortened;

SELECT jobcap.complete_job(:b, :fb);
SELECT state, finished_at IS NOT NULL AS finished, lease_expires_at FROM jobcap.jobs WHERE job_id = :b;

-- A failure goes back to pending (retry_in overrides the backoff), then succeeds.
SELECT jobcap.fail_job(:a, :fa, 'smtp timeout', retry_in => '0');
SELECT state, attempts, run_at <= now() AS due FROM jobcap.jobs WHERE job_id = :a;
SELECT job_id = :a AS is_a, fence AS fa2, attempt FROM jobcap.claim_job('mail', 'worker-2') \gset
SELECT :'is_a' AS is_a, :fa2 > :fa AS newer_fence, :attempt AS attempt;
SELECT jobcap.complete_job(:a, :fa2);
SELECT job_id = :a AS is_a, attempt, kind, worker, error FROM jobcap.job_errors;

-- Backoff: without retry_in a failure waits between half and all of
-- min(backoff_max, backoff_base * 2^(attempt-1)).
SELECT jobcap.create_queue('slow', backoff_base => '10 seconds', backoff_max => '1 minute');
SELECT jobcap.enqueue_job('slow') AS s \gset
SELECT fence FROM jobcap.claim_job('slow', 'w') \gset
SELECT jobcap.fail_job(:s, :fence, 'first');
SELECT run_at - now() BETWEEN interval '5 seconds' AND interval '10 seconds' AS backed_off
  FROM jobcap.jobs WHERE job_id = :s;
SELECT count(*) AS not_yet FROM jobcap.claim_job('slow', 'w');
SELECT bool_and(d BETWEEN interval '30 seconds' AND interval '1 minute') AS capped
  FROM (SELECT jobcap.backoff(10, '10 seconds', '1 minute') AS d FROM generate_series(1, 100)) s;
SELECT bool_and(d >= interval '20 seconds' AND d < interval '40 seconds') AS third_attempt
  FROM (SELECT jobcap.backoff(3, '10 seconds', '1 hour') AS d FROM generate_series(1, 100)) s;

-- Settings can be changed; a queue with live jobs is dropped only with force.
SELECT jobcap.alter_queue('slow', lease => '1 minute', notify => true);
SELECT queue, max_attempts, lease, backoff_base, backoff_max, notify FROM jobcap.queues WHERE queue = 'slow';
SELECT jobcap.drop_queue('slow');
SELECT jobcap.drop_queue('slow', force => true);
SELECT count(*) AS gone FROM jobcap.jobs WHERE queue = 'slow';

-- The views (completions are counted by refresh_stats, which the background worker runs).
SELECT jobcap.refresh_stats() > 0 AS counted;
SELECT queue, pending, scheduled, running, succeeded, dead, cancelled, failed_attempts, failing_jobs
  FROM jobcap.queue_stats ORDER BY queue;

SELECT jobcap.drop_queue('mail', force => true);

-- The extension drops and comes back cleanly, even with plans kept in this session. It leaves
-- nothing behind: the schema keeps no grant, so its roles can be dropped (CREATE EXTENSION
-- makes them again). Fences handed out before the drop are never handed out again.
SELECT last_value AS fence_before_drop FROM jobcap.fences \gset
SELECT :fence_before_drop > 0 AS fences_were_handed_out;
DROP EXTENSION jobcap;
SELECT nspacl FROM pg_namespace WHERE nspname = 'jobcap';
DROP ROLE jobcap_worker, jobcap_operator;
CREATE EXTENSION jobcap;
SELECT count(*) AS roles_again FROM pg_roles WHERE rolname IN ('jobcap_worker', 'jobcap_operator');
SELECT jobcap.create_queue('again');
SELECT jobcap.enqueue_job('again');
SELECT fence > :fence_before_drop AS fence_above_every_earlier, attempt
  FROM jobcap.claim_job('again', 'w');
SELECT jobcap.drop_queue('again', force => true);
