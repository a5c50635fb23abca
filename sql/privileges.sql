-- The privilege matrix: every function (and the tables) × roles × queues A and B, asserted.
-- Each call runs through dblink in a session of its own role, top-level (a claim refuses to
-- run in a subtransaction), after its fixture is committed. A denied call must change nothing.
\set VERBOSITY terse
CREATE EXTENSION dblink;
SELECT setval(pg_get_serial_sequence('jobcap.jobs', 'job_id'), 7000, false) IS NOT NULL AS ids_reset;

-- What the extension grants, before anyone is given anything: PUBLIC nothing, roles NOLOGIN,
-- every function SECURITY INVOKER with a pinned search_path (the eight below pin it in C around
-- the SQL they run: sql/direct_path.sql), the extension not trusted.
SELECT rolname, rolcanlogin, rolsuper, rolinherit FROM pg_roles
 WHERE rolname IN ('jobcap_worker', 'jobcap_operator') ORDER BY 1;
SELECT count(*) AS public_grants FROM (
    SELECT a.grantee FROM pg_class c, aclexplode(c.relacl) a
     WHERE c.relnamespace = 'jobcap'::regnamespace AND a.grantee = 0
    UNION ALL
    SELECT a.grantee FROM pg_proc p, aclexplode(p.proacl) a
     WHERE p.pronamespace = 'jobcap'::regnamespace AND a.grantee = 0
    UNION ALL
    SELECT a.grantee FROM pg_namespace n, aclexplode(n.nspacl) a
     WHERE n.nspname = 'jobcap' AND a.grantee = 0) g;
SELECT p.proname FROM pg_proc p WHERE p.pronamespace = 'jobcap'::regnamespace
   AND (p.prosecdef OR p.proconfig IS DISTINCT FROM '{"search_path=pg_catalog, jobcap, pg_temp"}')
 ORDER BY 1;
SELECT DISTINCT CASE WHEN c.relkind = 'S' THEN 'sequence' ELSE 'table' END AS kind, a.grantee::regrole, a.privilege_type
  FROM pg_class c, aclexplode(c.relacl) a
 WHERE c.relnamespace = 'jobcap'::regnamespace AND a.grantee <> c.relowner ORDER BY 1, 2, 3;
SELECT version, superuser, trusted FROM pg_available_extension_versions WHERE name = 'jobcap' ORDER BY version;

