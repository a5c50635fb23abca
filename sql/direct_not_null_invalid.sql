-- A NOT NULL a DBA added without validating it (PostgreSQL 18: ADD CONSTRAINT ... NOT NULL ...
-- NOT VALID): rows may still hold NULL there, and the executor refuses every new version that
-- keeps it, whichever columns the statement sets. A settle on the direct path copies the NULL
-- into the new version and must be refused the same way. Before 18 a NOT NULL cannot be NOT
-- VALID; the same rows are protected there by a CHECK (dedupe_key IS NOT NULL) NOT VALID, which
-- the executor also applies to every new version, so the suite's output is the same on every
-- major (refused: the integrity error's class, 23). Expected as the SQL path answers.
\set VERBOSITY terse
CREATE FUNCTION pg_temp.refused(call text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE call;
    RETURN 'done';
EXCEPTION WHEN integrity_constraint_violation THEN
    RETURN 'refused';
END $$;
SELECT jobcap.create_queue('not_valid', max_attempts => 3);
SELECT count(*) AS enqueued FROM unnest(jobcap.enqueue_jobs('not_valid',
    ARRAY['{"n": 1}', '{"n": 2}']::jsonb[]));
SELECT job_id AS j1, fence AS f1 FROM jobcap.claim_job('not_valid', 'w') \gset
SELECT job_id AS j2, fence AS f2 FROM jobcap.claim_job('not_valid', 'w') \gset
DO $$
BEGIN
    IF current_setting('server_version_num')::int >= 180000 THEN
        EXECUTE 'ALTER TABLE jobcap.jobs ADD CONSTRAINT dedupe_key_given'
                ' NOT NULL dedupe_key NOT VALID';
    ELSE
        EXECUTE 'ALTER TABLE jobcap.jobs ADD CONSTRAINT dedupe_key_given'
                ' CHECK (dedupe_key IS NOT NULL) NOT VALID';
    END IF;
END $$;
-- The jobs have no dedupe key: every settle is refused, the jobs stay running.
SELECT pg_temp.refused(format('SELECT jobcap.complete_job(%s, %s)', :j1, :f1)) AS complete;
SELECT pg_temp.refused(format('SELECT jobcap.heartbeat(%s, %s)', :j1, :f1)) AS heartbeat;
SELECT pg_temp.refused(format('SELECT jobcap.fail_job(%s, %s, %L)', :j2, :f2, 'boom')) AS fail;
SELECT state, count(*) FROM jobcap.jobs WHERE queue = 'not_valid' GROUP BY state;
ALTER TABLE jobcap.jobs DROP CONSTRAINT dedupe_key_given;
SELECT jobcap.complete_job(:j1, :f1);
SELECT jobcap.drop_queue('not_valid', force => true);
