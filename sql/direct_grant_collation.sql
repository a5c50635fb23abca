-- A DBA replaces queue_grants' primary key by a unique index of the same name whose queue key
-- is under a nondeterministic (case-insensitive) ICU collation; the column keeps the database's
-- collation. The SQL statements compare g.queue = jobs.queue under the column's collation: a
-- grant of queue 'R7_CI' is not one of 'r7_ci'. The direct path's may_work scans
-- queue_grants_pkey with a key under the index's collation (text_key) and does not compare the
-- found row's queue again: the grant of 'R7_CI' lets the worker settle jobs of 'r7_ci'.
-- index_on checks the keys, predicate and options of queue_grants_pkey but not its collation.
\set VERBOSITY sqlstate
CREATE COLLATION public.r7_ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
ALTER TABLE jobcap.queue_grants DROP CONSTRAINT queue_grants_pkey;
CREATE UNIQUE INDEX queue_grants_pkey ON jobcap.queue_grants (queue COLLATE public.r7_ci, grantee);
SELECT jobcap.create_queue('r7_ci');
SELECT jobcap.create_queue('R7_CI');
CREATE ROLE r7_worker;
GRANT jobcap_worker TO r7_worker;
SELECT jobcap.grant_queue('R7_CI', 'r7_worker');
SELECT count(*) FROM (SELECT jobcap.enqueue_job('r7_ci', '{}') FROM generate_series(1, 4)) e;
-- Claimed by the DBA (privileged), worked by r7_worker, which holds no grant of r7_ci.
SELECT job_id AS j1, fence AS f1 FROM jobcap.claim_job('r7_ci', 'w') \gset
SELECT job_id AS j2, fence AS f2 FROM jobcap.claim_job('r7_ci', 'w') \gset
SELECT job_id AS j3, fence AS f3 FROM jobcap.claim_job('r7_ci', 'w') \gset
SELECT job_id AS j4, fence AS f4 FROM jobcap.claim_job('r7_ci', 'w') \gset
SET ROLE r7_worker;
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
SELECT state, count(*) FROM jobcap.jobs WHERE queue = 'r7_ci' GROUP BY 1 ORDER BY 1;
SELECT jobcap.drop_queue('r7_ci', force => true);
SELECT jobcap.drop_queue('R7_CI', force => true);
DROP INDEX jobcap.queue_grants_pkey;
ALTER TABLE jobcap.queue_grants ADD CONSTRAINT queue_grants_pkey PRIMARY KEY (queue, grantee);
DROP ROLE r7_worker;
DROP COLLATION public.r7_ci;
