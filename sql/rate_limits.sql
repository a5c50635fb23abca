-- Rate limits (issue 36): rate_limit claims per rate_period, per queue, with create_queue and
-- alter_queue; claims over the limit return fewer or no rows, never an error.
\set VERBOSITY terse
SELECT jobcap.create_queue('rl', rate_limit => 4, rate_period => '1 hour',
                           backoff_base => '0', backoff_max => '0');
SELECT rate_limit, rate_period FROM jobcap.queues WHERE queue = 'rl';
SELECT count(jobcap.enqueue_job('rl', jsonb_build_object('n', n))) FROM generate_series(1, 10) n;

-- A batch takes what the window has left; later claims get nothing, without an error.
SELECT count(*) AS claimed FROM jobcap.claim_job('rl', 'w', 3);
SELECT count(*) AS claimed FROM jobcap.claim_job('rl', 'w', 3);
SELECT count(*) AS claimed FROM jobcap.claim_job('rl', 'w', 3);
SELECT count(*) AS claimed_by_id
  FROM jobcap.claim_job_by_id((SELECT min(job_id) FROM jobcap.jobs
                                WHERE queue = 'rl' AND state = 'pending'), 'w');
-- Completing a job frees no claim (the window counts claims, not running jobs).
SELECT count(*) AS claimed_next
  FROM jobcap.complete_and_claim(
         (SELECT min(job_id) FROM jobcap.jobs WHERE queue = 'rl' AND state = 'running'),
         (SELECT fence FROM jobcap.jobs WHERE job_id = (SELECT min(job_id) FROM jobcap.jobs
                                                         WHERE queue = 'rl' AND state = 'running')),
         'rl', 'w', 5);
SELECT state, count(*) FROM jobcap.jobs WHERE queue = 'rl' GROUP BY state ORDER BY state;
SELECT slot_us, array_length(counts, 1) AS slots, (SELECT sum(c) FROM unnest(counts) c) AS charged
  FROM jobcap.queue_rates WHERE queue = 'rl';
-- queue_stats and metrics() show the due jobs the limit holds back: the window is spent, so
-- every pending job; the other limits' figures are NULL (the queue has none).
SELECT pending, held_by_rate, held_by_max_running, held_by_key FROM jobcap.queue_stats WHERE queue = 'rl';
SELECT line FROM regexp_split_to_table(jobcap.metrics(), E'\n') AS line
 WHERE line LIKE 'jobcap_jobs_held_by_rate{queue="rl"}%';
-- With room for 2 more claims, 2 fewer held.
SELECT jobcap.alter_queue('rl', rate_limit => 6);
SELECT pending, held_by_rate FROM jobcap.queue_stats WHERE queue = 'rl';
SELECT jobcap.alter_queue('rl', rate_limit => 4);

-- A claim that rolls back gives its charge back.
SELECT jobcap.alter_queue('rl', rate_limit => 6);
BEGIN;
SELECT count(*) AS claimed_then_rolled_back FROM jobcap.claim_job('rl', 'w', 5);
ROLLBACK;
SELECT (SELECT sum(c) FROM unnest(counts) c) AS charged FROM jobcap.queue_rates WHERE queue = 'rl';
SELECT count(*) AS claimed FROM jobcap.claim_job('rl', 'w', 5);
SELECT count(*) AS claimed FROM jobcap.claim_job('rl', 'w', 5);

-- The window slides: with a period of 2 seconds, its claims are free again after it.
SELECT jobcap.alter_queue('rl', rate_period => '2 seconds', rate_limit => 1);
SELECT count(*) AS claimed FROM jobcap.claim_job('rl', 'w', 5);
SELECT pg_sleep(2.3);
SELECT count(*) AS claimed_after_the_window FROM jobcap.claim_job('rl', 'w', 5);
SELECT count(*) AS claimed FROM jobcap.claim_job('rl', 'w', 5);

-- rate_limit => 0 removes the limit (NULL keeps it); the claim is the open one again.
SELECT jobcap.alter_queue('rl', max_attempts => 5);
SELECT rate_limit, rate_period FROM jobcap.queues WHERE queue = 'rl';
SELECT jobcap.alter_queue('rl', rate_limit => 0);
SELECT rate_limit, rate_period FROM jobcap.queues WHERE queue = 'rl';
SELECT count(*) AS claimed_unlimited FROM jobcap.claim_job('rl', 'w', 10);

