-- Smaller holes: intervals added to now() are as long as they look; LIMIT around a claim still
-- claims the whole batch; dead_jobs shows a payload excerpt.
\set VERBOSITY default
SET timezone = 'Europe/Berlin';

-- '-2 mons +60 days 00:00:01' is one second long as PostgreSQL compares intervals (a month is
-- 30 days), but now() + it lies a month or so in the past: a lease born expired.
SELECT interval '-2 mons +60 days 00:00:01' > interval '0' AS compares_positive,
       timestamptz '2026-05-01 12:00+02' + interval '-2 mons +60 days 00:00:01'
         AS added_to_may_first;
-- Refused wherever jobcap adds an interval to a time: queue settings, claims, heartbeats, retries.
SELECT jobcap.create_queue('holes_lease', lease => '-2 mons +60 days 00:00:01');
SELECT jobcap.create_queue('holes_lease', lease => '1 mon');
SELECT jobcap.create_queue('holes_lease', lease => '1 day -23:59:59');
\set VERBOSITY terse
SELECT jobcap.create_queue('holes_lease', backoff_base => '1 mon', backoff_max => '2 mons');
SELECT jobcap.create_queue('holes_lease', backoff_max => '-1 day +48:00:00');
SELECT jobcap.create_queue('holes_lease', lease => '1 year');
SELECT count(*) AS queues FROM jobcap.queues WHERE queue = 'holes_lease';
SELECT jobcap.create_queue('holes_lease', lease => '2 days 01:00:00', backoff_base => '0',
                           backoff_max => '0');
SELECT jobcap.alter_queue('holes_lease', lease => '-2 mons +60 days 00:00:01');
\echo :LAST_ERROR_SQLSTATE
SELECT jobcap.alter_queue('holes_lease', backoff_max => '1 mon');
SELECT lease FROM jobcap.queues WHERE queue = 'holes_lease';
SELECT jobcap.enqueue_job('holes_lease', '{"n": 1}') AS job \gset
SELECT count(*) FROM jobcap.claim_job('holes_lease', 'w', lease => '-2 mons +60 days 00:00:01');
SELECT count(*) FROM jobcap.claim_job_by_id(:job, 'w', lease => '1 day -1 second');
SELECT count(*) FROM jobcap.complete_and_claim(1, 1, 'holes_lease', 'w', 1, '1 mon');
SELECT fence FROM jobcap.claim_job('holes_lease', 'w', lease => '30 days') \gset
SELECT jobcap.heartbeat(:job, :fence, '-2 mons +60 days 00:00:01');
SELECT jobcap.heartbeat(:job, :fence, '1 day -00:00:01');
SELECT jobcap.fail_job(:job, :fence, 'later', retry_in => '1 mon');
SELECT jobcap.fail_job(:job, :fence, 'later', retry_in => '-1 day +25:00:00');
-- Days alone, time alone, or both of one sign: accepted, and never in the past.
SELECT jobcap.heartbeat(:job, :fence, '1 day 00:00:01') > now() AS extended;
SELECT jobcap.fail_job(:job, :fence, 'later', retry_in => '0') AS retried;
SELECT state, lease_expires_at IS NULL AS no_lease FROM jobcap.jobs WHERE job_id = :job;
\set VERBOSITY default

-- A claim is one statement that claims its whole batch before any row is returned: LIMIT (or a
-- cursor fetching fewer rows) cuts what the caller sees, not what was claimed. The unseen jobs
-- are running under a lease nobody holds, and each has burnt an attempt.
SELECT jobcap.create_queue('holes_limit', backoff_base => '0', backoff_max => '0');
SELECT count(jobcap.enqueue_job('holes_limit')) FROM generate_series(1, 3);
SELECT count(*) AS seen FROM (SELECT * FROM jobcap.claim_job('holes_limit', 'w', batch => 3) LIMIT 1) c;
SELECT state, attempts, count(*) FROM jobcap.jobs WHERE queue = 'holes_limit'
 GROUP BY state, attempts ORDER BY state;
BEGIN;
DECLARE c CURSOR FOR SELECT job_id IS NOT NULL AS claimed FROM jobcap.claim_job('holes_limit', 'w', batch => 3);
SELECT count(jobcap.enqueue_job('holes_limit')) FROM generate_series(1, 3);
FETCH 1 FROM c;
CLOSE c;
COMMIT;
SELECT state, attempts, count(*) FROM jobcap.jobs WHERE queue = 'holes_limit'
 GROUP BY state, attempts ORDER BY state;

-- dead_jobs shows which payload died: at most 200 characters, marked when cut.
SELECT jobcap.create_queue('holes_dead', max_attempts => 1);
SELECT jobcap.enqueue_job('holes_dead', '{"file": "scans/2026/12/invoice-0042.pdf"}') AS small \gset
SELECT jobcap.enqueue_job('holes_dead', jsonb_build_object('blob', repeat('x', 500))) AS big \gset
SELECT count(jobcap.fail_job(job_id, fence, 'poison'))
  FROM jobcap.claim_job('holes_dead', 'w', batch => 2);
SELECT job_id = :small AS small, left(payload_excerpt, 45) AS starts, right(payload_excerpt, 5) AS ends,
       length(payload_excerpt) AS chars
  FROM jobcap.dead_jobs WHERE queue = 'holes_dead' ORDER BY job_id;

-- ALTER EXTENSION jobcap UPDATE from 0.1.0 rewrites queue settings that break the interval rule
-- as plain lengths of time; settings that keep it are left as they were.
DROP EXTENSION jobcap;
CREATE EXTENSION jobcap VERSION '0.1.0';
SELECT jobcap.create_queue('holes_old'), jobcap.create_queue('holes_fine');
UPDATE jobcap.queues SET lease = '-2 mons +60 days 00:00:01', backoff_base = '1 day -1 hour',
                         backoff_max = '1 mon'
 WHERE queue = 'holes_old';
UPDATE jobcap.queues SET lease = '2 days 01:00:00' WHERE queue = 'holes_fine';
SELECT jobcap.enqueue_job('holes_old') AS old_job \gset
-- A job running under such a lease (set by hand: this library's claims need the 0.2.0 schema).
UPDATE jobcap.jobs SET state = 'running', attempts = 1, worker = 'w', claimed_at = now(),
                       lease = '1 year -360 days 00:00:05', lease_expires_at = now() + interval '1 hour'
 WHERE job_id = :old_job;
ALTER EXTENSION jobcap UPDATE TO '0.2.0';
SELECT queue, lease, backoff_base, backoff_max FROM jobcap.queues ORDER BY queue;
SELECT lease AS running_lease FROM jobcap.jobs WHERE job_id = :old_job;
SELECT count(*) AS helpers_left FROM pg_proc WHERE proname = 'upgrade_plain_span';
DROP EXTENSION jobcap;
CREATE EXTENSION jobcap;
