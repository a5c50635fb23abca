-- A claim walks its own queue's entries of jobs_claim, not another queue's backlog. Queues
-- 'q7169' and 'q122757' share a 32-bit hashtext: with that as jobs_claim's first key, a claim of
-- q7169 would step over every pending job of q122757 that sorts before its own, on both paths,
-- and its cost would grow with the other queue's backlog. The key is hashtextextended(queue, 0),
-- 64 bits, which this pair does not share: each claim reads its one entry.
\set VERBOSITY terse
SELECT pg_catalog.hashtext('q7169') = pg_catalog.hashtext('q122757') AS same_hash32,
       pg_catalog.hashtextextended('q7169', 0) = pg_catalog.hashtextextended('q122757', 0) AS same_hash64;
SELECT jobcap.create_queue('q7169'), jobcap.create_queue('q122757');
SELECT count(*) FROM jobcap.enqueue_jobs('q122757',
  (SELECT array_agg('{}'::jsonb) FROM generate_series(1, 1000)));
SELECT count(*) FROM jobcap.enqueue_jobs('q7169', ARRAY['{}'::jsonb]);
BEGIN;
SET LOCAL jobcap.hot_path = direct;
SELECT count(*) AS claimed FROM jobcap.claim_job('q7169', 'w');
SELECT pg_catalog.pg_stat_get_xact_tuples_returned('jobcap.jobs_claim'::regclass) < 10
  AS direct_walk_bounded;
ROLLBACK;
BEGIN;
SET LOCAL jobcap.hot_path = sql;
SELECT count(*) AS claimed FROM jobcap.claim_job('q7169', 'w');
SELECT pg_catalog.pg_stat_get_xact_tuples_returned('jobcap.jobs_claim'::regclass) < 10
  AS sql_walk_bounded;
ROLLBACK;
SELECT jobcap.drop_queue('q7169', force => true), jobcap.drop_queue('q122757', force => true);
