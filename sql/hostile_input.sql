-- Hostile input, function by function: NULLs, empty and 10 kB names, control characters,
-- extreme integers, intervals and times, a 100 MB payload, fences that were never issued.
-- Every refusal has a fitting SQLSTATE (never XX000) and writes nothing.
\set VERBOSITY terse
SELECT setval(pg_get_serial_sequence('jobcap.jobs', 'job_id'), 11000, false) IS NOT NULL AS ids_reset,
       setval('jobcap.fences', 1100, false) IS NOT NULL AS fences_reset;
SELECT jobcap.create_queue('h', max_attempts => 3);
SELECT jobcap.enqueue_job('h', '{"keep": true}') AS job \gset
SELECT fence FROM jobcap.claim_job('h', 'w') \gset

CREATE FUNCTION fingerprint() RETURNS text LANGUAGE sql AS $$
  SELECT md5(concat_ws('|',
    (SELECT string_agg(concat_ws(',', job_id, queue, state, attempts, max_attempts, fence, priority,
                                 run_at, lease_expires_at, worker, finished_at, payload), ';' ORDER BY job_id) FROM jobcap.jobs),
    (SELECT string_agg(concat_ws(',', queue, max_attempts, lease, backoff_base, backoff_max, notify), ';' ORDER BY queue) FROM jobcap.queues),
    (SELECT string_agg(concat_ws(',', seq, job_id, kind, error), ';' ORDER BY seq) FROM jobcap.job_errors),
    (SELECT string_agg(concat_ws(',', queue, grantee), ';' ORDER BY queue, grantee) FROM jobcap.queue_grants)))
