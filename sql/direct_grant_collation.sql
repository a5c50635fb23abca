-- A DBA replaces queue_grants' primary key by a unique index of the same name whose queue key
-- is under a nondeterministic (case-insensitive) ICU collation; the column keeps the database's
-- collation. The SQL statements compare g.queue = jobs.queue under the column's collation: a
-- grant of queue 'CI_QUEUE' is not one of 'ci_queue'. The direct path's may_work scans
-- queue_grants_pkey with a key under the index's collation (text_key) and does not compare the
-- found row's queue again: the grant of 'CI_QUEUE' lets the worker settle jobs of 'ci_queue'.
-- index_on checks the keys, predicate and options of queue_grants_pkey but not its collation.
\set VERBOSITY sqlstate
CREATE COLLATION public.case_insensitive (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
ALTER TABLE jobcap.queue_grants DROP CONSTRAINT queue_grants_pkey;
CREATE UNIQUE INDEX queue_grants_pkey ON jobcap.queue_grants (queue COLLATE public.case_insensitive, grantee);
SELECT jobcap.create_queue('ci_queue');
SELECT jobcap.create_queue('CI_QUEUE');
CREATE ROLE regress_ci_worker;
GRANT jobcap_worker TO regress_ci_worker;
SELECT jobcap.grant_queue('CI_QUEUE', 'regress_ci_worker');
SELECT count(*) FROM (SELECT jobcap.enqueue_job('ci_queue', '{}') FROM generate_series(1, 4)) e;
-- Claimed by the DBA (privileged), worked by regress_ci_worker, which holds no grant of ci_queue.
SELECT job_id AS j1, fence AS f1 FROM jobcap.claim_job('ci_queue', 'w') \gset
SELECT job_id AS j2, fence AS f2 FROM jobcap.claim_job('ci_queue', 'w') \gset
SELECT job_id AS j3, fence AS f3 FROM jobcap.claim_job('ci_queue', 'w') \gset
SELECT job_id AS j4, fence AS f4 FROM jobcap.claim_job('ci_queue', 'w') \gset
SET ROLE regress_ci_worker;
-- SQL path: 42501 for each.
SELECT jobcap.heartbeat(:j1, :f1) IS NOT NULL;
SELECT jobcap.complete_job(:j1, :f1);
SELECT jobcap.fail_job(:j2, :f2, 'boom');
BEGIN;
SELECT jobcap.assert_fence(:j3, :f3);
ROLLBACK;
SELECT jobcap.complete_jobs(ARRAY[:j4]::bigint[], ARRAY[:f4]::bigint[]);
RESET ROLE;
-- SQL path: all four still running.
SELECT state, count(*) FROM jobcap.jobs WHERE queue = 'ci_queue' GROUP BY 1 ORDER BY 1;
SELECT jobcap.drop_queue('ci_queue', force => true);
SELECT jobcap.drop_queue('CI_QUEUE', force => true);
DROP INDEX jobcap.queue_grants_pkey;
ALTER TABLE jobcap.queue_grants ADD CONSTRAINT queue_grants_pkey PRIMARY KEY (queue, grantee);
DROP ROLE regress_ci_worker;
DROP COLLATION public.case_insensitive;
