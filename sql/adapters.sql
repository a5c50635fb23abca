-- What the Celery and Django-Q adapters call: give_up_job, queue_depth, purge_pending, and the
-- wake-ups of fail_job (retry) and requeue_job on a queue with notify.
-- Errors show their SQLSTATE (and, where no job id is in it, the message too).
\set VERBOSITY terse
SELECT jobcap.create_queue('rejects', max_attempts => 5, backoff_base => '0', backoff_max => '0',
                           notify => true);

-- give_up_job: a worker ends its running job now. Dead at once, this attempt was the last, the
-- reason kept in history; the budget it had left is gone.
SELECT jobcap.enqueue_job('rejects', '{"n": 1}') AS j1 \gset
SELECT fence AS f1 FROM jobcap.claim_job('rejects', 'w1') \gset
SELECT jobcap.give_up_job(:j1, :f1, 'corrupt input: cannot decode');
SELECT state, attempts, max_attempts, lease_expires_at IS NULL AS no_lease
  FROM jobcap.jobs WHERE job_id = :j1;
SELECT attempt, kind, worker, error FROM jobcap.job_errors WHERE job_id = :j1 ORDER BY seq;
-- Fenced: a second call, or one with an old fence, is a stale fence (JC001).
\set VERBOSITY sqlstate
SELECT jobcap.give_up_job(:j1, :f1, 'again');
\set VERBOSITY terse
-- Dead is quiet: nothing claims it, the reaper leaves it.
SELECT count(*) AS claimed FROM jobcap.claim_job('rejects', 'w2');
SELECT count(*) AS reaped FROM jobcap.reap_jobs();
-- requeue_job raises the budget from the attempts counted.
SELECT jobcap.requeue_job(:j1, 'decoder fixed', 2);
SELECT state, attempts, max_attempts FROM jobcap.jobs WHERE job_id = :j1;

-- A reclaimed job's old fence cannot give it up.
SELECT fence AS f2 FROM jobcap.claim_job('rejects', 'w1') \gset
UPDATE jobcap.jobs SET lease_expires_at = now() - interval '1 second' WHERE job_id = :j1;
SELECT outcome FROM jobcap.reap_jobs();
SELECT fence AS f3 FROM jobcap.claim_job('rejects', 'w2') \gset
\set VERBOSITY sqlstate
SELECT jobcap.give_up_job(:j1, :f2, 'from the old lease');
\set VERBOSITY terse
SELECT jobcap.give_up_job(:j1, :f3, 'from the current lease');
SELECT state, attempts, max_attempts FROM jobcap.jobs WHERE job_id = :j1;

-- Bad input: 22004 null, 22023 bad value, 42704 no such job or queue.
\set VERBOSITY sqlstate
SELECT jobcap.give_up_job(NULL, 1, 'x');
SELECT jobcap.give_up_job(0, 1, 'x');
SELECT jobcap.give_up_job(:j1, NULL, 'x');
SELECT jobcap.give_up_job(:j1, :f3, NULL);
SELECT jobcap.give_up_job(:j1, :f3, '');
SELECT jobcap.give_up_job(999999, 1, 'x');
\set VERBOSITY terse

-- queue_depth: ready (due), scheduled (later), running.
SELECT jobcap.create_queue('depth', max_attempts => 1);
SELECT count(jobcap.enqueue_job('depth', '{}')) AS enqueued FROM generate_series(1, 3);
SELECT jobcap.enqueue_job('depth', '{}', now() + interval '1 hour') > 0 AS enqueued;
SELECT count(*) AS claimed FROM jobcap.claim_job('depth', 'w1');
SELECT * FROM jobcap.queue_depth('depth');
\set VERBOSITY sqlstate
SELECT jobcap.queue_depth(NULL);
SELECT jobcap.queue_depth('');
SELECT jobcap.queue_depth('no such queue');
\set VERBOSITY terse
SELECT jobcap.queue_depth('no such queue');

-- purge_pending: pending jobs only (ready and scheduled), in batches; running jobs settle.
SELECT jobcap.purge_pending('depth', 2);
SELECT * FROM jobcap.queue_depth('depth');
SELECT jobcap.purge_pending('depth');
SELECT * FROM jobcap.queue_depth('depth');
\set VERBOSITY sqlstate
SELECT jobcap.purge_pending('depth', 0);
SELECT jobcap.purge_pending('depth', 10001);
SELECT jobcap.purge_pending(NULL);
SELECT jobcap.purge_pending('no such queue');
\set VERBOSITY terse
SELECT jobcap.purge_pending('depth', 0);

-- Who may call them: a worker of a granted queue may give up and read depth, not purge; a
-- worker of another queue gets 42501.
CREATE ROLE adapters_worker LOGIN IN ROLE jobcap_worker;
CREATE ROLE adapters_other LOGIN IN ROLE jobcap_worker;
SELECT jobcap.grant_queue('rejects', 'adapters_worker');
SELECT jobcap.enqueue_job('rejects', '{"n": 2}') AS j2 \gset
SET ROLE adapters_worker;
SELECT fence AS f4 FROM jobcap.claim_job('rejects', 'w3') \gset
SELECT * FROM jobcap.queue_depth('rejects');
SELECT jobcap.purge_pending('rejects');
SET ROLE adapters_other;
SELECT jobcap.queue_depth('rejects');
\set VERBOSITY sqlstate
SELECT jobcap.give_up_job(:j2, :f4, 'not mine');
\set VERBOSITY terse
SET ROLE adapters_worker;
SELECT jobcap.give_up_job(:j2, :f4, 'mine');
RESET ROLE;
SELECT has_function_privilege('public', 'jobcap.give_up_job(bigint, bigint, text)', 'EXECUTE') AS public_give_up,
       has_function_privilege('jobcap_operator', 'jobcap.purge_pending(text, integer)', 'EXECUTE') AS operator_purge,
       has_function_privilege('jobcap_worker', 'jobcap.purge_pending(text, integer)', 'EXECUTE') AS worker_purge;

SELECT jobcap.drop_queue(q, force => true) FROM (VALUES ('rejects'), ('depth')) v(q);
DROP ROLE adapters_worker;
DROP ROLE adapters_other;