-- The cast: owner (the superuser running the tests); an operator; a worker granted queue A; a
-- worker granted nothing; a role with no jobcap role at all (what PUBLIC gets); a worker
-- whose group role is granted queue A; a NOINHERIT member of that group, given EXECUTE on the
-- worker functions directly (a NOINHERIT role uses its groups' grants only after SET ROLE).
CREATE ROLE regress_operator LOGIN IN ROLE jobcap_operator;
CREATE ROLE regress_worker_a LOGIN IN ROLE jobcap_worker;
CREATE ROLE regress_worker_none LOGIN IN ROLE jobcap_worker;
CREATE ROLE regress_public LOGIN;
CREATE ROLE regress_team NOLOGIN IN ROLE jobcap_worker;
CREATE ROLE regress_team_member LOGIN IN ROLE regress_team;
CREATE ROLE regress_noinherit LOGIN NOINHERIT IN ROLE regress_team;
GRANT USAGE ON SCHEMA jobcap TO regress_noinherit;
GRANT EXECUTE ON FUNCTION jobcap.enqueue_job, jobcap.enqueue_jobs, jobcap.claim_job,
    jobcap.claim_job_by_id, jobcap.complete_job, jobcap.complete_jobs, jobcap.fail_job, jobcap.heartbeat,
    jobcap.assert_fence, jobcap.complete_and_claim, jobcap.backoff, jobcap.release_job,
    jobcap.crash_job TO regress_noinherit;

SELECT jobcap.create_queue('qa', max_attempts => 50);
SELECT jobcap.create_queue('qb', max_attempts => 50);
SELECT jobcap.grant_queue('qa', 'regress_worker_a') AS granted,
       jobcap.grant_queue('qa', 'regress_worker_a') AS granted_again,
       jobcap.grant_queue('qa', 'regress_team') AS team_granted;
SELECT queue, grantee, granted_by = current_user AS by_owner FROM jobcap.queue_grants ORDER BY 1, 2;

CREATE TABLE matrix (
    who text, fn text, queue text, outcome text, message text, unchanged boolean,
    PRIMARY KEY (who, fn, queue));

-- Everything a call could change, as one value.
CREATE FUNCTION fingerprint() RETURNS text LANGUAGE sql AS $$
  SELECT md5(concat_ws('|',
    (SELECT string_agg(concat_ws(',', job_id, queue, state, attempts, max_attempts, fence, priority,
                                 lease_expires_at, worker, finished_at), ';' ORDER BY job_id) FROM jobcap.jobs),
    (SELECT string_agg(concat_ws(',', queue, max_attempts, lease, notify), ';' ORDER BY queue) FROM jobcap.queues),
    (SELECT string_agg(concat_ws(',', seq, job_id, kind, error), ';' ORDER BY seq) FROM jobcap.job_errors),
    (SELECT string_agg(concat_ws(',', queue, grantee), ';' ORDER BY queue, grantee) FROM jobcap.queue_grants)))
$$;

-- One call through a role's dblink connection: 'ok' or the SQLSTATE (dblink keeps the remote
-- SQLSTATE), and the message.
CREATE FUNCTION try_as(who text, call text, OUT outcome text, OUT message text)
LANGUAGE plpgsql AS $$
BEGIN
  IF call LIKE 'SELECT %' THEN
    PERFORM * FROM dblink(who, format('SELECT count(*) FROM (%s) s', call)) AS t(n bigint);
  ELSE
    PERFORM dblink_exec(who, call);
  END IF;
  outcome := 'ok';
EXCEPTION WHEN OTHERS THEN
  outcome := SQLSTATE;
  message := SQLERRM;
END $$;

-- A job of queue q in a known state, made by the owner (committed by the caller).
CREATE FUNCTION fixture_job(q text, state text, OUT job bigint, OUT fence bigint)
LANGUAGE plpgsql AS $$
BEGIN
  job := jobcap.enqueue_job(q);
  IF state IN ('running', 'cancelled') THEN
    SELECT c.fence INTO fence FROM jobcap.claim_job_by_id(job, 'fixture') c;
  END IF;
  IF state = 'cancelled' THEN
    PERFORM jobcap.cancel_job(job);
  END IF;
END $$;

-- The call each function gets on queue q, after preparing what it needs.
CREATE FUNCTION fixture_call(fn text, q text, n int) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  j record;
  other text := CASE q WHEN 'qa' THEN 'qa_' ELSE 'qb_' END || n;
