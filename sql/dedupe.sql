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
