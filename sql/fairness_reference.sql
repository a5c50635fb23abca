-- Round-robin fairness against a reference: random small round-robin queues (setseed), each
-- claimed a few times in a row; every claim's jobs and the turn it leaves are compared with a
-- plain SQL query that ranks every due job as docs/flow_control.md's rule says:
--   due jobs: pending, run_at passed, attempts below the cap, start_by not passed (or claimed
--     once already);
--   the keys with due jobs in text order, those after the turn's last_key first, then from the
--     first key up to and including last_key (no turn: from the first key);
--   each key's jobs ranked by priority, run_at, id (rn); a job fits when rn plus its key's
--     running jobs is within max_running_per_key;
--   the batch: the first fitting keyed jobs by (rn, the key's place in the turn), then jobs
--     without a key by priority, run_at, id in the room left;
--   the new turn: the key of the last keyed job taken (unchanged when none was);
--   max_running, when set, makes the batch no larger than the room it leaves.
-- The cases mix keys that differ in case or only in length, long keys (up to the 1,024 bytes a
-- key may have), '' (only by hand), keys whose jobs are all not due yet (run_at ahead, out of
-- attempts, start_by passed), jobs without a key, a per-key limit of 1 to 3 or none (now and
-- then a max_running too), jobs running already (some keys over a limit lowered below them),
-- batches of 1 to 10, turns on a key with jobs, on one without any (between keys, past the
-- last, before the first) and none; between the claims some running jobs finish and a pending
-- job may change key. The output is a summary; the first mismatches are listed when there are
-- any.
\set VERBOSITY terse
SELECT setseed(0.36);
-- The jobs are inserted by hand: ids past any row another suite left with an id of its own.
SELECT setval(s, greatest(coalesce(pg_sequence_last_value(s::regclass), 1),
                          coalesce((SELECT max(job_id) FROM jobcap.jobs), 1))) > 0 AS ids_free
  FROM pg_get_serial_sequence('jobcap.jobs', 'job_id') s;
SELECT jobcap.create_queue('fr', fairness => 'round_robin', max_attempts => 3);

-- The reference: the jobs a claim of batch b of queue q should take at time t, and the turn it
-- should leave (the key of the last keyed job taken, else the turn it found).
CREATE FUNCTION pg_temp.reference(q text, b int, t timestamptz, OUT ids bigint[], OUT turn text,
                                  OUT fitting bigint)
LANGUAGE sql AS $$
WITH qq AS (SELECT * FROM jobcap.queues WHERE queue = q),
last AS (SELECT (SELECT last_key FROM jobcap.queue_turns WHERE queue = q) AS k),
-- The batch: b, or less when max_running leaves less room.
room AS (SELECT CASE WHEN qq.max_running IS NULL THEN b
                     ELSE least(b, greatest(qq.max_running - (SELECT count(*) FROM jobcap.jobs
                                 WHERE queue = q AND state = 'running'), 0)) END AS n FROM qq),
due AS (
  SELECT j.job_id, j.concurrency_key AS k, j.priority, j.run_at
    FROM jobcap.jobs j, qq
   WHERE hashtextextended(j.queue, 0) = hashtextextended(q, 0)  -- (jobs_claim: no table scan)
     AND j.queue = q AND j.state = 'pending' AND j.run_at <= t
     AND j.attempts < (CASE WHEN (j.cap_epoch = qq.cap_epoch) IS TRUE THEN j.max_attempts
                            ELSE least(j.max_attempts, qq.max_attempts) END)
     AND (j.start_by IS NULL OR j.start_by >= t OR j.first_claimed_at IS NOT NULL)),
keys AS (SELECT DISTINCT k FROM due WHERE k IS NOT NULL),
turns AS (SELECT keys.k, row_number() OVER (ORDER BY (last.k IS NOT NULL AND keys.k <= last.k),
                                                     keys.k) AS pos
            FROM keys, last),
running AS (SELECT concurrency_key AS k, count(*) AS n FROM jobcap.jobs
             WHERE queue = q AND state = 'running' AND concurrency_key IS NOT NULL GROUP BY 1),
ranked AS (SELECT d.*, row_number() OVER (PARTITION BY d.k ORDER BY d.priority, d.run_at,
                                                                   d.job_id) AS rn
             FROM due d WHERE d.k IS NOT NULL),
fits AS (SELECT r.job_id, r.k, r.rn, t.pos
           FROM ranked r JOIN turns t USING (k) LEFT JOIN running u USING (k), qq
          WHERE qq.max_running_per_key IS NULL
             OR r.rn + coalesce(u.n, 0) <= qq.max_running_per_key),
keyed AS (SELECT * FROM fits ORDER BY rn, pos LIMIT (SELECT n FROM room)),
keyless AS (SELECT d.job_id FROM due d WHERE d.k IS NULL
             ORDER BY d.priority, d.run_at, d.job_id
             LIMIT greatest((SELECT n FROM room) - (SELECT count(*) FROM keyed), 0))
SELECT (SELECT coalesce(array_agg(job_id ORDER BY job_id), '{}')
          FROM (SELECT job_id FROM keyed UNION ALL SELECT job_id FROM keyless) a),
       coalesce((SELECT k FROM keyed ORDER BY rn DESC, pos DESC LIMIT 1), (SELECT k FROM last)),
       (SELECT count(*) FROM fits) + (SELECT count(*) FROM due WHERE k IS NULL)
$$;

CREATE TEMP TABLE fr_claims (case_no int, claim_no int, batch int, per_key int, turn_before text,
                             expected bigint[], got bigint[], expected_turn text, got_turn text,
                             over_limit boolean, keyless int, fitting bigint);
CREATE TEMP TABLE fr_dice (job_id bigint, k text, spent float8, late float8,
                           claimed_once boolean, run float8, share float8);

DO $$
DECLARE
    pool text[] := ARRAY['', 'a', 'A', 'aa', 'aaa', 'aA', 'Aa', 'ab', 'b', 'B', 'b b', 'b0', 'Z',
                         'z', 'zz', 'é', 'ß', 'tenant-7', 'tenant-70', 'tenant-8',
                         repeat('k', 1024), repeat('k', 1023) || 'l', repeat('k', 600),
                         repeat('K', 1000)];
    -- Turns that need no job: between keys, before the first, past the last, and the pool's.
    odd_turns text[] := ARRAY['a0', ' ', '0', 'zzz', '~', 'ab ', repeat('k', 700), 'tenant-'];
    keys text[];
    turn_key text;
    new_key text;
    per_key int;
    b int;
    t timestamptz;
    ref record;
    got bigint[];
    got_turn text;
    turn_before text;
    over boolean;
    keyless int;
    -- The case's jobs: the test's own reads and writes go by id, whatever else the table holds.
    ids bigint[] := '{}';
BEGIN
    FOR c IN 1..400 LOOP
        DELETE FROM jobcap.jobs WHERE job_id = ANY (ids);
        DELETE FROM jobcap.queue_turns WHERE queue = 'fr';
        -- 1 to 6 keys of the pool and 0 to 7 jobs of each, and 0 to 7 jobs without a key (the
        -- turn's rules show in small cases; 1 key in 5 has only jobs not due yet).
        SELECT array_agg(p ORDER BY random()) INTO keys
          FROM (SELECT p FROM unnest(pool) p ORDER BY random()
                 LIMIT 1 + floor(random() * 6)::int) s;
        WITH added AS (
        INSERT INTO jobcap.jobs (queue, priority, run_at, concurrency_key, payload)
        SELECT 'fr', floor(random() * 3)::int,
               CASE WHEN s.future THEN now() + interval '1 day'
                    ELSE now() - interval '1 minute' * floor(random() * 3) END,
               s.k, jsonb_build_object('c', c)
          FROM (SELECT k, random() < 0.2 AS future, floor(random() * 8)::int AS n
                  FROM unnest(keys || ARRAY[NULL::text]) k) s,
               LATERAL generate_series(1, s.n) g
         ORDER BY random()
        RETURNING job_id)
        SELECT coalesce(array_agg(job_id), '{}') INTO ids FROM added;
        -- Each job's dice, thrown in id order (not in the table's physical order, which other
        -- suites' rows shape): some pending jobs not due for other reasons (out of attempts, or
        -- start_by passed, while a job claimed once already stays due), and jobs running
        -- already (up to 2 per key, and jobs without a key).
        DELETE FROM fr_dice;
        INSERT INTO fr_dice
        SELECT job_id, concurrency_key AS k, random() AS spent, random() AS late,
               random() < 0.5 AS claimed_once, random() AS run, random() * 3 AS share
          FROM jobcap.jobs WHERE job_id = ANY (ids) ORDER BY job_id;
        UPDATE jobcap.jobs j SET attempts = 3
          FROM fr_dice d WHERE j.job_id = ANY (ids) AND d.job_id = j.job_id AND d.spent < 0.05;
        UPDATE jobcap.jobs j SET max_attempts = 1, attempts = 1
          FROM fr_dice d
         WHERE j.job_id = ANY (ids) AND d.job_id = j.job_id AND d.spent BETWEEN 0.05 AND 0.1;
        UPDATE jobcap.jobs j SET start_by = now() - interval '1 minute',
               first_claimed_at = CASE WHEN d.claimed_once THEN now() - interval '1 hour' END
          FROM fr_dice d WHERE j.job_id = ANY (ids) AND d.job_id = j.job_id AND d.late < 0.07;
        UPDATE jobcap.jobs j SET state = 'running', attempts = j.attempts + 1,
               fence = nextval('jobcap.fences'), lease_expires_at = now() + interval '1 hour',
               worker = 'before', claimed_at = now(), first_claimed_at = now()
          FROM (SELECT d.*, row_number() OVER (PARTITION BY d.k ORDER BY d.run) AS n
                  FROM fr_dice d WHERE d.spent >= 0.1) d
         WHERE j.job_id = ANY (ids) AND d.job_id = j.job_id AND d.n <= floor(d.share)::int
           AND d.run < 0.6;
        -- The per-key limit: none, or 1 to 3 (with 2 already running, a limit of 1 is below).
        per_key := CASE WHEN random() < 0.3 THEN 0 ELSE 1 + floor(random() * 3)::int END;
        -- And now and then a max_running of 1 to 8 for the whole queue (0: none).
        PERFORM jobcap.alter_queue('fr', max_running_per_key => per_key,
                                   max_running => CASE WHEN random() < 0.2
                                                       THEN 1 + floor(random() * 8)::int
                                                       ELSE 0 END);
        -- The turn: none, a key of the case, a key of the pool (maybe without jobs), or a place
        -- between or around the keys.
        turn_key := CASE floor(random() * 4)::int
                 WHEN 0 THEN NULL
                 WHEN 1 THEN keys[1 + floor(random() * array_length(keys, 1))::int]
                 WHEN 2 THEN pool[1 + floor(random() * array_length(pool, 1))::int]
                 ELSE odd_turns[1 + floor(random() * array_length(odd_turns, 1))::int] END;
        IF turn_key IS NOT NULL THEN
            INSERT INTO jobcap.queue_turns (queue, last_key) VALUES ('fr', turn_key);
        END IF;

        FOR n IN 1..4 LOOP
            b := 1 + floor(random() * 10)::int;
            turn_before := (SELECT last_key FROM jobcap.queue_turns WHERE queue = 'fr');
            t := clock_timestamp();
            ref := pg_temp.reference('fr', b, t);
            SELECT coalesce(array_agg(job_id ORDER BY job_id), '{}') INTO got
              FROM jobcap.claim_job('fr', 'w', b);
            got_turn := (SELECT last_key FROM jobcap.queue_turns WHERE queue = 'fr');
            -- No key past its limit through this claim (keys over it already took nothing).
            SELECT coalesce(bool_or(r.n > greatest(per_key, r.before)), false) INTO over
              FROM (SELECT concurrency_key, count(*) AS n,
                           count(*) FILTER (WHERE NOT job_id = ANY (got)) AS before
                      FROM jobcap.jobs WHERE job_id = ANY (ids) AND state = 'running'
                       AND concurrency_key IS NOT NULL GROUP BY 1) r
             WHERE per_key > 0;
            keyless := (SELECT count(*) FROM jobcap.jobs
                         WHERE job_id = ANY (got) AND concurrency_key IS NULL);
            INSERT INTO fr_claims VALUES (c, n, b, nullif(per_key, 0), turn_before, ref.ids, got,
                                          ref.turn, got_turn, over, keyless, ref.fitting);
            -- Between claims: some running jobs finish, and a pending job may change its key
            -- (to another of the case's keys, a new one, or none).
            UPDATE jobcap.jobs j SET state = 'succeeded', finished_at = now()
              FROM (SELECT job_id, random() AS r FROM jobcap.jobs
                     WHERE job_id = ANY (ids) AND state = 'running' ORDER BY job_id) d
             WHERE j.job_id = ANY (ids) AND d.job_id = j.job_id AND d.r < 0.5;
            IF random() < 0.3 THEN
                new_key := CASE floor(random() * 3)::int
                         WHEN 0 THEN keys[1 + floor(random() * array_length(keys, 1))::int]
                         WHEN 1 THEN pool[1 + floor(random() * array_length(pool, 1))::int] END;
                UPDATE jobcap.jobs SET concurrency_key = new_key
                 WHERE job_id = (SELECT job_id FROM jobcap.jobs
                                  WHERE job_id = ANY (ids) AND state = 'pending' ORDER BY job_id
                                 OFFSET floor(random() * (SELECT count(*) FROM jobcap.jobs
                                        WHERE job_id = ANY (ids) AND state = 'pending'))
                                  LIMIT 1);
            END IF;
        END LOOP;
        -- Each case commits: the jobs deleted before it are dead rows, not deletions in
        -- progress that every scan of the claim index would step over.
        COMMIT;
    END LOOP;
END
$$;

-- The summary: every claim as the reference's, no key past its limit, no job claimed twice.
SELECT count(DISTINCT case_no) AS cases, count(*) AS claims,
       count(*) FILTER (WHERE expected IS DISTINCT FROM got
                           OR expected_turn IS DISTINCT FROM got_turn) AS mismatches,
       count(*) FILTER (WHERE over_limit) AS past_a_limit
  FROM fr_claims;
SELECT count(*) AS claimed_twice FROM (
  SELECT case_no, job_id FROM fr_claims, unnest(got) job_id GROUP BY 1, 2 HAVING count(*) > 1) d;
-- What the claims covered, each at least about half the count this seed gives: claims that
-- took nothing, a full batch, more fitting jobs than the batch, keyed jobs and jobs without a key
-- in one batch, a turn that wrapped around, no per-key limit, no turn yet, a turn left on '' or
-- on a key of over 500 bytes, a batch cut short by max_running.
SELECT count(*) FILTER (WHERE cardinality(got) = 0) >= 290 AS empty,
       count(*) FILTER (WHERE cardinality(got) = batch) >= 190 AS full,
       count(*) FILTER (WHERE fitting > batch) >= 180 AS contested,
       count(*) FILTER (WHERE keyless > 0 AND keyless < cardinality(got)) >= 100 AS mixed,
       count(*) FILTER (WHERE got_turn < turn_before) >= 120 AS wrapped,
       count(*) FILTER (WHERE per_key IS NULL) >= 200 AS unlimited,
       count(*) FILTER (WHERE turn_before IS NULL) >= 75 AS no_turn,
       count(*) FILTER (WHERE got_turn = '') >= 20 AS empty_key,
       count(*) FILTER (WHERE length(got_turn) > 500) >= 110 AS long_key,
       count(*) FILTER (WHERE cardinality(expected) < batch AND fitting >= batch) >= 30 AS capped
  FROM fr_claims;
-- The first mismatches, if any.
SELECT case_no, claim_no, batch, per_key, left(turn_before, 12) AS turn_before, expected, got,
       left(expected_turn, 12) AS expected_turn, left(got_turn, 12) AS got_turn
  FROM fr_claims
 WHERE expected IS DISTINCT FROM got OR expected_turn IS DISTINCT FROM got_turn
 ORDER BY case_no, claim_no LIMIT 5;

SELECT jobcap.drop_queue('fr', force => true);
