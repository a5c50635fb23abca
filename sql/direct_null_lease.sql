-- jobcap.queues.lease made nullable by a DBA and set to NULL: a direct claim copies the queue's
-- lease (datumCopy of a NULL pointer) before it looks at the NULL flag, and crashes the server
-- even when the claim passes its own lease. The SQL path claims (coalesce($3, q.lease)).
-- (Last in REGRESS: on the direct path it crashes the server.)
\set VERBOSITY terse
SELECT jobcap.create_queue('null_lease', max_attempts => 3);
SELECT jobcap.enqueue_job('null_lease') > 0 AS enqueued;
ALTER TABLE jobcap.queues ALTER COLUMN lease DROP NOT NULL;
UPDATE jobcap.queues SET lease = NULL WHERE queue = 'null_lease';
SELECT count(*) AS claimed FROM jobcap.claim_job('null_lease', 'w', lease => '1 minute');
UPDATE jobcap.queues SET lease = '5 minutes' WHERE queue = 'null_lease';
ALTER TABLE jobcap.queues ALTER COLUMN lease SET NOT NULL;
SELECT jobcap.drop_queue('null_lease', force => true);
