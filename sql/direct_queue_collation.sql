-- A DBA replaces queues' primary key by a unique index of the same name whose key is under a
-- nondeterministic (case-insensitive) ICU collation; the column keeps the database's collation.
-- Only queue 'CI_QUEUE' exists. The SQL statements look 'ci_queue' up under the column's collation:
-- missing, 42704. The direct path's read_queue scans queues_pkey with a key under the index's
-- collation (text_key) and does not compare the found row's queue again: it finds 'CI_QUEUE' and
-- enqueues (and claims) a job of the missing queue 'ci_queue' under CI_QUEUE's settings. index_on checks
-- the keys, predicate and options of queues_pkey but not its collation.
\set VERBOSITY sqlstate
CREATE COLLATION public.case_insensitive (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
SET client_min_messages = warning;
ALTER TABLE jobcap.queues DROP CONSTRAINT queues_pkey CASCADE;
RESET client_min_messages;
CREATE UNIQUE INDEX queues_pkey ON jobcap.queues (queue COLLATE public.case_insensitive);
SELECT jobcap.create_queue('CI_QUEUE');
-- SQL path: 42704 for both, no job.
SELECT jobcap.enqueue_job('ci_queue', '{}') IS NOT NULL AS enqueued;
SELECT count(*) FROM jobcap.claim_job('ci_queue', 'w');
SELECT queue, state FROM jobcap.jobs WHERE queue IN ('ci_queue', 'CI_QUEUE');
DELETE FROM jobcap.jobs WHERE queue IN ('ci_queue', 'CI_QUEUE');
SELECT jobcap.drop_queue('CI_QUEUE', force => true);
DROP INDEX jobcap.queues_pkey;
ALTER TABLE jobcap.queues ADD CONSTRAINT queues_pkey PRIMARY KEY (queue);
ALTER TABLE jobcap.queue_grants ADD CONSTRAINT queue_grants_queue_fkey FOREIGN KEY (queue)
  REFERENCES jobcap.queues (queue) ON UPDATE CASCADE ON DELETE CASCADE;
ALTER TABLE jobcap.job_schedules ADD CONSTRAINT job_schedules_queue_fkey FOREIGN KEY (queue)
  REFERENCES jobcap.queues (queue) ON UPDATE CASCADE ON DELETE CASCADE;
DROP COLLATION public.case_insensitive;
