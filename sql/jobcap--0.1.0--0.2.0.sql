-- jobcap 0.1.0 -> 0.2.0. There is no jobcap--0.2.0.sql: CREATE EXTENSION jobcap runs
-- jobcap--0.1.0.sql and then this script (PostgreSQL follows the update path), so a new install
-- and an upgraded one get the same schema, and every 0.2.0 change is written once, here.
-- The rules of jobcap--0.1.0.sql hold: every name qualified, every function pins search_path,
-- none is SECURITY DEFINER; new objects get their privileges in the last section.
\echo Use "ALTER EXTENSION jobcap UPDATE TO '0.2.0'" to load this file. \quit

-- Backups, rolled-back claims, caps.

-- Smaller holes.
-- Intervals jobcap adds to a time (leases, backoffs, retry delays) may no longer have months, or
-- days and time of opposite signs (src/core/rules.cpp): PostgreSQL adds a month as a calendar
-- month and a day as a calendar day in the session's time zone, so '-2 mons +60 days 00:00:01'
-- passed as one second and made leases that expired at birth. Settings stored under 0.1.0 that
-- break the rule (queues' settings, running jobs' leases) are rewritten as the plain length of
-- time 0.1.0 checked them as: a month 30 days, a day 24 hours. The helper returns NULL for an
-- interval that keeps the rule; extract(epoch) counts a year as 365.25 days, so 5.25 days
-- (453600 s) per year are taken off. It exists only while this script runs. (Operators written
-- OPERATOR(pg_catalog.x) all bind alike, left to right: hence the parentheses.)
CREATE FUNCTION jobcap.upgrade_plain_span(x pg_catalog.interval)
RETURNS pg_catalog.interval
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, jobcap, pg_temp
AS $$
SELECT CASE
         WHEN pg_catalog.date_part('month', x) OPERATOR(pg_catalog.<>) 0
           OR pg_catalog.date_part('year', x) OPERATOR(pg_catalog.<>) 0
           OR (pg_catalog.date_part('day', x) OPERATOR(pg_catalog.*)
               pg_catalog.date_part('epoch', x OPERATOR(pg_catalog.-) pg_catalog.make_interval(
                   days => pg_catalog.date_part('day', x)::pg_catalog.int4)))
              OPERATOR(pg_catalog.<) 0
         THEN pg_catalog.make_interval(secs => pg_catalog.date_part('epoch', x)
                  OPERATOR(pg_catalog.-) (pg_catalog.date_part('year', x) OPERATOR(pg_catalog.*) 453600))
       END
$$;
UPDATE jobcap.queues
   SET lease = coalesce(jobcap.upgrade_plain_span(lease), lease),
       backoff_base = coalesce(jobcap.upgrade_plain_span(backoff_base), backoff_base),
       backoff_max = coalesce(jobcap.upgrade_plain_span(backoff_max), backoff_max)
 WHERE jobcap.upgrade_plain_span(lease) IS NOT NULL
    OR jobcap.upgrade_plain_span(backoff_base) IS NOT NULL
    OR jobcap.upgrade_plain_span(backoff_max) IS NOT NULL;
UPDATE jobcap.jobs SET lease = jobcap.upgrade_plain_span(lease)
 WHERE state OPERATOR(pg_catalog.=) 'running'::jobcap.job_state
   AND jobcap.upgrade_plain_span(lease) IS NOT NULL;
DROP FUNCTION jobcap.upgrade_plain_span(pg_catalog.interval);

-- dead_jobs shows what each dead job was given: the first 200 characters of its payload as
-- text, marked when cut (an operator should not need jobcap.jobs to learn which file died).
-- CREATE OR REPLACE VIEW keeps the columns of 0.1.0 and adds payload_excerpt at the end.
CREATE OR REPLACE VIEW jobcap.dead_jobs AS
SELECT j.job_id, j.queue, j.attempts, coalesce(j.max_attempts, q.max_attempts) AS max_attempts,
       j.finished_at AS died_at, j.enqueued_at, j.worker AS last_worker, j.dedupe_key,
       e.kind AS last_outcome, e.error AS last_error,
       h.errors, h.crashes, h.first_failure_at, h.last_failure_at,
       CASE WHEN pg_catalog.length(p.text) OPERATOR(pg_catalog.>) 200
            THEN pg_catalog.left(p.text, 200) OPERATOR(pg_catalog.||) '...'
            ELSE p.text END AS payload_excerpt
  FROM jobcap.jobs j
  LEFT JOIN jobcap.queues q ON q.queue OPERATOR(pg_catalog.=) j.queue
  LEFT JOIN LATERAL (SELECT e.kind, e.error FROM jobcap.job_errors e
                      WHERE e.job_id OPERATOR(pg_catalog.=) j.job_id
                      ORDER BY e.seq DESC LIMIT 1) e ON true
  LEFT JOIN LATERAL (SELECT count(*) FILTER (WHERE h.kind OPERATOR(pg_catalog.=) 'error') AS errors,
                            count(*) FILTER (WHERE h.kind OPERATOR(pg_catalog.=) 'lease_expired') AS crashes,
                            min(h.at) FILTER (WHERE h.kind OPERATOR(pg_catalog.<>) 'requeued') AS first_failure_at,
                            max(h.at) FILTER (WHERE h.kind OPERATOR(pg_catalog.<>) 'requeued') AS last_failure_at
                       FROM jobcap.job_errors h
                      WHERE h.job_id OPERATOR(pg_catalog.=) j.job_id) h ON true
  CROSS JOIN LATERAL (SELECT j.payload::pg_catalog.text AS text) p
 WHERE j.state OPERATOR(pg_catalog.=) 'dead'::jobcap.job_state;

-- Giving back an unstarted job: release_job.

-- Queue controls: pause and resume, max_running, periodic jobs, job output.

-- What the Celery and Django-Q adapters call.

-- The hot path's tables and indexes.

-- Privileges of the objects above (the same policy as 0.1.0: PUBLIC gets nothing).
