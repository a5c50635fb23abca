-- compat(0.2.0): a 0.3.0 library serving a database still at 0.2.0 reads no rate limit (the
-- columns and jobcap.queue_rates do not exist there): the 0.2.0 declarations create, alter and
-- claim as 0.2.0 did, capped queues included. After ALTER EXTENSION jobcap UPDATE, every queue
-- has no rate limit and a period of 1 second until one is set, and the limit then holds.
\set VERBOSITY terse
SELECT current_database() AS first_db \gset
CREATE DATABASE regress_jobcap_upgrade_rates;
\c regress_jobcap_upgrade_rates
SET client_min_messages = error;
CREATE EXTENSION jobcap VERSION '0.2.0';
RESET client_min_messages;
SELECT extversion FROM pg_extension WHERE extname = 'jobcap';
SELECT to_regclass('jobcap.queue_rates') IS NULL AS no_rate_table;
SELECT jobcap.create_queue('open', backoff_base => '0', backoff_max => '0');
SELECT jobcap.create_queue('capped', max_running => 2);
SELECT jobcap.alter_queue('open', max_attempts => 5);
SELECT count(jobcap.enqueue_job('open', '{}')) FROM generate_series(1, 6);
SELECT count(jobcap.enqueue_job('capped', '{}')) FROM generate_series(1, 6);
SELECT count(*) AS claimed_open FROM jobcap.claim_job('open', 'w', 4);
SELECT count(*) AS claimed_capped FROM jobcap.claim_job('capped', 'w', 4);
SELECT job_id AS d FROM jobcap.jobs WHERE queue = 'open' AND state = 'pending' ORDER BY job_id LIMIT 1 \gset
SELECT count(*) AS claimed_by_id FROM jobcap.claim_job_by_id(:d, 'w');
SELECT count(*) AS claimed_next
  FROM jobcap.complete_and_claim(
         (SELECT min(job_id) FROM jobcap.jobs WHERE queue = 'open' AND state = 'running'),
         (SELECT fence FROM jobcap.jobs WHERE job_id = (SELECT min(job_id) FROM jobcap.jobs
                                                         WHERE queue = 'open' AND state = 'running')),
         'open', 'w', 5);
SELECT queue, state, count(*) FROM jobcap.jobs GROUP BY queue, state ORDER BY queue, state;

SET client_min_messages = error;
ALTER EXTENSION jobcap UPDATE TO '0.3.0';
RESET client_min_messages;
SELECT extversion FROM pg_extension WHERE extname = 'jobcap';
SELECT queue, rate_limit, rate_period FROM jobcap.queues ORDER BY queue;
SELECT count(jobcap.enqueue_job('open', '{}')) FROM generate_series(1, 6);
SELECT jobcap.alter_queue('open', rate_limit => 3, rate_period => '1 hour');
SELECT count(*) AS claimed FROM jobcap.claim_job('open', 'w', 5);
SELECT count(*) AS claimed FROM jobcap.claim_job('open', 'w', 5);
SELECT count(*) AS claimed_capped FROM jobcap.claim_job('capped', 'w', 4);

\c :first_db
DROP DATABASE regress_jobcap_upgrade_rates;
