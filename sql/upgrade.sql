-- ALTER EXTENSION jobcap UPDATE from 0.1.0 while jobs are in flight. Between installing this
-- library and the update, the 0.1.0 declarations call it on the 0.1.0 schema: claims,
-- completions, queue settings and statistics keep working (their 0.1.0 statements); after the
-- update, a job claimed before it completes with an output, and the queue controls work.
\set VERBOSITY terse
SELECT current_database() AS first_db \gset
CREATE DATABASE regress_jobcap_upgrade;
\c regress_jobcap_upgrade
SET client_min_messages = error;
CREATE EXTENSION jobcap VERSION '0.1.0';
RESET client_min_messages;
SELECT extversion FROM pg_extension WHERE extname = 'jobcap';
SELECT jobcap.create_queue('up', lease => '1 hour', backoff_base => '0', backoff_max => '0');
SELECT jobcap.alter_queue('up', max_attempts => 5);
SELECT count(jobcap.enqueue_job('up', jsonb_build_object('n', n))) FROM generate_series(1, 6) n;
SELECT job_id AS a, fence AS fa FROM jobcap.claim_job('up', 'w') \gset
SELECT job_id AS b, fence AS fb FROM jobcap.claim_job('up', 'w') \gset
SELECT job_id AS c, fence AS fc FROM jobcap.claim_job('up', 'w') \gset
SELECT jobcap.complete_job(:a, :fa);
SELECT count(*) AS claimed_next FROM jobcap.complete_and_claim(:c, :fc, 'up', 'w');
SELECT jobcap.complete_jobs(ARRAY[job_id], ARRAY[fence]) FROM jobcap.jobs
 WHERE queue = 'up' AND state = 'running' AND job_id <> :b;
SELECT job_id AS d FROM jobcap.jobs WHERE queue = 'up' AND state = 'pending' ORDER BY job_id LIMIT 1 \gset
SELECT count(*) AS claimed_by_id FROM jobcap.claim_job_by_id(:d, 'w');
SELECT queue, pending, running FROM jobcap.queue_stats;

-- The update, with job b (and d) still running. It must not rewrite jobcap.jobs (a new
-- relfilenode): a rewrite holds ACCESS EXCLUSIVE on the table, and so every claim, enqueue,
-- settle and the reaper, for as long as it takes to copy the kept history and rebuild every index.
SELECT pg_catalog.pg_relation_filenode('jobcap.jobs') AS jobs_file \gset
ALTER EXTENSION jobcap UPDATE TO '0.2.0';
SELECT extversion FROM pg_extension WHERE extname = 'jobcap';
SELECT pg_catalog.pg_relation_filenode('jobcap.jobs') = :jobs_file AS jobs_not_rewritten;
SELECT jobcap.complete_job(:b, :fb, '{"after": "update"}');
SELECT state, output FROM jobcap.jobs WHERE job_id = :b;
SELECT queue, pending, running, paused, max_running FROM jobcap.queue_stats;
SELECT jobcap.pause_queue('up');
SELECT count(*) AS claimed_while_paused FROM jobcap.claim_job('up', 'w', 5);
SELECT jobcap.resume_queue('up');
SELECT jobcap.alter_queue('up', max_running => 2);
SELECT count(*) AS claimed_up_to_the_limit FROM jobcap.claim_job('up', 'w', 5);
SELECT state, count(*) FROM jobcap.jobs GROUP BY state ORDER BY state;

\c :first_db
DROP DATABASE regress_jobcap_upgrade;