BEGIN
  CASE fn
  WHEN 'enqueue_job' THEN RETURN format('SELECT jobcap.enqueue_job(%L)', q);
  WHEN 'enqueue_jobs' THEN RETURN format('SELECT jobcap.enqueue_jobs(%L, ARRAY[''{}''::jsonb])', q);
  WHEN 'claim_job' THEN
    PERFORM fixture_job(q, 'pending');
    RETURN format('SELECT * FROM jobcap.claim_job(%L, ''w'')', q);
  WHEN 'claim_job_by_id' THEN
    j := fixture_job(q, 'pending');
    RETURN format('SELECT * FROM jobcap.claim_job_by_id(%s, ''w'')', j.job);
  WHEN 'complete_job' THEN
    j := fixture_job(q, 'running');
    RETURN format('SELECT jobcap.complete_job(%s, %s)', j.job, j.fence);
  WHEN 'fail_job' THEN
    j := fixture_job(q, 'running');
    RETURN format('SELECT jobcap.fail_job(%s, %s, ''boom'')', j.job, j.fence);
  WHEN 'heartbeat' THEN
    j := fixture_job(q, 'running');
    RETURN format('SELECT jobcap.heartbeat(%s, %s)', j.job, j.fence);
  WHEN 'complete_jobs' THEN
    j := fixture_job(q, 'running');
    RETURN format('SELECT jobcap.complete_jobs(ARRAY[%s], ARRAY[%s])', j.job, j.fence);
  WHEN 'assert_fence' THEN
    j := fixture_job(q, 'running');
    RETURN format('SELECT jobcap.assert_fence(%s, %s)', j.job, j.fence);
  WHEN 'release_job' THEN
    j := fixture_job(q, 'running');
    RETURN format('SELECT jobcap.release_job(%s, %s)', j.job, j.fence);
  WHEN 'crash_job' THEN
    j := fixture_job(q, 'running');
    RETURN format('SELECT jobcap.crash_job(%s, %s, ''killed by signal 9'')', j.job, j.fence);
  WHEN 'snooze_job' THEN
    j := fixture_job(q, 'running');
    RETURN format('SELECT jobcap.snooze_job(%s, %s, ''1 minute'')', j.job, j.fence);
  WHEN 'time_out_job' THEN
    j := fixture_job(q, 'running');
    RETURN format('SELECT jobcap.time_out_job(%s, %s, ''time limit'')', j.job, j.fence);
  WHEN 'job_tree' THEN
    j := fixture_job(q, 'pending');
    RETURN format('SELECT * FROM jobcap.job_tree(%s)', j.job);
  WHEN 'complete_and_claim' THEN
    j := fixture_job(q, 'running');
    RETURN format('SELECT * FROM jobcap.complete_and_claim(%s, %s, %L, ''w'')', j.job, j.fence, q);
  WHEN 'job_result' THEN
    j := fixture_job(q, 'running');
    RETURN format('SELECT * FROM jobcap.job_result(%s)', j.job);
  WHEN 'cancel_job' THEN
    j := fixture_job(q, 'pending');
    RETURN format('SELECT jobcap.cancel_job(%s)', j.job);
  WHEN 'requeue_job' THEN
    j := fixture_job(q, 'cancelled');
    RETURN format('SELECT jobcap.requeue_job(%s, ''retry'')', j.job);
  WHEN 'create_queue' THEN RETURN format('SELECT jobcap.create_queue(%L)', other);
  WHEN 'alter_queue' THEN RETURN format('SELECT jobcap.alter_queue(%L, max_attempts => 60)', q);
  WHEN 'drop_queue' THEN
    -- A queue of its own, granted like q, so that dropping it leaves A and B in place.
    PERFORM jobcap.create_queue(other);
    IF q = 'qa' THEN
      PERFORM jobcap.grant_queue(other, 'regress_worker_a');
      PERFORM jobcap.grant_queue(other, 'regress_team');
    END IF;
    RETURN format('SELECT jobcap.drop_queue(%L)', other);
  WHEN 'grant_queue' THEN RETURN format('SELECT jobcap.grant_queue(%L, ''regress_public'')', q);
  WHEN 'revoke_queue' THEN
    PERFORM jobcap.grant_queue(q, 'regress_public');
    RETURN format('SELECT jobcap.revoke_queue(%L, ''regress_public'')', q);
  WHEN 'reap_jobs' THEN RETURN 'SELECT * FROM jobcap.reap_jobs()';
  WHEN 'statements' THEN RETURN 'SELECT * FROM jobcap.statements()';
  WHEN 'backoff' THEN RETURN 'SELECT jobcap.backoff(1, ''1 second'', ''1 minute'')';
  WHEN 'select jobs' THEN RETURN format('SELECT * FROM jobcap.jobs WHERE queue = %L', q);
  WHEN 'select queues' THEN RETURN format('SELECT * FROM jobcap.queues WHERE queue = %L', q);
  WHEN 'select job_errors' THEN RETURN format('SELECT * FROM jobcap.job_errors WHERE queue = %L', q);
  WHEN 'select queue_grants' THEN RETURN format('SELECT * FROM jobcap.queue_grants WHERE queue = %L', q);
  WHEN 'select queue_stats' THEN RETURN format('SELECT * FROM jobcap.queue_stats WHERE queue = %L', q);
  WHEN 'select dead_jobs' THEN RETURN format('SELECT * FROM jobcap.dead_jobs WHERE queue = %L', q);
  WHEN 'update jobs' THEN
    RETURN format('UPDATE jobcap.jobs SET priority = priority WHERE queue = %L', q);
  WHEN 'insert jobs' THEN
    RETURN format('INSERT INTO jobcap.jobs (queue) VALUES (%L)', q);
  WHEN 'nextval fences' THEN RETURN 'SELECT nextval(''jobcap.fences'')';
  END CASE;
