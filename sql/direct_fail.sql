-- fail_job and crash_job on the direct path: the job's new state and its history in
-- jobcap.job_errors are those the SQL statement writes. Each check runs the same calls once
-- per path, on two queues, and compares jobs and history (all but ids, fences and times).
\set VERBOSITY terse
SELECT jobcap.create_queue('fail_direct', max_attempts => 3, backoff_base => '1 hour', backoff_max => '2 hours');
SELECT jobcap.create_queue('fail_sql', max_attempts => 3, backoff_base => '1 hour', backoff_max => '2 hours');
-- The default, set here because regress_sql runs every suite with jobcap.hot_path = sql.
SET jobcap.hot_path = direct;

CREATE FUNCTION public.fail_same() RETURNS TABLE (jobs bigint, history bigint, differing bigint)
LANGUAGE sql AS $$
    WITH d AS (SELECT row_number() OVER (ORDER BY job_id) AS n,
                      to_jsonb(j) - '{job_id,queue,run_at,enqueued_at,fence,first_claimed_at,claimed_at,finished_at}'::text[]
                        || jsonb_build_object('later', run_at > now(), 'finished', finished_at IS NOT NULL) AS r
                 FROM jobcap.jobs j WHERE queue = 'fail_direct'),
         s AS (SELECT row_number() OVER (ORDER BY job_id) AS n,
                      to_jsonb(j) - '{job_id,queue,run_at,enqueued_at,fence,first_claimed_at,claimed_at,finished_at}'::text[]
                        || jsonb_build_object('later', run_at > now(), 'finished', finished_at IS NOT NULL) AS r
                 FROM jobcap.jobs j WHERE queue = 'fail_sql'),
         hd AS (SELECT row_number() OVER (ORDER BY e.seq) AS n, to_jsonb(e) - '{seq,job_id,queue,fence,at}'::text[] AS r
                  FROM jobcap.job_errors e WHERE queue = 'fail_direct'),
         hs AS (SELECT row_number() OVER (ORDER BY e.seq) AS n, to_jsonb(e) - '{seq,job_id,queue,fence,at}'::text[] AS r
                  FROM jobcap.job_errors e WHERE queue = 'fail_sql')
    SELECT (SELECT count(*) FROM d), (SELECT count(*) FROM hd),
           (SELECT count(*) FROM d FULL JOIN s USING (n) WHERE d.r IS DISTINCT FROM s.r) +
           (SELECT count(*) FROM hd FULL JOIN hs USING (n) WHERE hd.r IS DISTINCT FROM hs.r)
$$;
-- Runs calls (a SELECT with %q for the queue and %p for the path) on each path in turn.
CREATE PROCEDURE public.fail_both(calls text) LANGUAGE plpgsql AS $$
BEGIN
    SET LOCAL jobcap.hot_path = direct;
    EXECUTE replace(replace(calls, '%q', 'fail_direct'), '%p', 'direct');
    SET LOCAL jobcap.hot_path = sql;
    EXECUTE replace(replace(calls, '%q', 'fail_sql'), '%p', 'sql');
