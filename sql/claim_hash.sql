-- The claim index's first key is hashtextextended(queue, 0), a 64-bit hash of the queue's name;
-- every claim compares the name too. Two queues, the other's jobs ahead in claim order: every
-- claim, on either path, hands out its own queue's jobs only, in its own order. (The 32-bit
-- hashtext of 'q7169' and 'q122757' is the same, a collision the 64-bit hash does not have.)
\set VERBOSITY terse
SELECT pg_catalog.hashtext('q7169') = pg_catalog.hashtext('q122757') AS same_hash32,
       pg_catalog.hashtextextended('q7169', 0) = pg_catalog.hashtextextended('q122757', 0) AS same_hash64;
SELECT jobcap.create_queue('q7169', max_attempts => 3);
SELECT jobcap.create_queue('q122757', max_attempts => 3);
-- The other queue's jobs first in claim order: higher priority (lower number) and older.
-- Enqueued on the direct path (regress_sql runs every suite with jobcap.hot_path = sql), which
-- evaluates the index's expression itself.
SET jobcap.hot_path = direct;
SELECT count(*) FROM (SELECT jobcap.enqueue_job('q122757', jsonb_build_object('n', n), priority => -1)
                        FROM generate_series(1, 4) n) e;
SELECT count(*) FROM (SELECT jobcap.enqueue_job('q7169', jsonb_build_object('n', n), priority => p)
                        FROM generate_series(1, 6) n, LATERAL (SELECT 3 - n % 3 AS p) pr) e;
-- And a row inserted by hand.
INSERT INTO jobcap.jobs (queue, priority, payload) VALUES ('q7169', 0, '{"n": "by hand"}');
-- Every pending job is in the claim index under its queue's hash.
SET enable_seqscan = off;
SET enable_bitmapscan = off;
EXPLAIN (COSTS OFF) SELECT count(*) FROM jobcap.jobs
  WHERE pg_catalog.hashtextextended(queue, 0) = pg_catalog.hashtextextended('q7169', 0)
    AND state = 'pending';
SELECT q, (SELECT count(*) FROM jobcap.jobs
            WHERE pg_catalog.hashtextextended(queue, 0) = pg_catalog.hashtextextended(q, 0)
              AND queue = q AND state = 'pending')
  FROM unnest('{q7169,q122757}'::text[]) q;
RESET enable_seqscan;
RESET enable_bitmapscan;

-- Claims in batches of two on each path in turn: only q7169's jobs, by priority, run_at, job_id.
SET client_min_messages = debug2;
SELECT j.queue, c.payload->>'n' AS n, j.priority FROM jobcap.claim_job('q7169', 'w', 2) c
  JOIN jobcap.jobs j USING (job_id) ORDER BY j.priority, j.run_at, j.job_id;
RESET client_min_messages;
SET jobcap.hot_path = sql;
SELECT j.queue, c.payload->>'n' AS n, j.priority FROM jobcap.claim_job('q7169', 'w', 2) c
  JOIN jobcap.jobs j USING (job_id) ORDER BY j.priority, j.run_at, j.job_id;
SET jobcap.hot_path = direct;
SET client_min_messages = debug2;
SELECT j.queue, c.payload->>'n' AS n, j.priority FROM jobcap.claim_job('q7169', 'w', 5) c
  JOIN jobcap.jobs j USING (job_id) ORDER BY j.priority, j.run_at, j.job_id;
RESET client_min_messages;
-- q7169 is empty on both paths; q122757's jobs are all still pending.
SELECT count(*) FROM jobcap.claim_job('q7169', 'w', 5);
SET jobcap.hot_path = sql;
SELECT count(*) FROM jobcap.claim_job('q7169', 'w', 5);
SELECT queue, state, count(*) FROM jobcap.jobs WHERE queue IN ('q7169', 'q122757')
  GROUP BY queue, state ORDER BY queue, state;
-- And the other queue gets its own, on both paths.
SELECT count(*) FROM jobcap.claim_job('q122757', 'w', 2);
SET jobcap.hot_path = direct;
SELECT count(*) FROM jobcap.claim_job('q122757', 'w', 5);
SELECT queue, state, count(*) FROM jobcap.jobs WHERE queue IN ('q7169', 'q122757')
  GROUP BY queue, state ORDER BY queue, state;

-- Queue counts and purges find their queue through the same key.
SELECT count(*) FROM (SELECT jobcap.enqueue_job(q, '{}') FROM unnest('{q7169,q122757,q122757}'::text[]) q) e;
SELECT ready, scheduled, running FROM jobcap.queue_depth('q7169');
SELECT jobcap.purge_pending('q122757');
SELECT queue, state, count(*) FROM jobcap.jobs WHERE queue IN ('q7169', 'q122757')
  GROUP BY queue, state ORDER BY queue, state;

