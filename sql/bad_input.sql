-- Bad input gets a clear error with a fitting SQLSTATE, never XX000, and writes nothing.
\set VERBOSITY terse
SELECT setval(pg_get_serial_sequence('jobcap.jobs', 'job_id'), 3000, false) IS NOT NULL AS ids_reset,
       setval('jobcap.fences', 300, false) IS NOT NULL AS fences_reset;
SELECT jobcap.create_queue('ok');

-- Names
SELECT jobcap.create_queue(NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT jobcap.create_queue('');
\echo :LAST_ERROR_SQLSTATE
SELECT jobcap.create_queue(repeat('q', 129));
\echo :LAST_ERROR_SQLSTATE
SELECT jobcap.create_queue(repeat('q', 10000));
SELECT jobcap.create_queue(E'new\nline');
\echo :LAST_ERROR_SQLSTATE
SELECT jobcap.create_queue('ok');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM jobcap.claim_job('ok', NULL);
SELECT * FROM jobcap.claim_job('ok', '');
SELECT * FROM jobcap.claim_job('ok', repeat('w', 257));

-- Unknown queue or job
SELECT jobcap.enqueue_job('missing');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM jobcap.claim_job('missing', 'w');
SELECT jobcap.alter_queue('missing', max_attempts => 3);
SELECT jobcap.drop_queue('missing');
SELECT * FROM jobcap.claim_job_by_id(424242, 'w');
\echo :LAST_ERROR_SQLSTATE
SELECT jobcap.complete_job(424242, 1);
SELECT jobcap.fail_job(424242, 1, 'x');
SELECT jobcap.heartbeat(424242, 1);
SELECT jobcap.assert_fence(424242, 1);
\echo :LAST_ERROR_SQLSTATE

-- Counts, caps and leases
SELECT jobcap.create_queue('bad', max_attempts => 0);
\echo :LAST_ERROR_SQLSTATE
SELECT jobcap.create_queue('bad', max_attempts => -1);
SELECT jobcap.create_queue('bad', max_attempts => 2000000);
\echo :LAST_ERROR_SQLSTATE
SELECT jobcap.create_queue('bad', lease => '0');
SELECT jobcap.create_queue('bad', lease => '-5 minutes');
SELECT jobcap.create_queue('bad', lease => '1 month -31 days');
SELECT jobcap.create_queue('bad', lease => '100 years');
SELECT jobcap.create_queue('bad', lease => NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT jobcap.create_queue('bad', backoff_base => '-1 second');
SELECT jobcap.create_queue('bad', backoff_base => '2 hours', backoff_max => '1 hour');
SELECT jobcap.create_queue('bad', notify => NULL);
SELECT jobcap.alter_queue('ok', backoff_base => '2 hours');
SELECT jobcap.alter_queue('ok', lease => '0');
SELECT * FROM jobcap.claim_job('ok', 'w', 0);
SELECT * FROM jobcap.claim_job('ok', 'w', -1);
SELECT * FROM jobcap.claim_job('ok', 'w', 1000000);
SELECT * FROM jobcap.claim_job('ok', 'w', NULL);
SELECT * FROM jobcap.claim_job('ok', 'w', 1, '0');
SELECT * FROM jobcap.reap_jobs(0);
SELECT * FROM jobcap.reap_jobs(NULL);

-- enqueue_job arguments
SELECT jobcap.enqueue_job('ok', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT jobcap.enqueue_job('ok', '{}', NULL);
SELECT jobcap.enqueue_job('ok', '{}', 'infinity');
SELECT jobcap.enqueue_job('ok', '{}', now(), NULL);
SELECT jobcap.enqueue_job('ok', '{}', now(), 0, 0);
SELECT jobcap.enqueue_job('ok', '{}', now(), 0, NULL, '');
SELECT jobcap.enqueue_job('ok', '{}', now(), 0, NULL, repeat('k', 1025));

-- Fenced calls
SELECT jobcap.enqueue_job('ok') AS job \gset
SELECT fence FROM jobcap.claim_job('ok', 'w') \gset
SELECT jobcap.complete_job(NULL, :fence);
SELECT jobcap.complete_job(:job, NULL);
SELECT jobcap.complete_job(0, 1);
SELECT jobcap.complete_job(-7, 1);
SELECT jobcap.fail_job(:job, :fence, 'x', retry_in => '-1 second');
SELECT jobcap.heartbeat(:job, :fence, '0');
SELECT jobcap.heartbeat(:job, :fence, '11 years');
SELECT jobcap.requeue_job(:job, NULL);
SELECT jobcap.requeue_job(:job, '');
SELECT jobcap.requeue_job(:job, 'why', 0);
SELECT jobcap.cancel_job(NULL);
SELECT jobcap.backoff(NULL, '1 second', '1 hour');
SELECT jobcap.backoff(1, '-1 second', '1 hour');
SELECT jobcap.drop_queue('ok', NULL);

-- drop_queue needs READ COMMITTED: a later snapshot could miss jobs enqueued meanwhile.
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT jobcap.drop_queue('ok', force => true);
ROLLBACK;
\echo :LAST_ERROR_SQLSTATE

-- Nothing was written by any of the failures above, and the job is still intact.
SELECT count(*) AS queues FROM jobcap.queues;
SELECT count(*) AS jobs, min(state::text) AS state, min(fence) AS fence FROM jobcap.jobs;
SELECT jobcap.complete_job(:job, :fence);
SELECT jobcap.drop_queue('ok');
