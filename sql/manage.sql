-- cancel_job and requeue_job: the operator's hand on one job. Dead and cancelled are left only
-- by requeue_job; nothing leaves succeeded; counters and fences never go back.
\set VERBOSITY default
SELECT setval(pg_get_serial_sequence('jobcap.jobs', 'job_id'), 2000, false) IS NOT NULL AS ids_reset,
       setval('jobcap.fences', 200, false) IS NOT NULL AS fences_reset;
SELECT jobcap.create_queue('ops', max_attempts => 2, backoff_base => '0', backoff_max => '0');

-- A pending job is cancelled at once and is never claimed.
SELECT jobcap.enqueue_job('ops', '{"n": "a"}') AS a \gset
SELECT jobcap.cancel_job(:a);
SELECT jobcap.cancel_job(:a) AS cancelled_again;
SELECT state, finished_at IS NOT NULL AS finished FROM jobcap.jobs WHERE job_id = :a;
SELECT count(*) AS claimed FROM jobcap.claim_job('ops', 'w');

-- A running job is cancelled too; its worker finds out at its next fenced call.
SELECT jobcap.enqueue_job('ops', '{"n": "b"}') AS b \gset
SELECT fence AS fb FROM jobcap.claim_job('ops', 'w') \gset
SELECT jobcap.cancel_job(:b);
SELECT jobcap.heartbeat(:b, :fb);
SELECT jobcap.complete_job(:b, :fb);
\echo :LAST_ERROR_SQLSTATE
SELECT state FROM jobcap.jobs WHERE job_id = :b;
-- The reaper leaves cancelled jobs alone.
UPDATE jobcap.jobs SET lease_expires_at = now() - interval '1 second' WHERE job_id = :b;
SELECT count(*) AS reaped FROM jobcap.reap_jobs();

-- requeue_job brings a cancelled job back with a fresh budget: attempts + the queue's cap.
SELECT jobcap.requeue_job(:a, 'customer asked again');
SELECT state, attempts, max_attempts, finished_at FROM jobcap.jobs WHERE job_id = :a;
SELECT jobcap.requeue_job(:a, 'already pending') AS requeued_pending;

-- A dead job: two failed attempts, then one more by requeue with extra_attempts => 1.
SELECT jobcap.enqueue_job('ops', '{"n": "c"}', priority => -1) AS c \gset
SELECT fence AS fc FROM jobcap.claim_job('ops', 'w') \gset
SELECT jobcap.fail_job(:c, :fc, 'first');
SELECT fence AS fc FROM jobcap.claim_job('ops', 'w') \gset
SELECT jobcap.fail_job(:c, :fc, 'second');
SELECT jobcap.requeue_job(:c, 'upstream fixed', extra_attempts => 1);
SELECT job_id = :c AS is_c, attempt, fence, max_attempts FROM jobcap.claim_job('ops', 'w') \gset
SELECT :'is_c' AS is_c, :attempt AS attempt, :fence AS fence, :max_attempts AS max_attempts;
SELECT jobcap.fail_job(:c, :fence, 'third');
SELECT attempt, fence, kind, worker = current_user AS by_caller, error
  FROM jobcap.job_errors WHERE job_id = :c ORDER BY seq;

-- Nothing leaves succeeded.
SELECT fence AS fa FROM jobcap.claim_job('ops', 'w') \gset
SELECT jobcap.complete_job(:a, :fa);
SELECT jobcap.cancel_job(:a) AS cancel_succeeded;
SELECT jobcap.requeue_job(:a, 'do it again') AS requeue_succeeded;
SELECT state FROM jobcap.jobs WHERE job_id = :a;

-- Unknown jobs are errors, not silent falses.
SELECT jobcap.cancel_job(999999);
SELECT jobcap.requeue_job(999999, 'nothing there');
\echo :LAST_ERROR_SQLSTATE

SELECT jobcap.drop_queue('ops', force => true);