END $$;
-- Claims the queue's next job and settles it with call (%j and %f: its job and fence).
CREATE FUNCTION public.fail_next(queue text, call text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE r record; s text;
BEGIN
    SELECT job_id, fence INTO r FROM jobcap.claim_job(queue, 'w');
    IF r.job_id IS NULL THEN RETURN 'nothing to claim'; END IF;
    EXECUTE 'SELECT (' || replace(replace(call, '%j', r.job_id::text), '%f', r.fence::text) || ')::text'
      INTO s;
    RETURN s;
END $$;

-- 1. A failure, a crash, the last attempt: the paths (DEBUG2), states, history.
CALL public.fail_both($$SELECT jobcap.enqueue_jobs('%q', ARRAY['{"a": 1}', '{"a": 2}']::jsonb[])$$);
SET client_min_messages = debug2;
CALL public.fail_both($$SELECT public.fail_next('%q', 'jobcap.fail_job(%j, %f, ''boom'', retry_in => ''0'')')$$);
RESET client_min_messages;
CALL public.fail_both($$SELECT public.fail_next('%q', 'jobcap.crash_job(%j, %f, ''oom'')')$$);
CALL public.fail_both($$SELECT public.fail_next('%q', 'jobcap.fail_job(%j, %f, NULL)')$$);
SELECT * FROM public.fail_same();
SELECT state, attempts, run_at > now() + interval '29 minutes' AS backed_off FROM jobcap.jobs
 WHERE queue = 'fail_direct' ORDER BY job_id;
SELECT attempt, kind, error, worker FROM jobcap.job_errors WHERE queue = 'fail_direct' ORDER BY seq;
-- The last attempt: the job dies (max_attempts 3; retry_in 0 makes the next claims due).
UPDATE jobcap.jobs SET run_at = now() - interval '1 minute' WHERE queue IN ('fail_direct', 'fail_sql');
CALL public.fail_both($$SELECT public.fail_next('%q', 'jobcap.fail_job(%j, %f, ''again'', retry_in => ''0'')')$$);
CALL public.fail_both($$SELECT public.fail_next('%q', 'jobcap.fail_job(%j, %f, ''again'', retry_in => ''0'')')$$);
CALL public.fail_both($$SELECT public.fail_next('%q', 'jobcap.fail_job(%j, %f, ''last'')')$$);
SELECT * FROM public.fail_same();
SELECT state, attempts, finished_at IS NOT NULL AS finished FROM jobcap.jobs
 WHERE queue = 'fail_direct' ORDER BY job_id;

-- 2. A stale fence: the same error (JC001), nothing written.
SELECT job_id AS j FROM jobcap.jobs WHERE queue = 'fail_direct' ORDER BY job_id LIMIT 1 \gset
\set VERBOSITY sqlstate
SELECT jobcap.fail_job(:j, 1, 'stale');
SELECT jobcap.crash_job(:j, 1, 'stale');
\set VERBOSITY terse
SELECT count(*) AS stale_rows FROM jobcap.job_errors WHERE error = 'stale';

-- 3. How much history is kept: jobcap.error_history rows per job, the newest; 0 keeps none.
SELECT jobcap.alter_queue('fail_direct', max_attempts => 20), jobcap.alter_queue('fail_sql', max_attempts => 20);
CALL public.fail_both($$SELECT jobcap.enqueue_job('%q', '{"h": 1}', priority => 9)$$);
SET jobcap.error_history = 2;
CALL public.fail_both($$SELECT public.fail_next('%q', 'jobcap.fail_job(%j, %f, ''h1'', retry_in => ''0'')')$$);
CALL public.fail_both($$SELECT public.fail_next('%q', 'jobcap.fail_job(%j, %f, ''h2'', retry_in => ''0'')')$$);
CALL public.fail_both($$SELECT public.fail_next('%q', 'jobcap.crash_job(%j, %f, ''h3'')')$$);
SELECT array_agg(error ORDER BY seq) AS kept FROM jobcap.job_errors e JOIN jobcap.jobs j USING (job_id)
 WHERE j.queue = 'fail_direct' AND j.priority = 9;
SELECT * FROM public.fail_same();
UPDATE jobcap.jobs SET run_at = now() - interval '1 minute' WHERE queue IN ('fail_direct', 'fail_sql');
SET jobcap.error_history = 0;
CALL public.fail_both($$SELECT public.fail_next('%q', 'jobcap.fail_job(%j, %f, ''h4'', retry_in => ''0'')')$$);
RESET jobcap.error_history;
SELECT count(*) AS kept FROM jobcap.job_errors e JOIN jobcap.jobs j USING (job_id)
 WHERE j.queue = 'fail_direct' AND j.priority = 9;
SELECT * FROM public.fail_same();

-- 4. A budget granted by requeue_job holds past the queue's cap (cap_epoch): a retry, not death.
SELECT jobcap.alter_queue('fail_direct', max_attempts => 1), jobcap.alter_queue('fail_sql', max_attempts => 1);
CALL public.fail_both($$SELECT jobcap.cancel_job((SELECT max(job_id) FROM jobcap.jobs WHERE queue = '%q'))$$);
CALL public.fail_both($$SELECT jobcap.requeue_job((SELECT max(job_id) FROM jobcap.jobs WHERE queue = '%q'), 'budget', 3)$$);
CALL public.fail_both($$SELECT public.fail_next('%q', 'jobcap.fail_job(%j, %f, ''b1'', retry_in => ''0'')')$$);
SELECT state, attempts, max_attempts FROM jobcap.jobs WHERE queue = 'fail_direct' AND priority = 9;
SELECT * FROM public.fail_same();

-- 5. job_errors as a DBA changed it. A CHECK constraint of built-in functions: the direct path
-- checks it as the executor does (the same error, nothing written); a default of a constant
-- is written; a trigger sends the call to the SQL path, where it fires.
UPDATE jobcap.jobs SET run_at = now() - interval '1 minute' WHERE queue IN ('fail_direct', 'fail_sql');
SELECT jobcap.alter_queue('fail_direct', max_attempts => 20), jobcap.alter_queue('fail_sql', max_attempts => 20);
ALTER TABLE jobcap.job_errors ADD CONSTRAINT fail_short CHECK (length(error) < 10) NOT VALID;
ALTER TABLE jobcap.job_errors ADD COLUMN fail_source text DEFAULT 'jobcap';
SET client_min_messages = debug2;
SELECT public.fail_next('fail_direct', 'jobcap.fail_job(%j, %f, ''far too long an error'', retry_in => ''0'')');
RESET client_min_messages;
SET jobcap.hot_path = sql;
SELECT public.fail_next('fail_sql', 'jobcap.fail_job(%j, %f, ''far too long an error'', retry_in => ''0'')');
SET jobcap.hot_path = direct;
CALL public.fail_both($$SELECT public.fail_next('%q', 'jobcap.fail_job(%j, %f, ''short'', retry_in => ''0'')')$$);
SELECT error, fail_source FROM jobcap.job_errors WHERE queue = 'fail_direct' ORDER BY seq DESC LIMIT 1;
SELECT * FROM public.fail_same();
ALTER TABLE jobcap.job_errors DROP CONSTRAINT fail_short, DROP COLUMN fail_source;
CREATE FUNCTION public.fail_seen() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE NOTICE 'history: % %', NEW.kind, NEW.error;
    RETURN NEW;
END $$;
CREATE TRIGGER fail_seen BEFORE INSERT ON jobcap.job_errors FOR EACH ROW EXECUTE FUNCTION public.fail_seen();
SET client_min_messages = debug2;
CALL public.fail_both($$SELECT public.fail_next('%q', 'jobcap.fail_job(%j, %f, ''seen'', retry_in => ''0'')')$$);
RESET client_min_messages;
DROP TRIGGER fail_seen ON jobcap.job_errors;
DROP FUNCTION public.fail_seen();
-- A queue whose backoff a DBA set out of range by hand: the SQL path's jobcap.backoff refuses
-- it, and so does the direct path.
CALL public.fail_both($$SELECT jobcap.enqueue_job('%q', '{"x": 1}', priority => 10)$$);
UPDATE jobcap.queues SET backoff_max = '20 years' WHERE queue IN ('fail_direct', 'fail_sql');
SELECT public.fail_next('fail_direct', 'jobcap.fail_job(%j, %f, ''x'')');
SET jobcap.hot_path = sql;
SELECT public.fail_next('fail_sql', 'jobcap.fail_job(%j, %f, ''x'')');
SET jobcap.hot_path = direct;
SELECT * FROM public.fail_same();

SELECT jobcap.drop_queue('fail_direct', force => true), jobcap.drop_queue('fail_sql', force => true);
DROP PROCEDURE public.fail_both(text);
DROP FUNCTION public.fail_same(), public.fail_next(text, text);
RESET jobcap.hot_path;
