-- ALTER EXTENSION jobcap UPDATE (0.1.0 -> 0.2.0) with jobs in flight: 0.2.0's cap rule (the
-- lower of the job's and its queue's, src/spi/cap.hpp) must not take back a budget that
-- requeue_job granted under 0.1.0 (attempts + extra_attempts, which 0.1.0 honoured above the
-- queue's cap): the operator asked for those attempts. A cap given at enqueue is bound by the
-- queue's from now on, as in 0.2.0.
CREATE DATABASE jobcap_upgrade;
\c jobcap_upgrade
SET client_min_messages = error;
CREATE EXTENSION jobcap VERSION '0.1.0';
RESET client_min_messages;
-- As 0.1.0 left them: a queue capped at 3; job 1 died at 3 and was requeued with 2 more
-- attempts (max_attempts 5, a requeued history row); job 2 was enqueued with max_attempts 5 and
-- failed 3 times.
INSERT INTO jobcap.queues (queue, max_attempts, lease, backoff_base, backoff_max)
  VALUES ('up', 3, '5 minutes', '0', '0');
INSERT INTO jobcap.jobs (job_id, queue, attempts, max_attempts, fence)
  VALUES (1, 'up', 3, 5, 13), (2, 'up', 3, 5, 23);
INSERT INTO jobcap.job_errors (job_id, queue, attempt, fence, kind, worker, error)
  VALUES (1, 'up', 3, 13, 'requeued', 'operator', 'upstream fixed'),
         (2, 'up', 3, 23, 'error', 'w', 'boom');
SET client_min_messages = error;
ALTER EXTENSION jobcap UPDATE TO '0.2.0';
RESET client_min_messages;
SELECT job_id, outcome FROM jobcap.reap_jobs() ORDER BY job_id;
SELECT job_id, state, attempts FROM jobcap.jobs ORDER BY job_id;
SELECT job_id, attempt, max_attempts FROM jobcap.claim_job('up', 'w', 10) ORDER BY job_id;
\c contrib_regression
DROP DATABASE jobcap_upgrade;
