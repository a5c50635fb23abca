// The claims of keyed queues (a per-key limit, round-robin fairness): one statement each, run by
// claim_from_queue (functions/claim.cpp) under the queue's claim turn and row lock, with what
// fits and the running jobs per key read there.
#include "functions/claim_sql.hpp"
#include "spi/statements.hpp"

namespace jobcap::statements {

// A fifo queue's claim with a per-key limit, under its row lock with $5 = what fits.
// $8 = max_running_per_key, $9 and $10 = the running jobs per key (keys, counts: read fresh
// under the lock). Every due job is ranked within its key (rn, by priority, run_at, id); it fits
// when rn plus its key's running jobs is within the limit (jobs without a key always), so a batch
// never takes a key past it, and the fitting jobs are taken by priority, run_at and id.
// The claim first ranks only a prefix of the due jobs in claim order (KEYED_PREFIX rows, through
// the claim index): a job's rank within its key in a prefix of the claim order is its rank among
// all due jobs, so the prefix's first $5 fitting jobs are the queue's; only when the prefix holds
// fewer than $5 fitting jobs and is not the whole backlog does the claim rank every due job (a
// few keys at their limit ahead of the others).
#define KEYED_PREFIX "($5 * 4 + 64)"
#define KEYED_DUE(KEY, GATE, CAP_BY, START_BY)                                                     \
    "    FROM jobcap.jobs j"                                                                       \
    "   WHERE " KEY "j.queue = $4 AND j.state = 'pending' AND j.run_at <= $1" START_BY             \
    "     AND " JOBCAP_MAY_WORK("$6", "$4") " AND " GATE " AND j.attempts < " CAP_BY               \
                                            "     AND j.job_id <> ALL ($7)"
#define KEYED_FITS(RANKED)                                                                         \
    "SELECT r.* FROM " RANKED                                                                      \
    " r"                                                                                           \
    "   LEFT JOIN unnest($9::text[], $10::int4[]) AS u(k, n) ON u.k = r.k"                         \
    "   WHERE r.k IS NULL OR $8::int4 IS NULL OR r.rn + coalesce(u.n, 0) <= $8"
#define CLAIM_KEYED(KEY, GATE, PAUSED, CAP_BY, CAP, START_BY)                                      \
    "WITH prefix AS MATERIALIZED ("                                                                \
    "  SELECT j.job_id, j.concurrency_key AS k, j.priority, j.run_at"                              \
    KEYED_DUE(KEY, GATE, CAP_BY, START_BY)                                                         \
    "   ORDER BY j.priority, j.run_at, j.job_id LIMIT " KEYED_PREFIX "),"                          \
    " prefix_ranked AS (SELECT p.*, row_number() OVER (PARTITION BY p.k"                           \
    "      ORDER BY p.priority, p.run_at, p.job_id) AS rn FROM prefix p),"                         \
    " prefix_fits AS MATERIALIZED (" KEYED_FITS("prefix_ranked") "),"                              \
    " enough AS MATERIALIZED (SELECT (SELECT count(*) FROM prefix_fits) >= $5"                     \
    "   OR (SELECT count(*) FROM prefix) < " KEYED_PREFIX " AS yes),"                              \
    " ranked AS MATERIALIZED ("                                                                    \
    "  SELECT j.job_id, j.concurrency_key AS k, j.priority, j.run_at,"                             \
    "    row_number() OVER (PARTITION BY j.concurrency_key"                                        \
    "      ORDER BY j.priority, j.run_at, j.job_id) AS rn"                                         \
    KEYED_DUE(KEY, GATE, CAP_BY, START_BY) " AND NOT (SELECT e.yes FROM enough e)),"               \
    " fits AS (SELECT * FROM prefix_fits WHERE (SELECT e.yes FROM enough e)"                       \
    "   UNION ALL " KEYED_FITS("ranked") "),"                                                      \
    " cohort AS MATERIALIZED (SELECT j.job_id FROM jobcap.jobs j"                                  \
    "   WHERE j.job_id = ANY (ARRAY(SELECT f.job_id FROM fits f"                                   \
    "     ORDER BY f.priority, f.run_at, f.job_id LIMIT $5))"                                      \
    "   FOR NO KEY UPDATE OF j SKIP LOCKED)" CLAIM_THE_COHORT(PAUSED START_BY, CAP)

JOBCAP_STATEMENT(claim_job_keyed,
                 CLAIM_KEYED(BY_QUEUE_KEY, QUEUE_NOT_PAUSED("$4"), " AND NOT q.paused",
                             JOBCAP_CAP_BY("$4"), JOBCAP_CAP, START_BY_DUE),
                 {TIMESTAMPTZOID, TEXTOID, INTERVALOID, TEXTOID, INT4OID, OIDOID, INT8ARRAYOID,
                  INT4OID, TEXTARRAYOID, INT4ARRAYOID},
                 PlanKind::generic);

// A round-robin queue's claim, under its row lock with $5 = what fits; $8 to $10 as
// claim_job_keyed's (max_running_per_key NULL: none), $11 = the queue's turn, the key its last
// claim ended on (NULL: none yet). The keys come in turn, in text order: first those after that
// key, then from the first key up to it. A batch takes one job per key per round (rn, a job's
// rank within its key by priority, run_at and id), the keys of a round in turn, and skips keys at
// their per-key limit; the key it ended on is written as the turn. Jobs without a key take only
// the room the keys leave, by priority, run_at and id: a key of their own would have to be
// looked for on every turn of the keys, through the claim index, and proving there is none
// reads every due job of the queue.
// The turn is walked through jobs_keys (pending jobs with a key, by queue hash, key, then claim
// order), one descent per key, and stops once it holds $5 keys with room (phase 1: after the
// last key; 2: the wrap, a place without a key; 3: from the first key): only those keys' first
// jobs are read, never the queue's whole backlog. A key's jobs are asked for as a range of keys,
// not an equality: with an equality the key is a constant to the planner, the claim index's order
// serves the ORDER BY too, and its plan walked the claim order to the key's first job. Steered
// (no sort) for the same reason: a sort of the claim index's rows would serve it too.
#define TURN_DUE(KEY, CAP_BY, START_BY)                                                            \
    " FROM jobcap.jobs j WHERE " KEY                                                               \
    "j.queue = $4 AND j.state = 'pending' AND j.run_at <= $1" START_BY " AND j.attempts < " CAP_BY \
    " AND j.job_id <> ALL ($7)"
// The first due key after AFTER (a condition on j.concurrency_key, or "" for the first of all).
#define TURN_KEY(KEY, CAP_BY, START_BY, AFTER)                                                     \
    "(SELECT j.concurrency_key" TURN_DUE(KEY, CAP_BY,                                              \
                                         START_BY) " AND j.concurrency_key IS NOT NULL" AFTER      \
                                                   " ORDER BY j.concurrency_key LIMIT 1)"
// How many more jobs key K may start: $5 without a per-key limit. The running jobs per key are
// looked up in a jsonb object made once per statement (an uncorrelated subquery: one InitPlan),
// whose lookup is a binary search: a scan of the arrays at every step of the walk made a claim
// quadratic in the keys with running jobs (10,000 keys at their limit: 13 s).
#define TURN_ROOM(K)                                                                               \
    "CASE WHEN $8::int4 IS NULL THEN $5 ELSE $8 - coalesce(((SELECT jsonb_object_agg(u.k, u.n)"    \
    "   FROM unnest($9::text[], $10::int4[]) AS u(k, n)) ->> " K ")::int4, 0) END"
#define CLAIM_TURNS(KEY, GATE, PAUSED, CAP_BY, CAP, START_BY)                                      \
    "WITH RECURSIVE walk(ph, k, fit, s, n) AS ("                                                   \
    "  SELECT t.ph, t.k, t.fit, 1, t.fit::int4 FROM"                                               \
    "   (SELECT CASE WHEN $11 IS NOT NULL THEN "                                                   \
    TURN_KEY(KEY, CAP_BY, START_BY, " AND j.concurrency_key > $11")                                \
    "    END AS nk OFFSET 0) x,"                                                                   \
    "   LATERAL (SELECT CASE WHEN x.nk IS NULL THEN 2 ELSE 1 END AS ph, x.nk AS k,"                \
    "      x.nk IS NOT NULL AND " TURN_ROOM("x.nk") " > 0 AS fit) t"                               \
    "   WHERE " JOBCAP_MAY_WORK("$6", "$4") " AND " GATE                                           \
    "  UNION ALL"                                                                                  \
    "  SELECT t.ph, t.k, t.fit, w.s + 1, w.n + t.fit::int4 FROM walk w,"                           \
    "   LATERAL (SELECT CASE WHEN w.ph = 2 THEN " TURN_KEY(KEY, CAP_BY, START_BY, "")              \
    "      ELSE " TURN_KEY(KEY, CAP_BY, START_BY, " AND j.concurrency_key > w.k")                  \
    "    END AS nk OFFSET 0) x,"                                                                   \
    "   LATERAL (SELECT CASE WHEN w.ph = 1 AND x.nk IS NULL THEN 2 WHEN w.ph = 1 THEN 1"           \
    "      ELSE 3 END AS ph, x.nk AS k, x.nk IS NOT NULL AND " TURN_ROOM("x.nk") " > 0 AS fit) t"  \
    "   WHERE w.n < $5 AND (w.ph = 1 OR (x.nk IS NOT NULL"                                         \
    "     AND ($11 IS NULL OR x.nk <= $11)))),"                                                   \
    " rounds AS MATERIALIZED (SELECT CASE WHEN max(w.n) >= $5 THEN 1 ELSE $5 END AS r"             \
    "   FROM walk w),"                                                                             \
    " keyed AS MATERIALIZED (SELECT w.s, c.job_id, c.k, row_number() OVER (PARTITION BY w.s"       \
    "    ORDER BY c.priority, c.run_at, c.job_id) AS rn FROM walk w,"                              \
    "   LATERAL (SELECT j.job_id, j.concurrency_key AS k, j.priority, j.run_at"                    \
    TURN_DUE(KEY, CAP_BY, START_BY)                                                                \
    "     AND j.concurrency_key >= w.k AND j.concurrency_key <= w.k"                               \
    "     ORDER BY j.concurrency_key, j.priority, j.run_at, j.job_id"                              \
    "     LIMIT greatest(least(" TURN_ROOM("w.k") ", (SELECT r.r FROM rounds r)), 0)) c"           \
    "   WHERE w.fit),"                                                                             \
    " keyless AS (SELECT j.job_id, j.priority, j.run_at"                                           \
    TURN_DUE(KEY, CAP_BY, START_BY)                                                                \
    "   AND j.concurrency_key IS NULL AND " JOBCAP_MAY_WORK("$6", "$4") " AND " GATE               \
    "   ORDER BY j.priority, j.run_at, j.job_id"                                                   \
    "   LIMIT greatest($5 - (SELECT count(*) FROM keyed), 0)),"                                    \
    " picked AS MATERIALIZED (SELECT p.job_id, p.k, row_number() OVER (ORDER BY p.g, p.rn, p.s)"   \
    "     AS ord FROM (SELECT 0 AS g, c.rn, c.s, c.job_id, c.k FROM keyed c"                       \
    "     UNION ALL SELECT 1, row_number() OVER (ORDER BY l.priority, l.run_at, l.job_id), 0,"     \
    "       l.job_id, NULL FROM keyless l) p"                                                      \
    "   ORDER BY p.g, p.rn, p.s LIMIT $5),"                                                        \
    " cohort AS MATERIALIZED (SELECT j.job_id FROM jobcap.jobs j"                                  \
    "   WHERE j.job_id = ANY (ARRAY(SELECT job_id FROM picked))"                                   \
    "   FOR NO KEY UPDATE OF j SKIP LOCKED),"                                                      \
    " claimed AS (" CLAIM_THE_COHORT(PAUSED START_BY, CAP) "),"                                    \
    " turn AS (INSERT INTO jobcap.queue_turns AS t (queue, last_key)"                              \
    "   SELECT $4, p.k FROM picked p"                                                              \
    "    WHERE p.k IS NOT NULL AND p.job_id IN (SELECT c.job_id FROM claimed c)"                   \
    "    ORDER BY p.ord DESC LIMIT 1"                                                              \
    "   ON CONFLICT (queue) DO UPDATE SET last_key = excluded.last_key)"                           \
    " SELECT * FROM claimed"

JOBCAP_STATEMENT(claim_job_turns,
                 CLAIM_TURNS(BY_QUEUE_KEY, QUEUE_NOT_PAUSED("$4"), " AND NOT q.paused",
                             JOBCAP_CAP_BY("$4"), JOBCAP_CAP, START_BY_DUE),
                 {TIMESTAMPTZOID, TEXTOID, INTERVALOID, TEXTOID, INT4OID, OIDOID, INT8ARRAYOID,
                  INT4OID, TEXTARRAYOID, INT4ARRAYOID, TEXTOID},
                 PlanKind::steered);

}  // namespace jobcap::statements
