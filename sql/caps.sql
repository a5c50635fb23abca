-- The fix terminates itself: lowering a cap, or installing over a backlog, needs no cleanup.
-- Jobs over their cap are never claimed and go dead on the next reap.
\set VERBOSITY terse
SELECT jobcap.create_queue('docs', max_attempts => 10, backoff_base => '0', backoff_max => '0');

-- Three jobs that have failed three times each, one that never ran, one with its own cap.
SELECT count(jobcap.enqueue_job('docs', jsonb_build_object('n', n))) FROM generate_series(1, 3) n;
DO $$
DECLARE j record;
BEGIN
  FOR i IN 1..3 LOOP
    FOR j IN SELECT * FROM jobcap.claim_job('docs', 'w', 10) LOOP
      PERFORM jobcap.fail_job(j.job_id, j.fence, 'still broken');
    END LOOP;
  END LOOP;
END $$;
SELECT jobcap.enqueue_job('docs', '{"n": "fresh"}') AS fresh \gset
SELECT jobcap.enqueue_job('docs', '{"n": "own cap"}', max_attempts => 5) AS own \gset
SELECT state, count(*), min(attempts), max(attempts) FROM jobcap.jobs WHERE queue = 'docs' GROUP BY state;

-- Lower the queue's cap to 3: the three worn-out jobs are over it.
SELECT jobcap.alter_queue('docs', max_attempts => 3);
SELECT payload->>'n' AS claimable FROM jobcap.claim_job('docs', 'w', 10) ORDER BY 1;
SELECT count(*) FILTER (WHERE outcome = 'dead') AS died, count(*) AS reaped FROM jobcap.reap_jobs();
SELECT count(*) AS reaped_again FROM jobcap.reap_jobs();
SELECT job_id = :own AS own_cap, state, attempts FROM jobcap.jobs
 WHERE queue = 'docs' AND state <> 'dead' ORDER BY job_id;

-- Installing over a backlog: rows another system inserted, attempts already past the cap.
INSERT INTO jobcap.jobs (queue, attempts, payload)
SELECT 'docs', 3 + n % 5, jsonb_build_object('legacy', n) FROM generate_series(1, 5) n;
INSERT INTO jobcap.jobs (queue, payload) VALUES ('docs', '{"legacy": "fine"}');
SELECT payload FROM jobcap.claim_job('docs', 'w', 10) WHERE payload ? 'legacy';
SELECT count(*) AS legacy_dead FROM jobcap.reap_jobs() WHERE outcome = 'dead';
SELECT count(*) FILTER (WHERE attempts > coalesce(j.max_attempts, 3)) AS over_cap_not_dead
  FROM jobcap.jobs j WHERE queue = 'docs' AND state <> 'dead';

-- Raising the cap again does not revive the dead: only requeue_job does.
SELECT jobcap.alter_queue('docs', max_attempts => 20);
SELECT count(*) AS claimed FROM jobcap.claim_job('docs', 'w', 10);
SELECT count(*) AS still_dead FROM jobcap.jobs WHERE queue = 'docs' AND state = 'dead';

SELECT jobcap.drop_queue('docs', force => true);

-- Caps bind every job: a job's cap is the lower of its own and its queue's. A worker that asks
-- for more attempts than its queue allows gets the queue's cap (what the claim returns), in
-- enqueue_job and enqueue_jobs alike.
CREATE ROLE regress_cap_worker;
GRANT jobcap_worker TO regress_cap_worker;
CREATE ROLE regress_cap_operator;
GRANT jobcap_operator TO regress_cap_operator;
SELECT jobcap.create_queue('capped', max_attempts => 3, backoff_base => '0', backoff_max => '0');
SELECT jobcap.grant_queue('capped', 'regress_cap_worker');
SET ROLE regress_cap_worker;
SELECT jobcap.enqueue_job('capped', '{"n": "greedy"}', max_attempts => 1000000) IS NOT NULL AS enqueued;
SELECT cardinality(jobcap.enqueue_jobs('capped', ARRAY['{"n": "greedy batch"}'::jsonb],
                                       max_attempts => 1000000)) AS enqueued;
