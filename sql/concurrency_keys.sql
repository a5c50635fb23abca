-- Per-key concurrency and fairness (issue 36): concurrency_key on enqueue_job and
-- enqueue_jobs, create_queue/alter_queue max_running_per_key and fairness. Claims past a key's
-- limit return fewer or no rows, never an error.
\set VERBOSITY terse
SELECT jobcap.create_queue('ck', max_running_per_key => 2, backoff_base => '0', backoff_max => '0');
SELECT max_running_per_key, fairness FROM jobcap.queues WHERE queue = 'ck';
-- Tenant a: 5 jobs, b: 3 jobs, and 2 jobs without a key (never limited per key).
SELECT count(jobcap.enqueue_job('ck', jsonb_build_object('n', n), priority => n,
                                concurrency_key => 'a')) FROM generate_series(1, 5) n;
SELECT jobcap.enqueue_jobs('ck', ARRAY['{"n": 6}', '{"n": 7}', '{"n": 8}', '{"n": 9}',
                                       '{"n": 10}']::jsonb[], priority => 10,
                           concurrency_keys => ARRAY['b', 'b', 'b', NULL, NULL]) IS NOT NULL AS enqueued;
SELECT concurrency_key, count(*) FROM jobcap.jobs WHERE queue = 'ck'
 GROUP BY 1 ORDER BY 1 NULLS LAST;

-- One batch of 10 takes 2 of a, 2 of b and both jobs without a key.
SELECT j.concurrency_key, count(*)
  FROM jobcap.claim_job('ck', 'w', 10) c JOIN jobcap.jobs j USING (job_id)
 GROUP BY 1 ORDER BY 1 NULLS LAST;
-- Every key is at its limit: nothing more, without an error (batch and by id).
SELECT count(*) AS claimed FROM jobcap.claim_job('ck', 'w', 10);
SELECT count(*) AS claimed_by_id
  FROM jobcap.claim_job_by_id((SELECT min(job_id) FROM jobcap.jobs
                                WHERE queue = 'ck' AND state = 'pending'
                                  AND concurrency_key = 'a'), 'w');

-- Completing a job of a frees a slot of a only; complete_and_claim takes it.
SELECT count(*) AS claimed_next, min(j.concurrency_key) AS key
  FROM jobcap.complete_and_claim(
         (SELECT min(job_id) FROM jobcap.jobs WHERE queue = 'ck' AND state = 'running'
             AND concurrency_key = 'a'),
         (SELECT fence FROM jobcap.jobs WHERE job_id = (SELECT min(job_id) FROM jobcap.jobs
             WHERE queue = 'ck' AND state = 'running' AND concurrency_key = 'a')),
         'ck', 'w', 10) c JOIN jobcap.jobs j USING (job_id);
-- Failing a job of b frees a slot of b (the retry is due at once: backoff 0).
SELECT jobcap.fail_job(job_id, fence, 'boom') FROM jobcap.jobs
 WHERE job_id = (SELECT min(job_id) FROM jobcap.jobs WHERE queue = 'ck' AND state = 'running'
                    AND concurrency_key = 'b');
SELECT count(*) AS claimed_by_id, min(j.concurrency_key) AS key
  FROM jobcap.claim_job_by_id((SELECT max(job_id) FROM jobcap.jobs
                                WHERE queue = 'ck' AND state = 'pending'
                                  AND concurrency_key = 'b'), 'w') c
  JOIN jobcap.jobs j USING (job_id);
SELECT concurrency_key, count(*) FILTER (WHERE state = 'running') AS running,
       count(*) FILTER (WHERE state = 'pending') AS pending
  FROM jobcap.jobs WHERE queue = 'ck' GROUP BY 1 ORDER BY 1 NULLS LAST;

-- A claim that rolls back frees what it took.
SELECT jobcap.alter_queue('ck', max_running_per_key => 3);
BEGIN;
SELECT count(*) AS claimed_then_rolled_back FROM jobcap.claim_job('ck', 'w', 10);
ROLLBACK;
SELECT count(*) AS claimed FROM jobcap.claim_job('ck', 'w', 10);
SELECT count(*) AS claimed FROM jobcap.claim_job('ck', 'w', 10);

-- max_running still caps the queue as a whole.
SELECT jobcap.alter_queue('ck', max_running_per_key => 10, max_running => 7);
SELECT count(*) FILTER (WHERE state = 'running') AS running FROM jobcap.jobs WHERE queue = 'ck';
SELECT count(*) AS claimed FROM jobcap.claim_job('ck', 'w', 10);
SELECT count(*) FILTER (WHERE state = 'running') AS running FROM jobcap.jobs WHERE queue = 'ck';

-- max_running_per_key => 0 removes the limit (NULL keeps it); the claim is the open one again.
SELECT jobcap.alter_queue('ck', max_attempts => 5);
SELECT max_running, max_running_per_key, fairness FROM jobcap.queues WHERE queue = 'ck';
SELECT jobcap.alter_queue('ck', max_running_per_key => 0, max_running => 0);
SELECT max_running, max_running_per_key, fairness FROM jobcap.queues WHERE queue = 'ck';
SELECT count(*) AS claimed_unlimited FROM jobcap.claim_job('ck', 'w', 10);

