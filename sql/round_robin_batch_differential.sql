-- Batches of round-robin claims, direct path against SQL path (two queues built alike, 'da' claimed
-- with jobcap.hot_path = direct, 'sa' with sql): returned jobs in order, attempts, caps, turn, table state.
\set seed 0.41
\set cases 150
\set VERBOSITY terse
SELECT setseed(:seed);
SET my.cases = :cases;
SELECT jobcap.create_queue('da', fairness => 'round_robin', max_attempts => 3);
SELECT jobcap.create_queue('sa', fairness => 'round_robin', max_attempts => 3);
CREATE TEMP TABLE spec (seq int, k text, pri int, run_at timestamptz, attempts int, max_attempts int,
                        start_by timestamptz, first_claimed_at timestamptz);
CREATE TEMP TABLE res (case_no int, claim_no int, batch int, how text, turn_before text,
                       d text, s text, d_turn text, s_turn text, d_state text, s_state text);
CREATE FUNCTION pg_temp.state(q text) RETURNS text LANGUAGE sql AS $$
  SELECT string_agg(format('%s:%s:%s:%s:%s:%s', payload->>'seq', state, attempts, worker,
                           first_claimed_at IS NULL, lease_expires_at - claimed_at), ',' ORDER BY (payload->>'seq')::int)
    FROM jobcap.jobs WHERE queue = q $$;
DO $$
DECLARE
    pool text[] := ARRAY['', 'a', 'A', 'aa', 'aA', 'b', 'B', 'b ', 'b  ', 'b b', 'é', 'e', 'E', 'ß', 'z',
                         't1','t2','t3','t4','t5','t6','t7','t8','t9','t10','t11','t12','t13','t14',
                         't15','t16','t17','t18','t19','t20','t21','t22','t23','t24','t25','t26',
                         't27','t28','t29','t30','t31','t32','t33','t34','t35', repeat('k', 900)];
    odd_turns text[] := ARRAY['a0', ' ', '0', 'zzz', '~', 'b   ', 't', 't10 ', 'Z'];
    keys text[]; nk int; b int; turn_key text; turn_before text;
    d text; s text; how text; fin record; lease interval;