$$;
-- Runs one call (in a subtransaction: claims with valid arguments would refuse it with 25001, so
-- only their argument checks are exercised here) and keeps the SQLSTATE and message.
CREATE TABLE tried (n serial, call text, sqlstate text, message text);
CREATE FUNCTION try(call text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  BEGIN
    EXECUTE 'SELECT count(*) FROM (SELECT ' || call || ') s';
    INSERT INTO tried (call, sqlstate) VALUES (call, 'ok');
  EXCEPTION WHEN OTHERS THEN
    INSERT INTO tried (call, sqlstate, message) VALUES (call, SQLSTATE, SQLERRM);
  END;
END $$;
SELECT fingerprint() AS before \gset

SELECT try(c) FROM unnest(ARRAY[
  -- names: NULL, empty, 10 kB, control characters, DEL
  'jobcap.create_queue(repeat(''q'', 10240))',
  'jobcap.create_queue(E''\x01'')',
  'jobcap.create_queue(E''tab\there'')',
  'jobcap.create_queue(E''del\x7f'')',
  'jobcap.alter_queue(repeat(''q'', 10240), max_attempts => 2)',
  'jobcap.drop_queue(repeat(''q'', 10240))',
  'jobcap.drop_queue(NULL)',
  'jobcap.enqueue_job(repeat(''q'', 10240))',
  'jobcap.enqueue_job(E''h\n'')',
  'jobcap.enqueue_jobs(repeat(''q'', 10240), ARRAY[''{}''::jsonb])',
  'jobcap.claim_job(repeat(''q'', 10240), ''w'')',
  'jobcap.claim_job(''h'', repeat(''w'', 10240))',
  'jobcap.claim_job(''h'', E''w\r'')',
  'jobcap.claim_job_by_id(1, repeat(''w'', 10240))',
  'jobcap.complete_and_claim(1, 1, repeat(''q'', 10240), ''w'')',
  'jobcap.complete_and_claim(1, 1, ''h'', NULL)',
  'jobcap.grant_queue(repeat(''q'', 10240), ''jobcap_worker'')',
  'jobcap.grant_queue(''h'', repeat(''r'', 10240))',
  'jobcap.grant_queue(''h'', E''jobcap_worker\x01'')',
  'jobcap.revoke_queue(''h'', NULL)',
  'jobcap.enqueue_job(''h'', ''{}'', now(), 0, NULL, repeat(''k'', 10240))',
  -- integers at the ends of their types
  'jobcap.create_queue(''h2'', max_attempts => 2147483647)',
  'jobcap.create_queue(''h2'', max_attempts => -2147483648)',
  'jobcap.claim_job(''h'', ''w'', 2147483647)',
  'jobcap.claim_job(''h'', ''w'', -2147483648)',
  'jobcap.enqueue_job(''h'', max_attempts => 2147483647)',
  'jobcap.enqueue_jobs(''h'', ARRAY[''{}''::jsonb], max_attempts => -2147483648)',
  'jobcap.reap_jobs(2147483647)',
  'jobcap.reap_jobs(-2147483648)',
  'jobcap.requeue_job(1, ''why'', 2147483647)',
  'jobcap.requeue_job(1, ''why'', -1)',
  'jobcap.complete_job(0, 1)',
  'jobcap.complete_job(-9223372036854775808, 1)',
  'jobcap.cancel_job(-1)',
  'jobcap.claim_job_by_id(0, ''w'')',
  'jobcap.backoff(-2147483648, ''1 second'', ''1 hour'')',
  'jobcap.backoff(2147483647, ''1 second'', ''1 hour'')',
  -- intervals at the ends of their range, and backwards
  'jobcap.create_queue(''h2'', lease => ''178000000 years'')',
  'jobcap.create_queue(''h2'', lease => ''-178000000 years'')',
  'jobcap.create_queue(''h2'', lease => ''2147483647 days'')',
  'jobcap.create_queue(''h2'', lease => ''1 month -30 days'')',
  'jobcap.create_queue(''h2'', backoff_max => ''178000000 years'')',
  'jobcap.alter_queue(''h'', backoff_base => ''-2147483648 months'')',
  'jobcap.claim_job(''h'', ''w'', 1, ''-1 microsecond'')',
  'jobcap.claim_job(''h'', ''w'', 1, ''178000000 years'')',
  'jobcap.heartbeat(1, 1, ''178000000 years'')',
  'jobcap.fail_job(1, 1, ''e'', ''-178000000 years'')',
  'jobcap.backoff(1, ''178000000 years'', ''178000000 years'')',
  -- times
  'jobcap.enqueue_job(''h'', ''{}'', ''infinity'')',
  'jobcap.enqueue_job(''h'', ''{}'', ''-infinity'')',
  'jobcap.enqueue_jobs(''h'', ARRAY[''{}''::jsonb], ''infinity'')',
  'jobcap.enqueue_job(''h'', ''{}'', NULL)',
  -- payloads: NULL, a 100 MB one, an array with a NULL or one oversized member
  'jobcap.enqueue_job(''h'', NULL)',
  'jobcap.enqueue_job(''h'', jsonb_build_object(''blob'', repeat(''x'', 100 * 1024 * 1024)))',
  'jobcap.enqueue_jobs(''h'', NULL)',
  'jobcap.enqueue_jobs(''h'', ARRAY[''{}''::jsonb, NULL])',
  'jobcap.enqueue_jobs(''h'', ARRAY[''{}''::jsonb, jsonb_build_object(''blob'', repeat(''x'', 2 * 1024 * 1024))])',
  'jobcap.enqueue_jobs(''h'', array_fill(''{}''::jsonb, ARRAY[100001]))',
  -- fences never issued, of another job, of no job
  format('jobcap.complete_job(%s, 0)', :job),
  format('jobcap.complete_job(%s, -9223372036854775808)', :job),
  format('jobcap.complete_job(%s, 9223372036854775807)', :job),
  format('jobcap.fail_job(%s, %s, NULL)', :job, :fence + 1),
  format('jobcap.heartbeat(%s, %s)', :job, :fence - 1),
  format('jobcap.assert_fence(%s, NULL)', :job),
  format('jobcap.complete_job(9223372036854775807, %s)', :fence),
  format('jobcap.complete_jobs(ARRAY[%s], ARRAY[0])', :job),
  'jobcap.complete_jobs(ARRAY[1, 2], ARRAY[1])',
  'jobcap.complete_jobs(ARRAY[1, NULL], ARRAY[1, 2])',
  'jobcap.complete_jobs(NULL, ARRAY[1])',
  'jobcap.complete_jobs(array_fill(1::bigint, ARRAY[10001]), array_fill(1::bigint, ARRAY[10001]))',
  'jobcap.complete_jobs(''{}'', ''{}'')',
  -- the rest of the NULLs
  'jobcap.requeue_job(NULL, ''why'')',
  'jobcap.heartbeat(NULL, 1)',
  'jobcap.fail_job(1, NULL, ''e'')',
  'jobcap.backoff(1, NULL, ''1 hour'')',
  'jobcap.create_queue(''h2'', backoff_base => NULL)',
  'jobcap.claim_job(''h'', ''w'', NULL)'
]) c;

SELECT n, sqlstate, message FROM tried ORDER BY n;
SELECT count(*) FILTER (WHERE sqlstate = 'XX000') AS internal_errors,
       count(*) FILTER (WHERE sqlstate = 'ok') AS accepted FROM tried;
-- Nothing any of them tried was written (the accepted ones are checks that changed nothing).
SELECT fingerprint() = :'before' AS nothing_written;
SELECT state, fence = :fence AS same_fence, payload FROM jobcap.jobs WHERE job_id = :job;

-- Extremes that are accepted: priorities at both ends, times at both ends of the range.
SELECT jobcap.enqueue_job('h', priority => -2147483648) IS NOT NULL AS lowest_priority,
       jobcap.enqueue_job('h', priority => 2147483647) IS NOT NULL AS highest_priority,
       jobcap.enqueue_job('h', run_at => '4713-01-01 00:00:00+00 BC') IS NOT NULL AS earliest,
       jobcap.enqueue_job('h', run_at => '294276-12-31 23:59:59+00') IS NOT NULL AS latest;
-- Long texts are kept short: a 10 MB error and a 10 kB reason are cut to jobcap.max_error_bytes.
SELECT jobcap.fail_job(:job, :fence, repeat('e', 10 * 1024 * 1024));
SELECT jobcap.cancel_job(:job);
SELECT jobcap.requeue_job(:job, repeat('r', 10240));
SELECT kind, octet_length(error) AS kept_bytes, right(error, 34) AS tail
  FROM jobcap.job_errors WHERE job_id = :job ORDER BY seq;
-- A budget pushed past the integer range is an error (22003), not a wrap-around.
UPDATE jobcap.jobs SET attempts = 2147483000, max_attempts = 2147483000, state = 'dead' WHERE job_id = :job;
SELECT jobcap.requeue_job(:job, 'more', 1000000);
\echo :LAST_ERROR_SQLSTATE

-- The payload limit is jobcap.max_payload_bytes (superuser-only), measured on the jsonb value.
SHOW jobcap.max_payload_bytes;
SET jobcap.max_payload_bytes = '1kB';
SELECT jobcap.enqueue_job('h', jsonb_build_object('s', repeat('x', 900))) IS NOT NULL AS fits;
SELECT jobcap.enqueue_job('h', jsonb_build_object('s', repeat('x', 1100)));
\echo :LAST_ERROR_SQLSTATE
RESET jobcap.max_payload_bytes;

-- complete_and_claim that fails in its second half leaves the first undone: one statement.
SELECT jobcap.enqueue_job('h') AS j2 \gset
SELECT job_id = :j2 AS claimed, fence AS f2 FROM jobcap.claim_job_by_id(:j2, 'w') \gset
SELECT * FROM jobcap.complete_and_claim(:j2, :f2, 'no such queue', 'w');
SELECT state, fence = :f2 AS same_fence FROM jobcap.jobs WHERE job_id = :j2;

DROP FUNCTION try(text);
DROP FUNCTION fingerprint();
DROP TABLE tried;
SELECT jobcap.drop_queue('h', force => true);