SELECT payload->>'n' AS n, attempt, max_attempts FROM jobcap.claim_job('capped', 'w', 10) ORDER BY 1;
RESET ROLE;
SELECT count(jobcap.fail_job(job_id, fence, 'greedy')) AS failed FROM jobcap.jobs
 WHERE queue = 'capped' AND state = 'running';
-- Every claim fails, ten rounds: each job runs three times in all, then it is dead.
SET ROLE regress_cap_worker;
DO $$
DECLARE j record;
BEGIN
  FOR i IN 1..10 LOOP
    FOR j IN SELECT * FROM jobcap.claim_job('capped', 'w', 10) LOOP
      PERFORM jobcap.fail_job(j.job_id, j.fence, 'still greedy');
    END LOOP;
  END LOOP;
END $$;
RESET ROLE;
SELECT payload->>'n' AS n, state, attempts, max_attempts AS own_cap FROM jobcap.jobs
 WHERE queue = 'capped' ORDER BY 1;
SELECT attempts, max_attempts FROM jobcap.dead_jobs WHERE queue = 'capped';

-- Lowering a queue's cap binds every job of the queue at once: a job with its own cap, and a
-- job an operator requeued with extra attempts (its budget holds until the queue's cap is next
-- lowered). Neither runs again, and the reaper buries both.
SELECT jobcap.create_queue('storm', max_attempts => 10, backoff_base => '0', backoff_max => '0');
SELECT jobcap.enqueue_job('storm', '{"n": "own cap"}', max_attempts => 8) AS own \gset
SELECT jobcap.enqueue_job('storm', '{"n": "requeued"}', max_attempts => 2) AS requeued \gset
CREATE FUNCTION pg_temp.fail_all(queue text, rounds int) RETURNS int LANGUAGE plpgsql AS $$
DECLARE j record; n int := 0;
BEGIN
  FOR i IN 1..rounds LOOP
    FOR j IN SELECT * FROM jobcap.claim_job(queue, 'w', 10) LOOP
      PERFORM jobcap.fail_job(j.job_id, j.fence, 'storm');
      n := n + 1;
    END LOOP;
  END LOOP;
  RETURN n;
END $$;
SELECT pg_temp.fail_all('storm', 2) AS attempts_run;
SET ROLE regress_cap_operator;
SELECT jobcap.requeue_job(:requeued, 'deploy fixed it', extra_attempts => 5);
RESET ROLE;
SELECT pg_temp.fail_all('storm', 3) AS attempts_run;
SELECT payload->>'n' AS n, state, attempts, max_attempts FROM jobcap.jobs
 WHERE queue = 'storm' ORDER BY 1;
SET ROLE regress_cap_operator;
SELECT jobcap.alter_queue('storm', max_attempts => 1);
RESET ROLE;
SELECT count(*) AS claimed_past_the_new_cap FROM jobcap.claim_job('storm', 'w', 10);
SELECT job_id = :own AS own_cap, outcome FROM jobcap.reap_jobs() ORDER BY job_id;
SELECT payload->>'n' AS n, state, attempts FROM jobcap.jobs WHERE queue = 'storm' ORDER BY 1;
SELECT job_id = :own AS own_cap, attempts, max_attempts FROM jobcap.dead_jobs
 WHERE queue = 'storm' ORDER BY job_id;
-- Raising the cap again revives no budget; a requeue after the lowering grants a new one, and
-- the job runs exactly that many more times.
SELECT jobcap.alter_queue('storm', max_attempts => 10);
SET ROLE regress_cap_operator;
SELECT jobcap.requeue_job(:requeued, 'one more look', extra_attempts => 2);
RESET ROLE;
SELECT pg_temp.fail_all('storm', 5) AS attempts_run;
SELECT state, attempts FROM jobcap.jobs WHERE job_id = :requeued;

SELECT jobcap.drop_queue('capped', force => true), jobcap.drop_queue('storm', force => true);
DROP ROLE regress_cap_worker, regress_cap_operator;