-- With max_running too, the smaller room wins.
SELECT jobcap.create_queue('rl2', rate_limit => 5, rate_period => '1 hour', max_running => 2);
SELECT count(jobcap.enqueue_job('rl2', '{}')) FROM generate_series(1, 10);
SELECT count(*) AS claimed FROM jobcap.claim_job('rl2', 'w', 10);
SELECT count(*) AS claimed
  FROM jobcap.complete_and_claim(
         (SELECT min(job_id) FROM jobcap.jobs WHERE queue = 'rl2' AND state = 'running'),
         (SELECT fence FROM jobcap.jobs WHERE job_id = (SELECT min(job_id) FROM jobcap.jobs
                                                         WHERE queue = 'rl2' AND state = 'running')),
         'rl2', 'w', 10);
SELECT jobcap.alter_queue('rl2', max_running => 0);
SELECT count(*) AS claimed FROM jobcap.claim_job('rl2', 'w', 10);
SELECT count(*) AS claimed FROM jobcap.claim_job('rl2', 'w', 10);

-- A paused rate-limited queue hands out nothing and charges nothing.
SELECT jobcap.create_queue('rl3', rate_limit => 2, rate_period => '1 hour');
SELECT count(jobcap.enqueue_job('rl3', '{}')) FROM generate_series(1, 3);
SELECT jobcap.pause_queue('rl3');
SELECT count(*) AS claimed FROM jobcap.claim_job('rl3', 'w', 10);
SELECT count(*) AS rate_rows FROM jobcap.queue_rates WHERE queue = 'rl3';
SELECT jobcap.resume_queue('rl3');
SELECT count(*) AS claimed FROM jobcap.claim_job('rl3', 'w', 10);

-- A limit far above the window's claims: a claim of at most 32 jobs shares the claim turn with
-- the others (on the direct path each charges its own row of the window, that of its slot of
-- the shared turn: the rows' sum is the window), and the statistics sum the rows too.
SELECT jobcap.create_queue('rlw', rate_limit => 100000, rate_period => '1 hour');
SELECT count(jobcap.enqueue_job('rlw', jsonb_build_object('n', n))) FROM generate_series(1, 10) n;
SELECT count(*) AS claimed FROM jobcap.claim_job('rlw', 'w', 3);
BEGIN;
SELECT count(*) AS claimed FROM jobcap.claim_job('rlw', 'w', 2);
SELECT count(*) AS claimed_again FROM jobcap.claim_job('rlw', 'w', 1);
COMMIT;
BEGIN;
SELECT count(*) AS claimed_then_rolled_back FROM jobcap.claim_job('rlw', 'w', 2);
ROLLBACK;
SELECT sum((SELECT sum(c) FROM unnest(counts) c)) AS charged FROM jobcap.queue_rates WHERE queue = 'rlw';
-- Lowered to 8: the window has room for 2 more, 2 of the 4 pending jobs are held.
SELECT jobcap.alter_queue('rlw', rate_limit => 8);
SELECT pending, held_by_rate FROM jobcap.queue_stats WHERE queue = 'rlw';
SELECT count(*) AS claimed FROM jobcap.claim_job('rlw', 'w', 5);
-- A new period folds the window's rows into one, every claim still counted.
SELECT jobcap.alter_queue('rlw', rate_period => '2 hours');
SELECT count(*) AS rate_rows, sum((SELECT sum(c) FROM unnest(counts) c)) AS charged
  FROM jobcap.queue_rates WHERE queue = 'rlw';
SELECT count(*) AS claimed FROM jobcap.claim_job('rlw', 'w', 5);
SELECT jobcap.drop_queue('rlw', force => true);
SELECT count(*) AS rate_rows FROM jobcap.queue_rates WHERE queue = 'rlw';

-- Bad arguments: 22023, nothing changed.
SELECT jobcap.create_queue('bad', rate_limit => -1);
SELECT jobcap.create_queue('bad', rate_limit => 1000000001);
SELECT jobcap.create_queue('bad', rate_limit => 1, rate_period => '0');
SELECT jobcap.create_queue('bad', rate_limit => 1, rate_period => '-1 second');
SELECT jobcap.create_queue('bad', rate_limit => 1, rate_period => '1 month');
SELECT jobcap.create_queue('bad', rate_limit => 1, rate_period => NULL);
SELECT jobcap.alter_queue('rl3', rate_period => '0');
SELECT count(*) AS bad_queues FROM jobcap.queues WHERE queue = 'bad';
SELECT rate_limit, rate_period FROM jobcap.queues WHERE queue = 'rl3';

-- drop_queue takes the window with it.
SELECT jobcap.drop_queue('rl3', force => true);
SELECT count(*) AS rate_rows FROM jobcap.queue_rates WHERE queue = 'rl3';
SELECT jobcap.drop_queue('rl', force => true);
SELECT jobcap.drop_queue('rl2', force => true);
