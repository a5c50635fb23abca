-- Dedupe keys: a key that matches a pending, running or dead job of the queue inserts nothing
-- and returns that job. A dead job is not revived by re-enqueueing it.
\set VERBOSITY terse
-- Job ids appear in an error message below: they start where the expected output says.
SELECT setval(pg_get_serial_sequence('jobcap.jobs', 'job_id'), 1004, false) IS NOT NULL AS ids_reset;
SELECT jobcap.create_queue('ocr', max_attempts => 1);
SELECT jobcap.create_queue('thumbs');

SELECT jobcap.enqueue_job('ocr', '{"doc": 7}', dedupe_key => 'doc-7') AS first \gset
SELECT jobcap.enqueue_job('ocr', '{"doc": 7, "again": true}', dedupe_key => 'doc-7') = :first AS same_while_pending;
SELECT payload FROM jobcap.jobs WHERE job_id = :first;
-- Another queue has its own keys.
SELECT jobcap.enqueue_job('thumbs', dedupe_key => 'doc-7') <> :first AS other_queue_separate;

SELECT fence FROM jobcap.claim_job('ocr', 'w') \gset
SELECT jobcap.enqueue_job('ocr', dedupe_key => 'doc-7') = :first AS same_while_running;
SELECT jobcap.complete_job(:first, :fence);
-- A succeeded job no longer holds its key.
SELECT jobcap.enqueue_job('ocr', dedupe_key => 'doc-7') AS second \gset
SELECT :second <> :first AS new_after_success;

-- A cancelled job does not hold it either.
SELECT jobcap.cancel_job(:second);
SELECT jobcap.enqueue_job('ocr', dedupe_key => 'doc-7') AS third \gset
SELECT :third NOT IN (:first, :second) AS new_after_cancel;

-- A dead job does: re-enqueueing returns the dead job and leaves it dead (the enqueue-side
-- filter that keeps a scanner from spinning on a poison key).
SELECT fence FROM jobcap.claim_job('ocr', 'w') \gset
SELECT jobcap.fail_job(:third, :fence, 'tsvector too large');
SELECT jobcap.enqueue_job('ocr', dedupe_key => 'doc-7') = :third AS returns_dead_job;
SELECT jobcap.enqueue_job('ocr', dedupe_key => 'doc-7') = :third AS still_dead_job;
SELECT state, attempts FROM jobcap.jobs WHERE job_id = :third;
SELECT count(*) AS jobs_with_key, count(*) FILTER (WHERE state = 'pending') AS pending
  FROM jobcap.jobs WHERE queue = 'ocr' AND dedupe_key = 'doc-7';
SELECT count(*) AS claimable FROM jobcap.claim_job('ocr', 'w');

-- Only requeue_job revives it, and a live job holding the key stops that (55000).
SELECT jobcap.requeue_job(:third, 'fixed the tsvector size');
SELECT state FROM jobcap.jobs WHERE job_id = :third;
SELECT jobcap.cancel_job(:third);
SELECT jobcap.enqueue_job('ocr', dedupe_key => 'doc-7') AS fourth \gset
SELECT jobcap.requeue_job(:third, 'try the old one again');
\echo :LAST_ERROR_SQLSTATE

SELECT jobcap.drop_queue('ocr', force => true);
SELECT jobcap.drop_queue('thumbs', force => true);