-- A claim index keyed otherwise sends every call to the SQL path: on the queue's name (0.1.0's),
-- on its hash under another collation or with another seed, on its 32-bit hash; so does
-- another index on an expression.
BEGIN;
DROP INDEX jobcap.jobs_claim;
CREATE INDEX jobs_claim ON jobcap.jobs (queue, priority, run_at, job_id) WHERE state = 'pending';
SET LOCAL client_min_messages = debug2;
SELECT count(*) FROM jobcap.claim_job('q7169', 'w');
ROLLBACK;
BEGIN;
DROP INDEX jobcap.jobs_claim;
CREATE INDEX jobs_claim ON jobcap.jobs (pg_catalog.hashtextextended(queue COLLATE "C", 0),
  priority, run_at, job_id) WHERE state = 'pending';
SET LOCAL client_min_messages = debug2;
SELECT count(*) FROM jobcap.claim_job('q7169', 'w');
ROLLBACK;
BEGIN;
DROP INDEX jobcap.jobs_claim;
CREATE INDEX jobs_claim ON jobcap.jobs (pg_catalog.hashtextextended(queue, 1), priority, run_at, job_id)
  WHERE state = 'pending';
SET LOCAL client_min_messages = debug2;
SELECT count(*) FROM jobcap.claim_job('q7169', 'w');
ROLLBACK;
BEGIN;
DROP INDEX jobcap.jobs_claim;
CREATE INDEX jobs_claim ON jobcap.jobs (pg_catalog.hashtext(queue), priority, run_at, job_id)
  WHERE state = 'pending';
SET LOCAL client_min_messages = debug2;
SELECT count(*) FROM jobcap.claim_job('q7169', 'w');
ROLLBACK;
BEGIN;
CREATE INDEX jobs_worker_hash ON jobcap.jobs (pg_catalog.hashtext(worker));
SET LOCAL client_min_messages = debug2;
SELECT count(*) FROM jobcap.enqueue_jobs('q7169', ARRAY['{}'::jsonb]);
ROLLBACK;
SET client_min_messages = debug2;
SELECT count(*) FROM jobcap.enqueue_jobs('q7169', ARRAY['{}'::jsonb]);
SELECT count(*) FROM jobcap.claim_job('q7169', 'w', 5);
RESET client_min_messages;
SELECT jobcap.drop_queue('q7169', force => true), jobcap.drop_queue('q122757', force => true);

-- The claim index's expression (like every index predicate) is compiled as the tables' owner,
-- whom the SQL path's statements run as: a worker who may not execute hashtextextended itself
-- (a DBA revoked it from PUBLIC) is served on the direct path as on the SQL path. Each part below
-- learns the indexes anew (a rolled-back CREATE INDEX forgets them) under the worker's role.
SELECT jobcap.create_queue('hash_acl');
CREATE ROLE regress_hash_worker IN ROLE jobcap_worker;
SELECT jobcap.grant_queue('hash_acl', 'regress_hash_worker');
REVOKE EXECUTE ON FUNCTION pg_catalog.hashtextextended(text, bigint) FROM PUBLIC;
SET jobcap.hot_path = sql;
SET ROLE regress_hash_worker;
SELECT count(*) FROM jobcap.enqueue_jobs('hash_acl', ARRAY['{}'::jsonb]);
RESET ROLE;
SET jobcap.hot_path = direct;
BEGIN;
CREATE INDEX jobs_relearn ON jobcap.jobs (job_id);
ROLLBACK;
SET ROLE regress_hash_worker;
SET client_min_messages = debug2;
SELECT count(*) FROM jobcap.enqueue_jobs('hash_acl', ARRAY['{}'::jsonb]);
SELECT job_id AS acl_job, fence AS acl_fence FROM jobcap.claim_job('hash_acl', 'w') \gset
SELECT jobcap.heartbeat(:acl_job, :acl_fence) IS NOT NULL AS extended;
-- (Which path fail_job takes is not what this suite checks: its DEBUG2 line is left out.)
RESET client_min_messages;
SELECT jobcap.fail_job(:acl_job, :acl_fence, 'once more', '0 s');
SET client_min_messages = debug2;
SELECT job_id AS acl_a, fence AS acl_fa FROM jobcap.claim_job('hash_acl', 'w') \gset
RESET client_min_messages;
RESET ROLE;
BEGIN;
CREATE INDEX jobs_relearn ON jobcap.jobs (job_id);
ROLLBACK;
SET ROLE regress_hash_worker;
SET client_min_messages = debug2;
SELECT job_id AS acl_b, fence AS acl_fb FROM jobcap.claim_job('hash_acl', 'w') \gset
SELECT jobcap.complete_job(:acl_a, :acl_fa), jobcap.complete_job(:acl_b, :acl_fb);
RESET client_min_messages;
RESET ROLE;
GRANT EXECUTE ON FUNCTION pg_catalog.hashtextextended(text, bigint) TO PUBLIC;
SELECT queue, state, count(*) FROM jobcap.jobs WHERE queue = 'hash_acl' GROUP BY queue, state;
SELECT jobcap.drop_queue('hash_acl', force => true);
DROP ROLE regress_hash_worker;
