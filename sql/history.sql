-- Error history is bounded per job (jobcap.error_history), each text is cut at
-- jobcap.max_error_bytes on a character boundary, and payloads are never copied.
\set VERBOSITY terse
SET jobcap.error_history = 3;
SET jobcap.max_error_bytes = 64;
SELECT jobcap.create_queue('hist', max_attempts => 10, backoff_base => '0', backoff_max => '0');
SELECT jobcap.enqueue_job('hist', jsonb_build_object('blob', repeat('x', 1000000))) AS job \gset

CREATE FUNCTION fail_once(job bigint, message text) RETURNS jobcap.job_state
LANGUAGE sql AS $$
  SELECT jobcap.fail_job(c.job_id, c.fence, message) FROM jobcap.claim_job('hist', 'w') c
   WHERE c.job_id = job
$$;
SELECT fail_once(:job, 'error #' || n) FROM generate_series(1, 5) n;
-- Only the newest three attempts are kept.
SELECT attempt, kind, error FROM jobcap.job_errors WHERE job_id = :job ORDER BY seq;

-- Long texts are cut and say so; multibyte text is cut between characters.
SELECT fail_once(:job, repeat('x', 10000));
SELECT fail_once(:job, repeat('é', 100));
SELECT attempt, octet_length(error) AS bytes, error FROM jobcap.job_errors WHERE job_id = :job ORDER BY seq;
-- A failure may come without a message.
SELECT fail_once(:job, NULL);
SELECT attempt, error IS NULL AS no_message FROM jobcap.job_errors WHERE job_id = :job ORDER BY seq DESC LIMIT 1;

-- The megabyte payload was never copied: history holds only small texts.
SELECT sum(octet_length(error)) < 1000 AS small_history, count(*) AS kept FROM jobcap.job_errors WHERE job_id = :job;
SELECT count(*) AS payload_columns FROM pg_attribute
 WHERE attrelid = 'jobcap.job_errors'::regclass AND atttypid = 'jsonb'::regtype;

-- error_history = 0 keeps nothing, and clears what was there at the job's next failure.
SET jobcap.error_history = 0;
SELECT fail_once(:job, 'forgotten');
SELECT count(*) AS kept FROM jobcap.job_errors WHERE job_id = :job;

-- These settings are for superusers: a plain role cannot lift the bounds.
CREATE ROLE jobcap_history_probe;
SET ROLE jobcap_history_probe;
SET jobcap.error_history = 1000;
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
DROP ROLE jobcap_history_probe;

RESET jobcap.error_history;
RESET jobcap.max_error_bytes;

-- count_rolled_back_claim: the background worker's count of a claim that rolled back, called on
-- a Citus cluster where the job's shard is (docs/scaling.md); the ring of rolled-back claims
-- calls it once per claim. It counts only while the job is as the claim left it: pending, below
-- its cap, with a fence lower than the claim's. Nobody is granted it.
SET jobcap.error_history = 100;
SELECT jobcap.create_queue('hist_rb', max_attempts => 3);
SELECT jobcap.enqueue_job('hist_rb', '{}') AS rb \gset
SELECT jobcap.count_rolled_back_claim(:rb, 5, 'w-rb') AS counted;
SELECT state, attempts, worker FROM jobcap.jobs WHERE job_id = :rb;
SELECT attempt, kind, worker, error FROM jobcap.job_errors WHERE job_id = :rb;
-- Claimed since (running, a higher fence): the job has moved on, nothing counted.
SELECT fence AS rb_fence FROM jobcap.claim_job('hist_rb', 'w2') \gset
SELECT jobcap.count_rolled_back_claim(:rb, 5, 'w-rb') AS counted_while_running;
SELECT jobcap.release_job(:rb, :rb_fence);
SELECT jobcap.count_rolled_back_claim(:rb, 5, 'w-rb') AS counted_below_a_later_fence;
SELECT state, attempts FROM jobcap.jobs WHERE job_id = :rb;
SELECT has_function_privilege(r, 'jobcap.count_rolled_back_claim(bigint, bigint, text)', 'EXECUTE')
  FROM unnest(ARRAY['jobcap_worker', 'jobcap_operator', 'public']) r;
SELECT jobcap.drop_queue('hist_rb', force => true);
RESET jobcap.error_history;
DROP FUNCTION fail_once(bigint, text);
SELECT jobcap.drop_queue('hist', force => true);
