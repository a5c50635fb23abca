-- ALTER EXTENSION jobcap UPDATE runs with jobs in flight: it must not rewrite jobcap.jobs (a
-- new relfilenode), which holds ACCESS EXCLUSIVE on the table, and so every claim, enqueue,
-- settle and the reaper, for the whole rewrite and the rebuild of every index of it. A table
-- that keeps a long history is millions of rows: seconds to minutes with no job handed out.
\set VERBOSITY terse
SELECT current_database() AS first_db \gset
CREATE DATABASE regress_jobcap_no_rewrite;
\c regress_jobcap_no_rewrite
SET client_min_messages = error;
CREATE EXTENSION jobcap VERSION '0.1.0';
RESET client_min_messages;
SELECT jobcap.create_queue('nr');
SELECT count(jobcap.enqueue_job('nr')) FROM generate_series(1, 3);
SELECT pg_catalog.pg_relation_filenode('jobcap.jobs') AS before \gset
SET client_min_messages = error;
ALTER EXTENSION jobcap UPDATE TO '0.2.0';
RESET client_min_messages;
SELECT pg_catalog.pg_relation_filenode('jobcap.jobs') = :before AS jobs_not_rewritten;
SELECT count(*) AS claimed FROM jobcap.claim_job('nr', 'w', 5);
\c :first_db
DROP DATABASE regress_jobcap_no_rewrite;
