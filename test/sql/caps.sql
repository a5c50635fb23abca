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