BEGIN
    FOR c IN 1..current_setting('my.cases')::int LOOP
        DELETE FROM jobcap.jobs WHERE queue IN ('da', 'sa');
        DELETE FROM jobcap.queue_turns WHERE queue IN ('da', 'sa');
        nk := CASE floor(random() * 3)::int WHEN 0 THEN floor(random() * 4)::int
                   WHEN 1 THEN floor(random() * 12)::int ELSE floor(random() * 45)::int END;
        SELECT coalesce(array_agg(p ORDER BY random()), '{}') INTO keys
          FROM (SELECT p FROM unnest(pool) p ORDER BY random() LIMIT nk) x;
        DELETE FROM spec;
        INSERT INTO spec
        SELECT row_number() OVER (ORDER BY random()), x.k, floor(random() * 3)::int,
               CASE WHEN random() < 0.1 THEN now() + interval '1 day'
                    ELSE now() - interval '1 minute' * floor(random() * 3) END,
               CASE WHEN random() < 0.05 THEN 3 ELSE 0 END,
               CASE WHEN random() < 0.05 THEN 1 WHEN random() < 0.1 THEN NULL WHEN random() < 0.1 THEN 5 ELSE 3 END,
               CASE WHEN random() < 0.05 THEN now() - interval '1 minute' END,
               CASE WHEN random() < 0.03 THEN now() - interval '1 hour' END
          FROM (SELECT k, CASE WHEN random() < 0.3 THEN floor(random() * 3)::int
                               WHEN random() < 0.5 THEN floor(random() * 9)::int
                               ELSE floor(random() * 40)::int END AS n
                  FROM unnest(keys || ARRAY[NULL::text]) k) x, generate_series(1, x.n) g;
        UPDATE spec SET attempts = least(attempts, coalesce(max_attempts, 3));
        ALTER TABLE spec ADD COLUMN IF NOT EXISTS ep int;
        UPDATE spec SET ep = floor(random() * 3)::int;
        INSERT INTO jobcap.jobs (queue, concurrency_key, priority, run_at, attempts, max_attempts, start_by, first_claimed_at, payload)
        SELECT q, k, pri, run_at, attempts, max_attempts, start_by, first_claimed_at, jsonb_build_object('seq', seq)
          FROM spec, unnest(ARRAY['da', 'sa']) q ORDER BY q, seq;
        UPDATE jobcap.jobs j SET cap_epoch = CASE s.ep WHEN 0 THEN NULL WHEN 1 THEN q.cap_epoch ELSE q.cap_epoch - 1 END
          FROM spec s, jobcap.queues q WHERE j.queue IN ('da', 'sa') AND q.queue = j.queue AND (j.payload->>'seq')::int = s.seq;
        turn_key := CASE floor(random() * 4)::int WHEN 0 THEN NULL
                 WHEN 1 THEN keys[1 + floor(random() * greatest(array_length(keys, 1), 1))::int]
                 WHEN 2 THEN pool[1 + floor(random() * array_length(pool, 1))::int]
                 ELSE odd_turns[1 + floor(random() * array_length(odd_turns, 1))::int] END;
        IF turn_key IS NOT NULL THEN
            INSERT INTO jobcap.queue_turns VALUES ('da', turn_key), ('sa', turn_key);
        END IF;
        COMMIT;
        FOR n IN 1..5 LOOP
            b := CASE WHEN random() < 0.15 THEN 33 + floor(random() * 8)::int
                      WHEN random() < 0.2 THEN 32 ELSE 1 + floor(random() * 32)::int END;
            lease := CASE WHEN random() < 0.5 THEN NULL ELSE interval '1 minute' * (1 + floor(random() * 9)) END;
            turn_before := (SELECT last_key FROM jobcap.queue_turns WHERE queue = 'da');
            SELECT * INTO fin FROM jobcap.jobs WHERE queue = 'da' AND state = 'running'
              ORDER BY (payload->>'seq')::int LIMIT 1;
            how := CASE WHEN fin.job_id IS NOT NULL AND random() < 0.4 THEN 'cac' ELSE 'claim' END;
            PERFORM set_config('jobcap.hot_path', 'direct', false);
            IF how = 'claim' THEN
                SELECT string_agg(format('%s/%s/%s', payload->>'seq', attempt, max_attempts), ' ' ORDER BY o) INTO d
                  FROM jobcap.claim_job('da', 'w', b, lease) WITH ORDINALITY AS x(job_id, fence, attempt, max_attempts, payload, lease_expires_at, o);
            ELSE
                SELECT string_agg(format('%s/%s/%s', payload->>'seq', attempt, max_attempts), ' ' ORDER BY o) INTO d
                  FROM jobcap.complete_and_claim(fin.job_id, fin.fence, 'da', 'w', b, lease) WITH ORDINALITY AS x(job_id, fence, attempt, max_attempts, payload, lease_expires_at, o);
                SELECT * INTO fin FROM jobcap.jobs WHERE queue = 'sa' AND payload->>'seq' = fin.payload->>'seq';
            END IF;
            COMMIT;
            PERFORM set_config('jobcap.hot_path', 'sql', false);
            IF how = 'claim' THEN
                SELECT string_agg(format('%s/%s/%s', payload->>'seq', attempt, max_attempts), ' ' ORDER BY o) INTO s
                  FROM jobcap.claim_job('sa', 'w', b, lease) WITH ORDINALITY AS x(job_id, fence, attempt, max_attempts, payload, lease_expires_at, o);
            ELSE
                SELECT string_agg(format('%s/%s/%s', payload->>'seq', attempt, max_attempts), ' ' ORDER BY o) INTO s
                  FROM jobcap.complete_and_claim(fin.job_id, fin.fence, 'sa', 'w', b, lease) WITH ORDINALITY AS x(job_id, fence, attempt, max_attempts, payload, lease_expires_at, o);
            END IF;
            COMMIT;
            PERFORM set_config('jobcap.hot_path', 'direct', false);
            INSERT INTO res VALUES (c, n, b, how, turn_before, d, s,
                (SELECT last_key FROM jobcap.queue_turns WHERE queue = 'da'),
                (SELECT last_key FROM jobcap.queue_turns WHERE queue = 'sa'),
                pg_temp.state('da'), pg_temp.state('sa'));
            -- between claims: some running jobs finish; a pending job may change key
            WITH x AS MATERIALIZED (SELECT payload->>'seq' AS seq, random() < 0.5 AS fin FROM jobcap.jobs
                     WHERE queue = 'da' AND state = 'running' ORDER BY (payload->>'seq')::int)
            UPDATE jobcap.jobs j SET state = 'succeeded', finished_at = now()
              FROM x
             WHERE j.queue IN ('da', 'sa') AND j.state = 'running' AND j.payload->>'seq' = x.seq AND x.fin;
            IF random() < 0.15 THEN
                PERFORM jobcap.alter_queue(q, max_attempts => m) FROM unnest(ARRAY['da', 'sa']) q,
                   (SELECT 1 + floor(random() * 4)::int AS m) r;
            END IF;
            IF random() < 0.3 THEN
                WITH x AS MATERIALIZED (SELECT payload->>'seq' AS seq,
                               CASE floor(random() * 3)::int WHEN 0 THEN keys[1 + floor(random() * greatest(array_length(keys, 1), 1))::int]
                                    WHEN 1 THEN pool[1 + floor(random() * array_length(pool, 1))::int] END AS nk
                          FROM jobcap.jobs WHERE queue = 'da' AND state = 'pending'
                         ORDER BY (payload->>'seq')::int LIMIT 3)
                UPDATE jobcap.jobs j SET concurrency_key = x.nk FROM x
                 WHERE j.queue IN ('da', 'sa') AND j.payload->>'seq' = x.seq;
            END IF;
            COMMIT;
        END LOOP;
    END LOOP;