END $$;

CREATE TABLE matrix_fns (fn text PRIMARY KEY, ord numeric, per_queue boolean);
INSERT INTO matrix_fns VALUES
  ('enqueue_job', 1, true), ('enqueue_jobs', 2, true), ('claim_job', 3, true),
  ('claim_job_by_id', 4, true), ('complete_job', 5, true), ('complete_jobs', 5.5, true), ('fail_job', 6, true),
  ('heartbeat', 7, true), ('assert_fence', 8, true), ('release_job', 8.3, true),
  ('crash_job', 8.6, true), ('snooze_job', 8.7, true), ('time_out_job', 8.8, true),
  ('complete_and_claim', 9, true), ('job_result', 9.5, true),
  ('create_queue', 10, true), ('alter_queue', 11, true), ('drop_queue', 12, true),
  ('cancel_job', 13, true), ('job_tree', 13.5, true), ('requeue_job', 14, true),
  ('reap_jobs', 15, false),
  ('statements', 16, false), ('backoff', 17, false), ('grant_queue', 18, true),
  ('revoke_queue', 19, true), ('select jobs', 20, true), ('select queues', 21, true),
  ('select job_errors', 22, true), ('select queue_grants', 23, true),
  ('select queue_stats', 24, true), ('select dead_jobs', 25, true), ('update jobs', 26, true),
  ('insert jobs', 27, true), ('nextval fences', 28, false);
CREATE TABLE matrix_roles (who text PRIMARY KEY, ord int);
INSERT INTO matrix_roles VALUES (current_user, 1), ('regress_operator', 2), ('regress_worker_a', 3),
  ('regress_worker_none', 4), ('regress_public', 5), ('regress_team_member', 6),
  ('regress_noinherit', 7);

CREATE PROCEDURE run_matrix() LANGUAGE plpgsql AS $$
DECLARE
  r record;
  call text;
  before text;
  res record;
  n int := 0;
BEGIN
  FOR r IN SELECT w.who, f.fn, q.queue
             FROM matrix_roles w, matrix_fns f,
                  LATERAL (SELECT unnest(CASE WHEN f.per_queue THEN ARRAY['qa', 'qb'] ELSE ARRAY['-'] END)) q(queue)
            ORDER BY w.ord, f.ord, q.queue
  LOOP
    n := n + 1;
    call := fixture_call(r.fn, CASE r.queue WHEN '-' THEN 'qa' ELSE r.queue END, n);
    COMMIT;
    before := fingerprint();
    res := try_as(r.who, call);
    INSERT INTO matrix VALUES (r.who, r.fn, r.queue, res.outcome, res.message,
                               fingerprint() = before);
    -- Undo what an allowed grant did, so later rows see the same grants.
    IF r.fn = 'grant_queue' THEN
      PERFORM jobcap.revoke_queue(r.queue, 'regress_public');
    END IF;
    COMMIT;
  END LOOP;
END $$;

SELECT count(dblink_connect(w.who, format('dbname=%s user=%s host=%s port=%s', current_database(), w.who,
                                          split_part(current_setting('unix_socket_directories'), ',', 1),
                                          current_setting('port')))) AS connections
  FROM matrix_roles w;
CALL run_matrix();