-- Round-robin: a key with 5 jobs enqueued after another's 500 gets all 5 within the first 10
-- claims (batch 1 and batch 4), where fifo gives it none of them.
SELECT jobcap.create_queue('rr', fairness => 'round_robin');
SELECT jobcap.create_queue('ff');
SELECT count(*) FROM (
  SELECT jobcap.enqueue_jobs(q, array_agg('{}'::jsonb), concurrency_keys => array_agg(k))
    FROM (VALUES ('rr'), ('ff')) v(q),
         LATERAL (SELECT 'big' AS k FROM generate_series(1, 500)
                  UNION ALL SELECT 'small' FROM generate_series(1, 5)) k
   GROUP BY q) e;
CREATE TEMP TABLE claims (queue text, n int, key text);
DO $$
BEGIN
    FOR i IN 1..10 LOOP
        INSERT INTO claims SELECT 'rr', i, j.concurrency_key
          FROM jobcap.claim_job('rr', 'w', 1) c JOIN jobcap.jobs j USING (job_id);
        INSERT INTO claims SELECT 'ff', i, j.concurrency_key
          FROM jobcap.claim_job('ff', 'w', 1) c JOIN jobcap.jobs j USING (job_id);
    END LOOP;
END
$$;
SELECT queue, string_agg(key, ' ' ORDER BY n) AS keys_in_claim_order FROM claims
 GROUP BY queue ORDER BY queue;
-- A batch takes one job per key in turn, starting after the key the last claim ended on
-- (small, whose jobs are all running now: big, then late, twice; the turn ends on late).
SELECT last_key FROM jobcap.queue_turns WHERE queue = 'rr';
SELECT jobcap.enqueue_jobs('rr', array_fill('{}'::jsonb, ARRAY[3]),
                           concurrency_keys => array_fill('late'::text, ARRAY[3])) IS NOT NULL;
SELECT j.concurrency_key, count(*)
  FROM jobcap.claim_job('rr', 'w', 4) c JOIN jobcap.jobs j USING (job_id) GROUP BY 1 ORDER BY 1;
SELECT last_key FROM jobcap.queue_turns WHERE queue = 'rr';
-- Jobs without a key take only the room the keys leave: after late, big then late again (the
-- turn ends on late), while the two jobs without a key wait.
SELECT jobcap.enqueue_jobs('rr', array_fill('{}'::jsonb, ARRAY[2])) IS NOT NULL;
SELECT string_agg(coalesce(j.concurrency_key, '(none)'), ' ' ORDER BY c.job_id) AS keys
  FROM jobcap.claim_job('rr', 'w', 2) c JOIN jobcap.jobs j USING (job_id);
SELECT last_key FROM jobcap.queue_turns WHERE queue = 'rr';
-- A key's due jobs all claimed, the rest of the batch goes to the jobs without a key: a key
-- with 2 jobs and 3 jobs without one, a claim of 4 takes the key's 2 and then 2 without one,
-- and the turn stays on the key.
SELECT jobcap.create_queue('rn', fairness => 'round_robin');
SELECT jobcap.enqueue_jobs('rn', array_fill('{}'::jsonb, ARRAY[5]),
                           concurrency_keys => ARRAY[NULL, 'a', NULL, 'a', NULL]) IS NOT NULL;
SELECT string_agg(coalesce(j.concurrency_key, '(none)'), ' ' ORDER BY c.job_id) AS keys
  FROM jobcap.claim_job('rn', 'w', 4) c JOIN jobcap.jobs j USING (job_id);
SELECT last_key FROM jobcap.queue_turns WHERE queue = 'rn';

-- Round-robin with a per-key limit: the keys at their limit wait, the others take turns.
SELECT jobcap.create_queue('rk', fairness => 'round_robin', max_running_per_key => 1);
SELECT jobcap.enqueue_jobs('rk', array_fill('{}'::jsonb, ARRAY[7]),
                           concurrency_keys => ARRAY['x', 'x', 'y', 'y', 'z', NULL, NULL]) IS NOT NULL;
SELECT coalesce(j.concurrency_key, '(none)') AS key, count(*)
  FROM jobcap.claim_job('rk', 'w', 10) c JOIN jobcap.jobs j USING (job_id)
 GROUP BY 1 ORDER BY 1;
SELECT count(*) AS claimed FROM jobcap.claim_job('rk', 'w', 10);
-- A job reaped after its lease frees its key's slot too.
UPDATE jobcap.jobs SET lease_expires_at = now() - interval '1 minute'
 WHERE queue = 'rk' AND concurrency_key = 'x' AND state = 'running';
SELECT outcome FROM jobcap.reap_jobs();
SELECT count(*) AS claimed, min(j.concurrency_key) AS key
  FROM jobcap.claim_job('rk', 'w', 10) c JOIN jobcap.jobs j USING (job_id);