-- Dedupe windows (0.3.0): with dedupe_window, a key also returns its latest succeeded or
-- cancelled job when that one was enqueued within the window, so the job is not run again;
-- after it, a new job.
SELECT jobcap.create_queue('mail', max_attempts => 2);
SELECT jobcap.enqueue_job('mail', '{"to": 1}', dedupe_key => 'welcome-1', dedupe_window => '1 hour') AS w1 \gset
SELECT jobcap.enqueue_job('mail', '{"to": 1, "again": true}', dedupe_key => 'welcome-1', dedupe_window => '1 hour') = :w1 AS same_while_pending;
SELECT fence FROM jobcap.claim_job('mail', 'w') \gset
SELECT jobcap.complete_job(:w1, :fence);
SELECT jobcap.enqueue_job('mail', dedupe_key => 'welcome-1', dedupe_window => '1 hour') = :w1 AS succeeded_within_window;
SELECT jobcap.enqueue_job('mail', dedupe_key => 'welcome-1', dedupe_window => '1 hour') = :w1 AS still_the_same;
SELECT count(*) AS jobs_with_key, min(state::text) AS state, min(payload::text) AS payload
  FROM jobcap.jobs WHERE queue = 'mail' AND dedupe_key = 'welcome-1';
-- Without a window the key is free once the job succeeded (as before 0.3.0).
SELECT jobcap.enqueue_job('mail', dedupe_key => 'welcome-1') AS w2 \gset
SELECT :w2 <> :w1 AS new_without_window;
SELECT jobcap.cancel_job(:w2);
-- The latest of the key's finished jobs within the window: the cancelled one.
SELECT jobcap.enqueue_job('mail', dedupe_key => 'welcome-1', dedupe_window => '1 hour') = :w2 AS latest_cancelled;
-- Both enqueued more than the window ago: a new job.
UPDATE jobcap.jobs SET enqueued_at = enqueued_at - interval '2 hours' WHERE job_id IN (:w1, :w2);
SELECT jobcap.enqueue_job('mail', dedupe_key => 'welcome-1', dedupe_window => '1 hour') AS w3 \gset
SELECT :w3 NOT IN (:w1, :w2) AS new_after_window;
-- The key's latest finished job decides: enqueued 2 hours ago, a window of 3 hours finds it.
SELECT jobcap.cancel_job(:w3);
UPDATE jobcap.jobs SET enqueued_at = enqueued_at - interval '2 hours' WHERE job_id = :w3;
SELECT jobcap.enqueue_job('mail', dedupe_key => 'welcome-1', dedupe_window => '3 hours') = :w3 AS wider_window;
SELECT jobcap.enqueue_job('mail', dedupe_key => 'welcome-1', dedupe_window => '1 hour') AS w4 \gset
SELECT :w4 NOT IN (:w1, :w2, :w3) AS new_after_window;
SELECT jobcap.cancel_job(:w4);
-- A live holder (here dead) comes before the window's finished jobs.
SELECT jobcap.enqueue_job('mail', dedupe_key => 'welcome-2') AS dead \gset
SELECT fence FROM jobcap.claim_job('mail', 'w') \gset
SELECT jobcap.fail_job(:dead, :fence, 'bounced', retry_in => '0');
SELECT fence FROM jobcap.claim_job('mail', 'w') \gset
SELECT jobcap.fail_job(:dead, :fence, 'bounced again');
SELECT jobcap.enqueue_job('mail', dedupe_key => 'welcome-2', dedupe_window => '1 hour') = :dead AS dead_holder_returned;

-- dedupe => 'replace' (debounce): a pending job holding the key takes the new payload and
-- run_at, and keeps its id, priority and enqueued_at.
SELECT jobcap.enqueue_job('mail', '{"digest": 1}', run_at => '2998-01-01', priority => 3, dedupe_key => 'digest-9') AS d1 \gset
SELECT jobcap.enqueue_job('mail', '{"digest": 2}', run_at => '2999-01-01', dedupe_key => 'digest-9', dedupe => 'replace') = :d1 AS same_job;
SELECT payload, run_at = '2999-01-01' AS run_at_moved, priority, state
  FROM jobcap.jobs WHERE job_id = :d1;