END $$;
SELECT count(DISTINCT case_no) AS cases, count(*) AS claims,
       count(*) FILTER (WHERE d IS DISTINCT FROM s) AS jobs_differ,
       count(*) FILTER (WHERE d_turn IS DISTINCT FROM s_turn) AS turn_differs,
       count(*) FILTER (WHERE d_state IS DISTINCT FROM s_state) AS state_differs
  FROM res;
SELECT case_no, claim_no, batch, how, left(turn_before, 10) tb, d, s, left(d_turn,10) dt, left(s_turn,10) st
  FROM res WHERE d IS DISTINCT FROM s OR d_turn IS DISTINCT FROM s_turn OR d_state IS DISTINCT FROM s_state
 ORDER BY 1, 2 LIMIT 5;
SELECT case_no, claim_no, x.a, y.b FROM res, LATERAL (SELECT array_agg(e) a FROM unnest(string_to_array(d_state, ',')) e WHERE NOT e = ANY (string_to_array(s_state, ','))) x, LATERAL (SELECT array_agg(e) b FROM unnest(string_to_array(s_state, ',')) e WHERE NOT e = ANY (string_to_array(d_state, ','))) y WHERE d_state IS DISTINCT FROM s_state ORDER BY 1,2 LIMIT 3;
SELECT count(*) FILTER (WHERE batch > 32) AS big, count(*) FILTER (WHERE how = 'cac') AS cac,
       count(*) FILTER (WHERE d IS NULL) AS empty,
       count(*) FILTER (WHERE batch <= 32 AND cardinality(string_to_array(d, ' ')) = batch) AS full,
       count(*) FILTER (WHERE d ~ '/5( |$)') AS cap5, count(*) FILTER (WHERE d ~ '/[124]( |$)') AS cap124,
       count(*) FILTER (WHERE turn_before IS DISTINCT FROM d_turn) AS turn_moved
  FROM res;
SELECT jobcap.drop_queue('da', force => true), jobcap.drop_queue('sa', force => true);