-- The matrix: ok, or the SQLSTATE of the refusal (42501 everywhere).
SELECT f.fn AS "function", m.queue,
       max(m.outcome) FILTER (WHERE w.ord = 1) AS owner,
       max(m.outcome) FILTER (WHERE w.ord = 2) AS operator,
       max(m.outcome) FILTER (WHERE w.ord = 3) AS worker_a,
       max(m.outcome) FILTER (WHERE w.ord = 4) AS worker_none,
       max(m.outcome) FILTER (WHERE w.ord = 5) AS public,
       max(m.outcome) FILTER (WHERE w.ord = 6) AS team_member,
       max(m.outcome) FILTER (WHERE w.ord = 7) AS noinherit
  FROM matrix m JOIN matrix_fns f USING (fn) JOIN matrix_roles w USING (who)
 GROUP BY f.ord, f.fn, m.queue ORDER BY f.ord, m.queue;

-- The same matrix against the policy, written down independently: no row may differ.
CREATE FUNCTION policy(who text, fn text, queue text) RETURNS text LANGUAGE sql AS $$
  SELECT CASE
    WHEN who = current_user THEN 'ok'
    WHEN fn IN ('update jobs', 'insert jobs', 'nextval fences', 'grant_queue', 'revoke_queue') THEN '42501'
    WHEN who = 'regress_operator' THEN
      CASE WHEN fn IN ('create_queue', 'alter_queue', 'drop_queue', 'cancel_job', 'requeue_job',
                       'reap_jobs', 'statements', 'backoff', 'job_tree') OR fn LIKE 'select %' THEN 'ok'
           ELSE '42501' END
    WHEN who IN ('regress_worker_a', 'regress_team_member') THEN
      CASE WHEN fn = 'backoff' THEN 'ok'
           WHEN fn IN ('enqueue_job', 'enqueue_jobs', 'claim_job', 'claim_job_by_id', 'complete_job',
                       'complete_jobs', 'fail_job', 'heartbeat', 'assert_fence', 'complete_and_claim',
                       'release_job', 'crash_job', 'job_result', 'cancel_job', 'snooze_job',
                       'time_out_job', 'job_tree')
                AND queue = 'qa' THEN 'ok'
           ELSE '42501' END
    WHEN who IN ('regress_worker_none', 'regress_noinherit') THEN
      CASE WHEN fn = 'backoff' THEN 'ok' ELSE '42501' END
    ELSE '42501'
  END
$$;
SELECT who, fn, queue, outcome, policy(who, fn, queue) AS expected, message
  FROM matrix WHERE outcome IS DISTINCT FROM policy(who, fn, queue);
-- Denied calls changed nothing (allowed ones mostly did).
SELECT who, fn, queue FROM matrix WHERE outcome <> 'ok' AND NOT unchanged;
SELECT count(*) FILTER (WHERE outcome = 'ok') AS allowed, count(*) FILTER (WHERE outcome <> 'ok') AS denied,
       count(*) FILTER (WHERE outcome <> 'ok' AND unchanged) AS denied_unchanged
  FROM matrix;

-- Who refused: PostgreSQL (no EXECUTE, no USAGE) or jobcap (the grant, the role).
SELECT DISTINCT regexp_replace(message, '\d+', 'N', 'g') AS message FROM matrix
 WHERE outcome <> 'ok' ORDER BY 1;

-- A denied caller cannot tell a job of another queue from a job that does not exist: the same
-- SQLSTATE and message. A privileged caller is told the job does not exist.
SELECT * FROM fixture_job('qb', 'running') \gset b_
SELECT f.n, t.outcome, regexp_replace(t.message, '\d+', 'N', 'g') AS message
  FROM (VALUES (1, format('complete_job(%s, %s)', :b_job, :b_fence)), (2, 'complete_job(999999, 1)'),
               (3, format('heartbeat(%s, %s)', :b_job, :b_fence)), (4, 'heartbeat(999999, 1)'),
               (5, format('claim_job_by_id(%s, ''w'')', :b_job)), (6, 'claim_job_by_id(999999, ''w'')'),
               (7, format('assert_fence(%s, 0)', :b_job)), (8, 'assert_fence(999999, 0)'),
               (9, format('complete_jobs(ARRAY[%s], ARRAY[%s])', :b_job, :b_fence)),
               (10, 'complete_jobs(ARRAY[999999], ARRAY[1])')) f(n, call),
       try_as('regress_worker_a', format('SELECT jobcap.%s', f.call)) t
 ORDER BY f.n;