-- keep (the default) leaves the pending job as it is.
SELECT jobcap.enqueue_job('mail', '{"digest": 3}', dedupe_key => 'digest-9') = :d1 AS kept;
SELECT payload FROM jobcap.jobs WHERE job_id = :d1;
-- A running holder is returned unchanged: its attempt has its payload already.
UPDATE jobcap.jobs SET run_at = now() WHERE job_id = :d1;
SELECT fence FROM jobcap.claim_job('mail', 'w') \gset
SELECT jobcap.enqueue_job('mail', '{"digest": 4}', dedupe_key => 'digest-9', dedupe => 'replace') = :d1 AS running_returned;
SELECT payload, state FROM jobcap.jobs WHERE job_id = :d1;
SELECT jobcap.complete_job(:d1, :fence);
-- After it succeeded: a new job without a window, the succeeded one within a window.
SELECT jobcap.enqueue_job('mail', '{"digest": 5}', dedupe_key => 'digest-9', dedupe => 'replace', dedupe_window => '1 hour') = :d1 AS succeeded_within_window;
SELECT jobcap.enqueue_job('mail', '{"digest": 6}', dedupe_key => 'digest-9', dedupe => 'replace') AS d2 \gset
SELECT :d2 <> :d1 AS new_after_success, (SELECT payload FROM jobcap.jobs WHERE job_id = :d1) AS old_payload;

-- Refused, with nothing enqueued: a window or replace without a key, another mode, a window
-- that is not a positive length.
SELECT count(*) AS before FROM jobcap.jobs WHERE queue = 'mail' \gset
SELECT jobcap.enqueue_job('mail', dedupe_window => '1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT jobcap.enqueue_job('mail', dedupe => 'replace');
\echo :LAST_ERROR_SQLSTATE
SELECT jobcap.enqueue_job('mail', dedupe_key => 'k', dedupe => 'update');
\echo :LAST_ERROR_SQLSTATE
SELECT jobcap.enqueue_job('mail', dedupe_key => 'k', dedupe => NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT jobcap.enqueue_job('mail', dedupe_key => 'k', dedupe_window => '0');
\echo :LAST_ERROR_SQLSTATE
SELECT jobcap.enqueue_job('mail', dedupe_key => 'k', dedupe_window => '-1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) = :before AS nothing_enqueued FROM jobcap.jobs WHERE queue = 'mail';
SELECT jobcap.drop_queue('mail', force => true);

-- The window's lookup reads the key's finished jobs through jobs_dedupe_done, on the plan
-- jobcap keeps (generic, sequential and bitmap scans and sorts off: src/spi/plans.hpp), not
-- the finished jobs of every key.
SELECT jobcap.create_queue('plans');
INSERT INTO jobcap.jobs (queue, state, dedupe_key, finished_at)
SELECT 'plans', 'succeeded', 'key-' || i, now() FROM generate_series(1, 2000) i;
ANALYZE jobcap.jobs;
BEGIN;
SELECT set_config('plan_cache_mode', 'force_generic_plan', true) IS NOT NULL AS generic;
SELECT count(set_config(g, 'off', true)) FROM unnest('{enable_seqscan,enable_bitmapscan,enable_sort,jit}'::text[]) g;
DO $$
DECLARE
  s record;
BEGIN
  SELECT * INTO s FROM jobcap.statements() WHERE name = 'enqueue_job_dedupe';
  EXECUTE format('PREPARE window_probe(%s) AS %s', array_to_string(s.argtypes, ', '), s.sql);
END $$;
CREATE FUNCTION pg_temp.window_scans() RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
  line text;
BEGIN
  FOR line IN EXECUTE 'EXPLAIN (COSTS OFF) EXECUTE window_probe(''plans'', ''{}'', now(), 0, NULL,'
                      ' ''key-7'', now(), NULL, NULL, NULL, NULL, ''1 hour'', false)' LOOP
    IF line ~ 'Scan' AND line ~ 'jobs' THEN
      RETURN NEXT regexp_replace(line, '^[ ->]*', '');
    END IF;
  END LOOP;
END $$;
SELECT * FROM pg_temp.window_scans();
ROLLBACK;
SELECT jobcap.drop_queue('plans', force => true);