-- metrics() shows the due jobs held back by the per-key limit (rk: y's second job; x's second
-- waits for its retry's run_at, so it is not due).
SELECT line FROM regexp_split_to_table(jobcap.metrics(), E'\n') AS line
 WHERE line LIKE 'jobcap_jobs_held_by_key%' OR line LIKE '# TYPE jobcap_jobs_held_by_key%';
SELECT queue, pending, held_by_key FROM jobcap.queue_stats WHERE queue IN ('rk', 'rr') ORDER BY 1;

-- A fifo claim ranks a prefix of the due jobs in claim order (4 x batch + 64 of them) and ranks
-- them all only when that prefix has too few that fit: here 100 jobs of key a, whose limit of 1
-- is taken, come first, and the jobs of b and c after them are still found, in claim order.
SELECT jobcap.create_queue('deep', max_running_per_key => 1);
SELECT jobcap.enqueue_jobs('deep', array_fill('{}'::jsonb, ARRAY[101]),
                           concurrency_keys => array_fill('a'::text, ARRAY[101])) IS NOT NULL;
SELECT jobcap.enqueue_jobs('deep', array_fill('{}'::jsonb, ARRAY[3]),
                           concurrency_keys => ARRAY['b', 'b', 'c']) IS NOT NULL;
SELECT j.concurrency_key AS first FROM jobcap.claim_job('deep', 'w') c JOIN jobcap.jobs j USING (job_id);
SELECT j.concurrency_key AS key, j.job_id - (SELECT min(job_id) FROM jobcap.jobs WHERE queue = 'deep') AS nth
  FROM jobcap.claim_job('deep', 'w', 5) c JOIN jobcap.jobs j USING (job_id) ORDER BY 2;
SELECT count(*) AS claimed FROM jobcap.claim_job('deep', 'w', 5);
-- With those done, key a is free again: its next job, and b's second (smaller backlogs, as in
-- the tests above, are ranked whole from the prefix).
SELECT count(*) AS finished FROM jobcap.jobs j, jobcap.complete_job(j.job_id, j.fence) c
 WHERE j.queue = 'deep' AND j.state = 'running';
SELECT string_agg(j.concurrency_key, ' ' ORDER BY j.job_id) AS keys
  FROM jobcap.claim_job('deep', 'w', 3) c JOIN jobcap.jobs j USING (job_id);
SELECT jobcap.drop_queue('deep', force => true);

-- Bad input: clear errors, nothing created or changed.
SELECT jobcap.create_queue('bad', max_running_per_key => -1);
\echo :LAST_ERROR_SQLSTATE
SELECT jobcap.create_queue('bad', fairness => 'lifo');
\echo :LAST_ERROR_SQLSTATE
SELECT jobcap.create_queue('bad', fairness => NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT jobcap.alter_queue('ck', max_running_per_key => -3);
\echo :LAST_ERROR_SQLSTATE
SELECT jobcap.alter_queue('ck', fairness => 'random');
\echo :LAST_ERROR_SQLSTATE
SELECT jobcap.alter_queue('nope', max_running_per_key => 3);
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS bad_queues FROM jobcap.queues WHERE queue = 'bad';
SELECT jobcap.enqueue_job('ck', concurrency_key => '');
\echo :LAST_ERROR_SQLSTATE
SELECT jobcap.enqueue_job('ck', concurrency_key => repeat('k', 1025));
\echo :LAST_ERROR_SQLSTATE
SELECT jobcap.enqueue_jobs('ck', ARRAY['{}', '{}']::jsonb[], concurrency_keys => ARRAY['a']);
\echo :LAST_ERROR_SQLSTATE
SELECT jobcap.enqueue_jobs('ck', ARRAY['{}']::jsonb[], concurrency_keys => ARRAY[['a']]);
\echo :LAST_ERROR_SQLSTATE
SELECT jobcap.enqueue_jobs('ck', ARRAY['{}']::jsonb[], concurrency_keys => ARRAY['']);
\echo :LAST_ERROR_SQLSTATE
UPDATE jobcap.queues SET max_running_per_key = 0 WHERE queue = 'ck';
\echo :LAST_ERROR_SQLSTATE
UPDATE jobcap.queues SET fairness = 'lifo' WHERE queue = 'ck';
\echo :LAST_ERROR_SQLSTATE
-- A key may hold any text; NULL in the array is a job without a key.
SELECT jobcap.enqueue_jobs('ck', ARRAY['{}', '{}']::jsonb[],
                           concurrency_keys => ARRAY[NULL, 'ü ''key''']) IS NOT NULL AS enqueued;
SELECT concurrency_key FROM jobcap.jobs WHERE queue = 'ck' AND job_id >= (SELECT max(job_id) - 1 FROM jobcap.jobs)
 ORDER BY job_id;

-- drop_queue takes the queue's turn with it.
SELECT jobcap.drop_queue('rr', force => true);
SELECT count(*) AS turns FROM jobcap.queue_turns WHERE queue = 'rr';
SELECT jobcap.drop_queue(q, force => true) FROM unnest(ARRAY['ck', 'ff', 'rk']) q;
