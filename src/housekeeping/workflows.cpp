// Workflows shared by the SQL functions and the background worker (workflows.hpp): releasing and
// cancelling the jobs that depend on a job, and the worker's deadlines.
#include "housekeeping/workflows.hpp"

#include "spi/access.hpp"
#include "spi/cap.hpp"
#include "spi/history.hpp"
#include "spi/plans.hpp"
#include "spi/schema.hpp"

namespace jobcap {
namespace statements {

// $1 = jobs that just succeeded, $2 = now. The children are locked in job_id order (two parents'
// completions lock their common children in the same order: no deadlock), then each waiting one
// counts off its parents among $1: the UPDATE decrements the latest version of the row, so a
// parent that completed on another connection meanwhile (and held the lock) is counted once and
// this one once. A child with nothing left to wait for is pending. Column 2: it asked for its
// parents' outputs; column 3: its queue's listeners are to be woken (due, notify on).
JOBCAP_STATEMENT(
    release_dependents,
    "WITH edges AS MATERIALIZED (SELECT d.job_id, count(*)::int AS n,"
    "     bool_or(d.pass_output) AS outputs FROM jobcap.job_dependencies d"
    "    WHERE d.depends_on = ANY ($1) GROUP BY d.job_id),"
    " locked AS MATERIALIZED (SELECT j.job_id FROM jobcap.jobs j"
    "    WHERE j.job_id = ANY (ARRAY(SELECT job_id FROM edges))"
    "    ORDER BY j.job_id FOR NO KEY UPDATE OF j),"
    " released AS (UPDATE jobcap.jobs j SET waiting_on = j.waiting_on - e.n,"
    "     state = CASE WHEN j.waiting_on > e.n THEN 'waiting' ELSE 'pending' END::jobcap.job_state"
    "    FROM edges e WHERE j.job_id = e.job_id"
    "     AND j.job_id = ANY (ARRAY(SELECT job_id FROM locked)) AND j.state = 'waiting'"
    "    RETURNING j.job_id, j.queue, j.state, j.run_at, e.outputs)"
    " SELECT r.job_id, r.state = 'pending' AND r.outputs,"
    "   r.state = 'pending' AND r.run_at <= $2 AND q.notify, r.queue"
    "   FROM released r JOIN jobcap.queues q ON q.queue = r.queue ORDER BY r.job_id",
    {INT8ARRAYOID, TIMESTAMPTZOID});

// $1 = released jobs that asked for their parents' outputs: {"parent_outputs": {"<id>": output}}
// merged into the payload. A statement of its own, after the release: its snapshot sees the
// outputs of parents that completed on other connections while the release waited for them. A
// parent deleted by retention meanwhile gives null.
JOBCAP_STATEMENT(pass_outputs,
                 "UPDATE jobcap.jobs j SET payload = j.payload || jsonb_build_object("
                 "   'parent_outputs', (SELECT jsonb_object_agg(d.depends_on::text, p.output)"
                 "     FROM jobcap.job_dependencies d"
                 "     LEFT JOIN jobcap.jobs p ON p.job_id = d.depends_on"
                 "    WHERE d.job_id = j.job_id AND d.pass_output))"
                 " WHERE j.job_id = ANY ($1)",
                 {INT8ARRAYOID});

// One level of cancellation. $1 = jobs that ended dead or cancelled (or were deleted), $2 = now.
// Their waiting children, locked in job_id order, are cancelled with a history row naming the job
// each depended on (the lowest of its parents among them). Returns the cancelled ones that others
// depend on in turn: the next level, in a statement of its own (a new snapshot, which sees every
// dependent enqueued before this one locked their rows).
JOBCAP_STATEMENT(
    cancel_dependents,
    "WITH edges AS MATERIALIZED (SELECT DISTINCT ON (d.job_id) d.job_id, d.depends_on,"
    "     p.state AS cause FROM jobcap.job_dependencies d"
    "     LEFT JOIN jobcap.jobs p ON p.job_id = d.depends_on"
    "    WHERE d.depends_on = ANY ($1) AND (p.job_id IS NULL OR p.state IN ('dead', 'cancelled'))"
    "    ORDER BY d.job_id, d.depends_on),"
    " locked AS MATERIALIZED (SELECT j.job_id FROM jobcap.jobs j"
    "    WHERE j.job_id = ANY (ARRAY(SELECT job_id FROM edges))"
    "    ORDER BY j.job_id FOR NO KEY UPDATE OF j),"
    " cancelled AS (UPDATE jobcap.jobs j SET state = 'cancelled', finished_at = $2,"
    "     lease_expires_at = NULL"
    "    FROM edges e WHERE j.job_id = e.job_id"
    "     AND j.job_id = ANY (ARRAY(SELECT job_id FROM locked)) AND j.state = 'waiting'"
    "    RETURNING j.job_id, j.queue, j.attempts, j.fence, NULL::text AS worker, j.has_dependents,"
    "     format('job %s, which it depends on, %s', e.depends_on, CASE"
    "       WHEN e.cause IS NULL THEN 'was deleted' WHEN e.cause = 'dead' THEN 'is dead'"
    "       ELSE 'was cancelled' END) AS reason),"
    JOBCAP_HISTORY_CTES("cancelled", "'cancelled'", "s.reason", "$2")
    " SELECT coalesce(array_agg(job_id) FILTER (WHERE has_dependents), '{}') FROM cancelled",
    {INT8ARRAYOID, TIMESTAMPTZOID});

// The effective run-time limit of job j with queue q: the shorter of the two (least() ignores a
// NULL; both NULL: none).
#define RUN_LIMIT "least(j.max_run_time, q.max_run_time)"

// Running jobs whose attempt is older than their limit, heartbeat or not: as the reaper ends an
// expired lease (reap.cpp), retried after the backoff or dead at the cap, with history kind
// timed_out. Locked rows are skipped (a worker inside assert_fence): a later pass takes them.
// $1 = max_jobs, $2 = now.
JOBCAP_STATEMENT(
    time_out_overdue,
    "WITH overdue AS MATERIALIZED ("
    "  SELECT j.job_id FROM jobcap.jobs j JOIN jobcap.queues q ON q.queue = j.queue"
    "   WHERE j.state = 'running' AND j.claimed_at + " RUN_LIMIT
    " < $2"
    "   LIMIT $1 FOR NO KEY UPDATE OF j SKIP LOCKED),"
    " ended AS (UPDATE jobcap.jobs j"
    "   SET state = CASE WHEN j.attempts >= " JOBCAP_CAP
    " THEN 'dead' ELSE 'pending' END::jobcap.job_state,"
    "       run_at = CASE WHEN j.attempts >= " JOBCAP_CAP
    " THEN j.run_at ELSE $2 + jobcap.backoff(j.attempts, q.backoff_base, q.backoff_max) END,"
    "       finished_at = CASE WHEN j.attempts >= " JOBCAP_CAP
    " THEN $2 END,"
    "       lease_expires_at = NULL"
    "  FROM jobcap.queues q"
    " WHERE j.job_id = ANY (ARRAY(SELECT job_id FROM overdue)) AND q.queue = j.queue"
    "   AND (j.state = 'running' AND j.claimed_at + " RUN_LIMIT
    " < $2) IS TRUE"
    " RETURNING j.job_id, j.queue, j.attempts, j.fence, j.worker, j.state,"
    "   " RUN_LIMIT " AS run_limit)," JOBCAP_HISTORY_CTES(
        "ended", "'timed_out'", "'ran past its max_run_time of ' || s.run_limit::text",
        "$2") " SELECT job_id, queue, state, fence FROM ended ORDER BY job_id",
    {INT4OID, TIMESTAMPTZOID}, PlanKind::steered);

// Jobs never claimed whose start_by has passed, pending or waiting (the scan walks the index
// jobs_start_by, whose predicate leaves first_claimed_at to the row): cancelled, reason
// "expired". $1 = max_jobs, $2 = now.
JOBCAP_STATEMENT(
    expire_unclaimed,
    "WITH expired AS MATERIALIZED ("
    "  SELECT j.job_id FROM jobcap.jobs j"
    "   WHERE j.start_by < $2 AND j.start_by IS NOT NULL AND j.first_claimed_at IS NULL"
    "     AND j.state <> ALL ('{running,succeeded,dead,cancelled}')"
    "   ORDER BY j.start_by LIMIT $1 FOR NO KEY UPDATE OF j SKIP LOCKED),"
    " cancelled AS (UPDATE jobcap.jobs j SET state = 'cancelled', finished_at = $2"
    "  WHERE j.job_id = ANY (ARRAY(SELECT job_id FROM expired))"
    "    AND (j.state IN ('pending', 'waiting') AND j.first_claimed_at IS NULL"
    "         AND j.start_by < $2) IS TRUE"
    "  RETURNING j.job_id, j.queue, j.attempts, j.fence, NULL::text AS worker, "
    "j.state)," JOBCAP_HISTORY_CTES(
        "cancelled", "'cancelled'", "'expired'",
        "$2") " SELECT job_id, queue, state FROM cancelled ORDER BY job_id",
    {INT4OID, TIMESTAMPTZOID}, PlanKind::steered);

// The jobs an enqueue (or a requeue) depends on ($1, sorted), locked in job_id order and marked as depended
// on: the update takes the row lock a completion or a death of that job takes too, so the two
// take turns, and each sees the other: a completion that waited releases the new job (its
// has_dependents is read from the version this update wrote), an enqueue that waited sees the
// job succeeded (not counted), dead or cancelled (the new job is cancelled at once). At
// REPEATABLE READ, a completion whose snapshot predates this update fails to serialize. Rows:
// each job found, its state now, and whether the caller ($2) may work its queue.
JOBCAP_STATEMENT(lock_depended_on,
                 "WITH locked AS MATERIALIZED (SELECT p.job_id FROM jobcap.jobs p"
                 "    WHERE p.job_id = ANY ($1) ORDER BY p.job_id FOR NO KEY UPDATE OF p),"
                 " marked AS (UPDATE jobcap.jobs p SET has_dependents = true"
                 "    WHERE p.job_id = ANY (ARRAY(SELECT job_id FROM locked))"
                 "    RETURNING p.job_id, p.state, p.queue)"
                 " SELECT m.job_id, m.state::text, " JOBCAP_MAY_WORK(
                     "$2", "m.queue") "   FROM marked m ORDER BY m.job_id",
                 {INT8ARRAYOID, OIDOID}, PlanKind::generic);

}  // namespace statements

Datum int8_array(const int64* ids, int n)
{
    Datum* boxed = static_cast<Datum*>(palloc(sizeof(Datum) * Max(n, 1)));
    for (int i = 0; i < n; ++i)
        boxed[i] = Int64GetDatum(ids[i]);
    return PointerGetDatum(
        construct_array(boxed, n, INT8OID, sizeof(int64), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
}

bool job_state_is(Datum state, const char* label)
{
    return strcmp(DatumGetCString(DirectFunctionCall1(enum_out, state)), label) == 0;
}

void notify_attempt_ended(int64 job_id, int64 fence, const char* reason)
{
    char payload[128];
    snprintf(payload, sizeof payload, "{\"job_id\": %lld, \"fence\": %lld, \"reason\": \"%s\"}",
             static_cast<long long>(job_id), static_cast<long long>(fence), reason);
    Async_Notify(kAttemptEndedChannel, payload);
}

DependedOn lock_depended_on(const Access& access, const int64* ids, int n)
{
    DependedOn on = {};
    Params m;
    m.add(int8_array(ids, n)).add_caller(access);
    uint64 rows = execute(statements::lock_depended_on, m, SPI_OK_SELECT);
    // Rows and ids are both in job_id order: a gap is a job that does not exist.
    uint64 r = 0;
    for (int i = 0; i < n; ++i) {
        if (r >= rows || DatumGetInt64(result_column(r, 1)) != ids[i]) {
            if (on.missing == 0)
                on.missing = ids[i];
            continue;
        }
        if (!DatumGetBool(result_column(r, 3)) && on.denied == 0)
            on.denied = ids[i];
        const char* state = TextDatumGetCString(result_column(r, 2));
        bool dead = strcmp(state, "dead") == 0;
        if (strcmp(state, "succeeded") != 0)
            ++on.waiting;
        if (on.cause == 0 && (dead || strcmp(state, "cancelled") == 0)) {
            on.cause = ids[i];
            on.cause_dead = dead;
        }
        ++r;
    }
    return on;
}

void release_dependents(const int64* ids, int n, TimestampTz now)
{
    if (n == 0)
        return;
    Params p;
    p.add(int8_array(ids, n)).add(TimestampTzGetDatum(now));
    uint64 rows = execute(statements::release_dependents, p, SPI_OK_SELECT);
    if (rows == 0)
        return;
    // Copied out of the tuple table, which the next statement replaces.
    int64* outputs = static_cast<int64*>(palloc(sizeof(int64) * rows));
    int wanting = 0;
    for (uint64 r = 0; r < rows; ++r) {
        if (DatumGetBool(result_column(r, 2)))
            outputs[wanting++] = DatumGetInt64(result_column(r, 1));
        if (DatumGetBool(result_column(r, 3)))
            Async_Notify("jobcap", TextDatumGetCString(result_column(r, 4)));
    }
    pass_parent_outputs(outputs, wanting);
    pfree(outputs);
}

void pass_parent_outputs(const int64* ids, int n)
{
    if (n == 0)
        return;
    Params o;
    o.add(int8_array(ids, n));
    execute(statements::pass_outputs, o, SPI_OK_UPDATE);
}

void cancel_dependents(const int64* ids, int n, TimestampTz now)
{
    if (n == 0 || !workflows_schema_exists())  // compat(0.2.0)
        return;
    Datum level = int8_array(ids, n);
    for (;;) {
        Params p;
        p.add(level).add(TimestampTzGetDatum(now));
        execute(statements::cancel_dependents, p, SPI_OK_SELECT);
        ArrayType* next = DatumGetArrayTypePCopy(result_column(0, 1));
        if (ArrayGetNItems(ARR_NDIM(next), ARR_DIMS(next)) == 0)
            break;
        level = PointerGetDatum(next);
    }
}

namespace {

// The ids in column 1 of the last statement's rows (rows of them), palloc'd.
int64* ids_of_rows(uint64 rows)
{
    int64* ids = static_cast<int64*>(palloc(sizeof(int64) * Max(rows, 1)));
    for (uint64 r = 0; r < rows; ++r)
        ids[r] = DatumGetInt64(result_column(r, 1));
    return ids;
}

}  // namespace

uint64 time_out_overdue(int32 max_jobs, TimestampTz now, ReapedRow row, void* arg)
{
    if (max_jobs <= 0 || !workflows_schema_exists())  // compat(0.2.0)
        return 0;
    Params p;
    p.add(Int32GetDatum(max_jobs)).add(TimestampTzGetDatum(now));
    uint64 rows = execute(statements::time_out_overdue, p, SPI_OK_SELECT);
    for (uint64 r = 0; r < rows; ++r) {
        if (row != nullptr)
            row(arg, result_column(r, 1), result_column(r, 2), result_column(r, 3));
        notify_attempt_ended(DatumGetInt64(result_column(r, 1)), DatumGetInt64(result_column(r, 4)),
                             "timed_out");
    }
    int64* ids = ids_of_rows(rows);
    cancel_dependents(ids, static_cast<int>(rows), now);
    pfree(ids);
    return rows;
}

uint64 expire_unclaimed(int32 max_jobs, TimestampTz now, ReapedRow row, void* arg)
{
    if (max_jobs <= 0 || !workflows_schema_exists())  // compat(0.2.0)
        return 0;
    Params p;
    p.add(Int32GetDatum(max_jobs)).add(TimestampTzGetDatum(now));
    uint64 rows = execute(statements::expire_unclaimed, p, SPI_OK_SELECT);
    if (row != nullptr)
        for (uint64 r = 0; r < rows; ++r)
            row(arg, result_column(r, 1), result_column(r, 2), result_column(r, 3));
    int64* ids = ids_of_rows(rows);
    cancel_dependents(ids, static_cast<int>(rows), now);
    pfree(ids);
    return rows;
}

}  // namespace jobcap