SELECT state, fence = :b_fence AS same_fence FROM jobcap.jobs WHERE job_id = :b_job;
SELECT (try_as(current_user, 'SELECT jobcap.complete_job(999999, 1)')).*;
SELECT (try_as('regress_worker_a', 'SELECT * FROM jobcap.claim_job(''no such queue'', ''w'')')).*;
SELECT (try_as(current_user, 'SELECT * FROM jobcap.claim_job(''no such queue'', ''w'')')).*;

-- A revoked worker's running job: its next fenced call is refused, and the job waits for the
-- reaper (its lease is the only way out), like any worker that stopped reporting.
SELECT * FROM fixture_job('qa', 'pending') \gset a_
SELECT count(*) FROM dblink('regress_worker_a', format('SELECT job_id, fence FROM jobcap.claim_job_by_id(%s, ''w'')', :a_job))
    AS t(job bigint, fence bigint);
SELECT fence AS a_fence FROM jobcap.jobs WHERE job_id = :a_job \gset
SELECT jobcap.revoke_queue('qa', 'regress_worker_a') AS revoked;
SELECT (try_as('regress_worker_a', format('SELECT jobcap.complete_job(%s, %s)', :a_job, :a_fence))).outcome;
SELECT state, fence = :a_fence AS same_fence FROM jobcap.jobs WHERE job_id = :a_job;
SELECT jobcap.grant_queue('qa', 'regress_worker_a') AS regranted;
SELECT (try_as('regress_worker_a', format('SELECT jobcap.complete_job(%s, %s)', :a_job, :a_fence))).outcome;

-- The second gate: a role given EXECUTE on every function of the schema (a common shortcut)
-- still cannot manage queues, change grants, or work a queue it was not granted.
CREATE ROLE regress_sloppy LOGIN;
GRANT USAGE ON SCHEMA jobcap TO regress_sloppy;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA jobcap TO regress_sloppy;
SELECT dblink_connect('regress_sloppy', format('dbname=%s user=regress_sloppy host=%s port=%s', current_database(),
                      split_part(current_setting('unix_socket_directories'), ',', 1), current_setting('port')));
SELECT * FROM fixture_job('qa', 'running') \gset s_
SELECT f.fn, t.outcome, t.message
  FROM (VALUES (1, 'cancel_job', format('SELECT jobcap.cancel_job(%s)', :s_job)),
               (2, 'create_queue', 'SELECT jobcap.create_queue(''sloppy'')'),
               (3, 'reap_jobs', 'SELECT * FROM jobcap.reap_jobs()'),
               (4, 'statements', 'SELECT * FROM jobcap.statements()'),
               (5, 'grant_queue', 'SELECT jobcap.grant_queue(''qa'', ''regress_sloppy'')'),
               (6, 'claim_job', 'SELECT * FROM jobcap.claim_job(''qa'', ''w'')'),
               (7, 'complete_job', format('SELECT jobcap.complete_job(%s, %s)', :s_job, :s_fence)),
               (8, 'enqueue_job', 'SELECT jobcap.enqueue_job(''qa'')')) f(n, fn, call),
       try_as('regress_sloppy', f.call) t
 ORDER BY f.n;
SELECT dblink_disconnect('regress_sloppy');
DROP OWNED BY regress_sloppy;
DROP ROLE regress_sloppy;

