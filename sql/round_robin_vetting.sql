-- The direct path's round-robin claim (src/direct/turns.cpp) against what a DBA may do to
-- jobs_keys, jobs.concurrency_key and queue_turns: the output expected is the SQL path's, on both
-- paths (cases found by a reviewing helper; each failed on the direct run before it was mended).

-- 1. A DBA gives jobcap.jobs.concurrency_key a collation of its own (ICU "en-x-icu", where
-- 'a' < 'B'; the database's C/C.UTF-8 collation has 'B' < 'a') and rebuilds jobs_keys under the
-- database's collation. The round-robin statement orders keys under the column's collation (the
-- first key is 'a'); the direct walk would follow the index's, so the direct path requires the
-- column's collation to be the database's (learn_turns) and leaves these claims to the SQL path.
\set VERBOSITY sqlstate
ALTER TABLE jobcap.jobs ALTER COLUMN concurrency_key TYPE text COLLATE "en-x-icu";
DROP INDEX jobcap.jobs_keys;
CREATE INDEX jobs_keys ON jobcap.jobs
    (pg_catalog.hashtextextended(queue, 0), concurrency_key COLLATE "default", priority, run_at, job_id)
    WHERE state OPERATOR(pg_catalog.=) 'pending' AND concurrency_key IS NOT NULL;
SELECT jobcap.create_queue('rrcoll', fairness => 'round_robin');
SELECT count(*) FROM (SELECT jobcap.enqueue_job('rrcoll', jsonb_build_object('k', k), concurrency_key => k)
                        FROM unnest(ARRAY['a', 'B']) k) e;
-- No turn yet: the first key under the column's collation ('a'), then 'B'.
SELECT payload->>'k' AS k FROM jobcap.claim_job('rrcoll', 'w');
SELECT last_key FROM jobcap.queue_turns WHERE queue = 'rrcoll';
SELECT payload->>'k' AS k FROM jobcap.claim_job('rrcoll', 'w');
SELECT last_key FROM jobcap.queue_turns WHERE queue = 'rrcoll';
SELECT jobcap.drop_queue('rrcoll', force => true);
DROP INDEX jobcap.jobs_keys;
ALTER TABLE jobcap.jobs ALTER COLUMN concurrency_key TYPE text COLLATE "default";
CREATE INDEX jobs_keys ON jobcap.jobs
    (pg_catalog.hashtextextended(queue, 0), concurrency_key, priority, run_at, job_id)
    WHERE state OPERATOR(pg_catalog.=) 'pending' AND concurrency_key IS NOT NULL;

-- 2. A publication on jobcap.queue_turns whose row filter (or column list) does not cover the
-- replica identity: an UPDATE of the table is refused (42P10), an INSERT is not. The SQL path's
-- turn write is INSERT ... ON CONFLICT DO UPDATE, which the executor checks as an UPDATE even when
-- no row conflicts: the first claim of a queue with no turn row is refused (on both paths: a
-- queue with no turn goes to the SQL path), and so is every claim once the queue has its turn,
-- on the direct path too (write_plainly checks every write as an UPDATE).
\set VERBOSITY sqlstate
SET client_min_messages = warning;
CREATE PUBLICATION turns_pub FOR TABLE jobcap.queue_turns WHERE (last_key <> 'zzz');
RESET client_min_messages;
SELECT jobcap.create_queue('rrpub', fairness => 'round_robin');
SELECT count(*) FROM (SELECT jobcap.enqueue_job('rrpub', jsonb_build_object('k', k), concurrency_key => k)
                        FROM unnest(ARRAY['a', 'b', 'c']) k) e;
SELECT payload->>'k' AS k FROM jobcap.claim_job('rrpub', 'w');
SELECT last_key FROM jobcap.queue_turns WHERE queue = 'rrpub';
DROP PUBLICATION turns_pub;
SELECT payload->>'k' AS k FROM jobcap.claim_job('rrpub', 'w');
SET client_min_messages = warning;
CREATE PUBLICATION turns_pub FOR TABLE jobcap.queue_turns WHERE (last_key <> 'zzz');
RESET client_min_messages;
SELECT payload->>'k' AS k FROM jobcap.claim_job('rrpub', 'w');
SELECT last_key FROM jobcap.queue_turns WHERE queue = 'rrpub';
SELECT count(*) FROM jobcap.jobs WHERE queue = 'rrpub' AND state = 'running';
-- The statement's plan holds the upsert whatever it claims: a claim of keyless jobs only, which
-- writes no turn, is refused too, on both paths.
SELECT jobcap.create_queue('rrpub_keyless', fairness => 'round_robin');
SELECT jobcap.enqueue_job('rrpub_keyless') > 0 AS enqueued;
SELECT count(*) FROM jobcap.claim_job('rrpub_keyless', 'w');
DROP PUBLICATION turns_pub;
SET client_min_messages = warning;
CREATE PUBLICATION turns_pub FOR TABLE jobcap.queue_turns (last_key);
RESET client_min_messages;
SELECT payload->>'k' AS k FROM jobcap.claim_job('rrpub', 'w');
SELECT last_key FROM jobcap.queue_turns WHERE queue = 'rrpub';
DROP PUBLICATION turns_pub;
SELECT jobcap.drop_queue('rrpub', force => true);
SELECT jobcap.drop_queue('rrpub_keyless', force => true);

-- 3. In a database whose collation is not C (ICU 'en': 'a' < 'B' < 'c' < 'D'), a DBA rebuilds
-- jobs_keys with the built-in text_pattern_ops on concurrency_key (byte order: 'B' < 'D' < 'a' <
-- 'c'). The round-robin statement orders keys under the column's collation: a, B, c, D. The
-- direct path requires every key of an index it scans in its type's default btree operator class
-- (index_on), and leaves these claims to the SQL path.
\set VERBOSITY terse
SELECT current_database() AS orig \gset
SET client_min_messages = error;
CREATE DATABASE attack_icu TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en' LOCALE 'C.utf8';
\c attack_icu
SET client_min_messages = error;
CREATE EXTENSION jobcap;
RESET client_min_messages;
DROP INDEX jobcap.jobs_keys;
CREATE INDEX jobs_keys ON jobcap.jobs
    (pg_catalog.hashtextextended(queue, 0), concurrency_key text_pattern_ops, priority, run_at, job_id)
    WHERE state OPERATOR(pg_catalog.=) 'pending' AND concurrency_key IS NOT NULL;
SELECT jobcap.create_queue('rrops', fairness => 'round_robin');
SELECT count(*) FROM (SELECT jobcap.enqueue_job('rrops', jsonb_build_object('k', k), concurrency_key => k)
                        FROM unnest(ARRAY['a', 'B', 'c', 'D']) k) e;
SELECT (jobcap.claim_job('rrops', 'w')).payload->>'k' AS k FROM generate_series(1, 4);
\c :orig
DROP DATABASE attack_icu;