-- Grants: only existing roles (taken literally), revocable after the role is gone, gone with
-- their queue.
SELECT jobcap.grant_queue('qa', 'no_such_role');
SELECT jobcap.grant_queue('qa', 'PUBLIC');
SELECT jobcap.grant_queue('qa', 'Regress_Worker_A');
SELECT jobcap.grant_queue('qa', '');
SELECT jobcap.grant_queue('qa', repeat('r', 64));
SELECT jobcap.grant_queue('qa', NULL);
SELECT jobcap.grant_queue('no such queue', 'regress_worker_a');
-- create_missing: a worker role's queue and its grant in one call, before either existed, with
-- create_queue's defaults; again, it changes nothing. A bad role creates no queue.
SELECT jobcap.grant_queue('qnew', 'regress_worker_a', create_missing => true) AS granted;
SELECT max_attempts = current_setting('jobcap.default_max_attempts')::int AS default_cap, lease,
       backoff_base, backoff_max, notify, max_running FROM jobcap.queues WHERE queue = 'qnew';
SELECT jobcap.grant_queue('qnew', 'regress_worker_a', create_missing => true) AS granted_again;
SELECT jobcap.grant_queue('qnew2', 'no_such_role', create_missing => true);
SELECT count(*) AS qnew2_created FROM jobcap.queues WHERE queue = 'qnew2';
SET ROLE regress_worker_a;
SELECT jobcap.enqueue_job('qnew') > 0 AS enqueued;
SELECT count(*) AS claimed FROM jobcap.claim_job('qnew', 'w');
\set VERBOSITY sqlstate
SELECT jobcap.grant_queue('qnew3', 'regress_worker_a', create_missing => true);
\set VERBOSITY terse
RESET ROLE;
SELECT count(*) AS qnew3_created FROM jobcap.queues WHERE queue = 'qnew3';
SELECT jobcap.revoke_queue('no such queue', 'regress_worker_a');
SELECT jobcap.revoke_queue('qa', 'regress_worker_none') AS revoked_nothing;
CREATE ROLE regress_gone;
SELECT jobcap.grant_queue('qb', 'regress_gone');
DROP ROLE regress_gone;
SELECT jobcap.revoke_queue('qb', 'regress_gone') AS revoked_dropped_role;
SELECT jobcap.create_queue('qc');
SELECT jobcap.grant_queue('qc', 'regress_worker_a');
SELECT jobcap.drop_queue('qc');
SELECT count(*) AS grants_of_dropped_queue FROM jobcap.queue_grants WHERE queue = 'qc';

-- The refusal names the function and says why in a sentence (the DETAIL, shown with
-- VERBOSITY default), for a queue and for a job of a queue not granted.
\set VERBOSITY default
SELECT set_config('regress.qb_job', jobcap.enqueue_job('qb', '{}')::text, false) IS NOT NULL AS enqueued;
SET ROLE regress_worker_a;
SELECT job_id FROM jobcap.claim_job('qb', 'w');
DO $$
DECLARE detail text;
BEGIN
  PERFORM jobcap.heartbeat(current_setting('regress.qb_job')::bigint, 1);
EXCEPTION WHEN insufficient_privilege THEN
  GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL;
  RAISE NOTICE 'heartbeat of a job in qb: %', detail;  -- the job's id varies with the suites run before
END $$;
RESET ROLE;
\set VERBOSITY terse

-- Clean up: connections, roles (cluster-wide), queues.
SELECT count(dblink_disconnect(who)) AS disconnected FROM matrix_roles;
DROP PROCEDURE run_matrix();
DROP FUNCTION policy(text, text, text);
DROP FUNCTION fixture_call(text, text, int);
DROP FUNCTION fixture_job(text, text);
DROP FUNCTION try_as(text, text);
DROP FUNCTION fingerprint();
DROP TABLE matrix, matrix_fns, matrix_roles;
DROP EXTENSION dblink;
SELECT count(*) AS dropped FROM (SELECT jobcap.drop_queue(queue, force => true) FROM jobcap.queues) d;
DROP OWNED BY regress_noinherit;
DROP ROLE regress_operator, regress_worker_a, regress_worker_none, regress_public,
          regress_team_member, regress_noinherit, regress_team;
