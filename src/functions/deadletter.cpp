// Failing and dead jobs, for the operator: top_failing_jobs (the worst repeaters of a window),
// requeue_dead and purge_dead (dead letters of a queue in bounded batches). The bulk requeue is
// requeue_job's statement over a cohort: budget raised to attempts + extra (default: the queue's
// cap), counters and fences never go back, the reason kept in each job's history.
#include "spi/access.hpp"
#include "spi/args.hpp"
#include "boundary.hpp"
#include "spi/errors.hpp"
#include "spi/history.hpp"
#include "spi/plans.hpp"
#include "spi/schema.hpp"
#include "spi/statements.hpp"
#include "housekeeping/stats.hpp"
#include "spi/cap.hpp"

namespace jobcap {
namespace {

constexpr int64 kMaxDeadBatch = 10000;
#define LAST_ERRORS "3"         // error texts shown per failing job
#define LAST_ERROR_CHARS "200"  // ... each cut to this many characters

// $1 = queue (NULL: every queue), $2 = since, $3 = until, $4 = n. Ranked by failed attempts in
// the window (errors, lost leases and rolled-back claims, the last two as crashes), then the
// latest failure. CAP: the cap of job j with its queue q (spi/cap.hpp).
#define TOP_FAILING_JOBS(CAP)                                                                      \
    "WITH f AS (SELECT e.job_id, count(*) AS failures,"                                            \
    "     count(*) FILTER (WHERE e.kind = 'error') AS errors,"                                     \
    "     count(*) FILTER (WHERE e.kind IN ('lease_expired', 'claim_rolled_back', 'crashed'))"     \
    "       AS crashes,"                                                                           \
    "     min(e.at) AS first_at, max(e.at) AS last_at"                                             \
    "   FROM jobcap.job_errors e"                                                                  \
    "   WHERE e.at > $2 AND e.at <= $3 AND e.kind IN ('error', 'lease_expired', 'crashed', "       \
    "'claim_rolled_back')"                                                                         \
    "     AND ($1::text IS NULL OR e.queue = $1)"                                                  \
    "   GROUP BY e.job_id ORDER BY count(*) DESC, max(e.at) DESC, e.job_id LIMIT $4)"              \
    " SELECT f.job_id, j.queue, j.state, j.attempts, " CAP                                         \
    ","                                                                                            \
    "   f.failures, f.errors, f.crashes, f.first_at, f.last_at,"                                   \
    "   ARRAY(SELECT CASE WHEN length(e.error) > " LAST_ERROR_CHARS                                \
    "       THEN left(e.error, " LAST_ERROR_CHARS                                                  \
    " - 3) || '...' ELSE e.error END"                                                              \
    "     FROM jobcap.job_errors e WHERE e.job_id = f.job_id"                                      \
    "       AND e.kind IN ('error', 'lease_expired', 'crashed', 'claim_rolled_back')"              \
    "     ORDER BY e.seq DESC LIMIT " LAST_ERRORS                                                  \
    ")"                                                                                            \
    " FROM f JOIN jobcap.jobs j ON j.job_id = f.job_id"                                            \
    " LEFT JOIN jobcap.queues q ON q.queue = j.queue"                                              \
    " ORDER BY f.failures DESC, f.last_at DESC, f.job_id"

// compat(0.2.0): the 0.2.0 schema's (no kinds timed_out, snoozed).
JOBCAP_STATEMENT(top_failing_jobs_0_2, TOP_FAILING_JOBS(JOBCAP_CAP),
                 {TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID, INT4OID});

// On the 0.3.0 schema an attempt past its run-time limit (timed_out) is a crash too, and a
// job's snoozes are shown (the last two columns, timed_out and snoozes): a job that keeps
// snoozing is listed, after the failing ones, though a snooze within max_snoozes is no failure.
// first_failure_at and last_failure_at stay the failures'.
#define FAILED_KINDS "'error', 'lease_expired', 'crashed', 'claim_rolled_back', 'timed_out'"
JOBCAP_STATEMENT(
    top_failing_jobs,
    "WITH f AS (SELECT e.job_id, count(*) FILTER (WHERE e.kind <> 'snoozed') AS failures,"
    "     count(*) FILTER (WHERE e.kind = 'error') AS errors,"
    "     count(*) FILTER (WHERE e.kind IN ('lease_expired', 'claim_rolled_back', 'crashed',"
    "       'timed_out')) AS crashes,"
    "     count(*) FILTER (WHERE e.kind = 'timed_out') AS timed_out,"
    "     count(*) FILTER (WHERE e.kind = 'snoozed') AS snoozes,"
    "     min(e.at) FILTER (WHERE e.kind <> 'snoozed') AS first_at,"
    "     max(e.at) FILTER (WHERE e.kind <> 'snoozed') AS last_at, max(e.at) AS latest"
    "   FROM jobcap.job_errors e"
    "   WHERE e.at > $2 AND e.at <= $3 AND e.kind IN (" FAILED_KINDS
    ", 'snoozed')"
    "     AND ($1::text IS NULL OR e.queue = $1)"
    "   GROUP BY e.job_id"
    "   ORDER BY 2 DESC, 6 DESC, max(e.at) DESC, e.job_id LIMIT $4)"
    " SELECT f.job_id, j.queue, j.state, j.attempts, " JOBCAP_CAP
    ","
    "   f.failures, f.errors, f.crashes, f.first_at, f.last_at,"
    "   ARRAY(SELECT CASE WHEN length(e.error) > " LAST_ERROR_CHARS
    "       THEN left(e.error, " LAST_ERROR_CHARS
    " - 3) || '...' ELSE e.error END"
    "     FROM jobcap.job_errors e WHERE e.job_id = f.job_id"
    "       AND e.kind IN (" FAILED_KINDS
    ", 'snoozed')"
    "     ORDER BY e.seq DESC LIMIT " LAST_ERRORS
    "),"
    "   f.timed_out, f.snoozes"
    " FROM f JOIN jobcap.jobs j ON j.job_id = f.job_id"
    " LEFT JOIN jobcap.queues q ON q.queue = j.queue"
    " ORDER BY f.failures DESC, f.snoozes DESC, f.latest DESC, f.job_id",
    {TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID, INT4OID});

// compat(0.1.0): the same on the 0.1.0 schema (0.1.0's cap rule; its history has no
// claim_rolled_back rows), between installing this library and ALTER EXTENSION jobcap UPDATE.
JOBCAP_STATEMENT(top_failing_jobs_0_1, TOP_FAILING_JOBS(JOBCAP_CAP_0_1),
                 {TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID, INT4OID});

// The dead jobs of queue $1 whose last failure's text matches $2 (LIKE; NULL: any, including
// none) and that died in ($3, $4) (NULL: unbounded), oldest death first, at most $5, locked and
// skipping rows another transaction holds. Served by jobs_dead (queue, finished_at).
#define DEAD_COHORT(LOCK)                                                                          \
    "  SELECT j.job_id FROM jobcap.jobs j"                                                         \
    "   WHERE j.queue = $1 AND j.state = 'dead'"                                                   \
    "     AND ($3::timestamptz IS NULL OR j.finished_at > $3)"                                     \
    "     AND ($4::timestamptz IS NULL OR j.finished_at < $4)"                                     \
    "     AND ($2::text IS NULL OR (SELECT e.error FROM jobcap.job_errors e"                       \
    "           WHERE e.job_id = j.job_id AND e.kind IN ('error', 'lease_expired', 'crashed', "    \
    "'claim_rolled_back')"                                                                         \
    "           ORDER BY e.seq DESC LIMIT 1) LIKE $2)"                                             \
    "   ORDER BY j.finished_at, j.job_id LIMIT $5 " LOCK

// requeue_job's update (src/functions/manage.cpp) over the cohort. $6 = reason, $7 = extra
// attempts (NULL: the queue's cap), $8 = now, $9 = the calling role (for the history rows);
// EPOCH sets the job's cap_epoch (spi/cap.hpp); a new fence starts a new generation, as in
// requeue_job. Dead jobs hold their dedupe keys (jobs_dedupe
// covers dead), so no other live job can hold one; the guard stays, as in requeue_job, and a
// job it stops stays dead and is not counted.
#define REQUEUE_DEAD(EPOCH)                                                                        \
    "WITH cohort AS MATERIALIZED (" DEAD_COHORT("FOR NO KEY UPDATE OF j SKIP LOCKED") "),"         \
    " requeued AS (UPDATE jobcap.jobs j SET state = 'pending',"                                    \
    "     max_attempts = j.attempts + coalesce($7, q.max_attempts)," EPOCH                         \
    "     run_at = $8, finished_at = NULL, lease_expires_at = NULL,"                               \
    "     fence = nextval('jobcap.fences')"                                                        \
    "   FROM jobcap.queues q"                                                                      \
    "  WHERE j.job_id = ANY (ARRAY(SELECT job_id FROM cohort)) AND q.queue = j.queue"              \
    "    AND (j.state = 'dead') IS TRUE"                                                           \
    "    AND NOT EXISTS (SELECT FROM jobcap.jobs o WHERE o.queue = j.queue"                        \
    "          AND o.dedupe_key = j.dedupe_key AND o.job_id <> j.job_id"                           \
    "          AND o.state IN ('pending', 'running', 'dead'))"                                     \
    "  RETURNING j.job_id, j.queue, j.attempts, j.fence, $9 AS worker),"                           \
    JOBCAP_HISTORY_CTES("requeued", "'requeued'", "$6", "$8")                                      \
    " SELECT count(*)::int,"                                                                       \
    "   coalesce((SELECT notify FROM jobcap.queues WHERE queue = $1), false) FROM requeued"

JOBCAP_STATEMENT(requeue_dead, REQUEUE_DEAD(" cap_epoch = q.cap_epoch,"),
                 {TEXTOID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID, INT4OID, TEXTOID, INT4OID,
                  TIMESTAMPTZOID, TEXTOID});

// compat(0.1.0): the same on the 0.1.0 schema (no cap_epoch yet), as requeue_job_0_1.
JOBCAP_STATEMENT(requeue_dead_0_1, REQUEUE_DEAD(""),
                 {TEXTOID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID, INT4OID, TEXTOID, INT4OID,
                  TIMESTAMPTZOID, TEXTOID});

// Deletes the cohort with its history (and its edges), as retention does.
JOBCAP_STATEMENT(purge_dead, "WITH doomed AS MATERIALIZED (" DEAD_COHORT("FOR UPDATE OF j SKIP LOCKED") "),"
    JOBCAP_DELETE_DOOMED_WITH_EDGES(" AND j.state = 'dead'")
    " SELECT count(*)::int FROM gone",
    {TEXTOID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID, INT4OID});

// compat(0.2.0): the same on the 0.2.0 schema, which has no edges.
JOBCAP_STATEMENT(purge_dead_0_2, "WITH doomed AS MATERIALIZED (" DEAD_COHORT("FOR UPDATE OF j SKIP LOCKED") "),"
    JOBCAP_DELETE_DOOMED(" AND j.state = 'dead'")
    " SELECT count(*)::int FROM gone",
    {TEXTOID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID, INT4OID});

// Adds queue (argument 0), error_like, died_after, died_before (arguments from..from+2) and
// max_jobs (argument max_arg): the first five parameters of both statements. Returns the queue.
NameArg add_dead_filter(Params& p, FunctionCallInfo fcinfo, int from, int max_arg)
{
    NameArg queue = arg_queue(fcinfo, 0);
    p.add(queue.datum);
    for (int a = from; a < from + 3; ++a)
        p.add(PG_ARGISNULL(a) ? (Datum) 0 : PG_GETARG_DATUM(a), PG_ARGISNULL(a));
    bool has_after = !PG_ARGISNULL(from + 1), has_before = !PG_ARGISNULL(from + 2);
    TimestampTz after = has_after ? PG_GETARG_TIMESTAMPTZ(from + 1) : 0;
    TimestampTz before = has_before ? PG_GETARG_TIMESTAMPTZ(from + 2) : 0;
    if ((has_after && TIMESTAMP_NOT_FINITE(after)) || (has_before && TIMESTAMP_NOT_FINITE(before)))
        ereport(ERROR,
                (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                 errmsg("%s must be a finite time",
                        has_after && TIMESTAMP_NOT_FINITE(after) ? "died_after" : "died_before")));
    if (has_after && has_before && after >= before)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("died_after must be earlier than died_before")));
    p.add(Int32GetDatum(arg_count(fcinfo, max_arg, "max_jobs", kMaxDeadBatch)));
    return queue;
}

void check_queue_exists(const NameArg& queue)
{
    Params p;
    p.add(queue.datum);
    if (execute(statements::queue_exists, p, SPI_OK_SELECT) == 0)
        raise_unknown_queue(queue.cstr);
}

}  // namespace
}  // namespace jobcap

using namespace jobcap;

JOBCAP_FUNCTION(top_failing_jobs, Duty::operator_)
{
    bool all_queues = PG_ARGISNULL(0);
    NameArg queue = {(Datum) 0, nullptr};
    if (!all_queues)
        queue = arg_queue(fcinfo, 0);
    int32 n = arg_count(fcinfo, 1, "n", kMaxDeadBatch);
    TimestampTz until = PG_ARGISNULL(3) ? GetCurrentTimestamp() : PG_GETARG_TIMESTAMPTZ(3);
    TimestampTz since = PG_ARGISNULL(2) ? until - (int64) guc_stats_window_s * USECS_PER_SEC
                                        : PG_GETARG_TIMESTAMPTZ(2);
    if (TIMESTAMP_NOT_FINITE(since) || TIMESTAMP_NOT_FINITE(until) || since >= until)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("since must be a finite time earlier than until")));
    Params p;
    p.add(queue.datum, all_queues).add(TimestampTzGetDatum(since)).add(TimestampTzGetDatum(until));
    p.add(Int32GetDatum(n));
    InitMaterializedSRF(fcinfo, 0);
    ReturnSetInfo* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);

    spi_open(access);
    // compat(0.1.0): the 0.1.0 schema's cap rule. compat(0.2.0): the 0.2.0 schema's kinds; the
    // 0.2.0 declaration returns the first 11 columns (timed_out and snoozes are 0 beyond them).
    uint64 rows = execute(workflows_schema_exists()       ? top_failing_jobs
                          : queues_paused_column_exists() ? top_failing_jobs_0_2
                                                          : top_failing_jobs_0_1,
                          p, SPI_OK_SELECT);
    if (rows == 0 && !all_queues)
        check_queue_exists(queue);
    int columns = SPI_tuptable->tupdesc->natts;
    int natts = Min(rsinfo->setDesc->natts, 13);
    for (uint64 r = 0; r < rows; ++r) {
        Datum v[13];
        bool n[13];
        for (int c = 0; c < natts; ++c) {
            n[c] = false;
            v[c] = c < columns ? result_column(r, c + 1, &n[c]) : Int64GetDatum(0);
        }
        tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, v, n);
    }
    spi_close(access);
    return (Datum) 0;
}

JOBCAP_FUNCTION(requeue_dead, Duty::operator_)
{
    // SQL: (queue, reason, error_like, died_after, died_before, max_jobs, extra_attempts)
    Datum reason = arg_required(fcinfo, 1, "reason");
    if (VARSIZE_ANY_EXHDR(DatumGetTextPP(reason)) == 0)
        ereport(ERROR,
                (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("reason must not be empty"),
                 errhint("Say why the jobs deserve more attempts; it is kept in "
                         "each job's history.")));
    Params p;
    NameArg queue = add_dead_filter(p, fcinfo, 2, 5);
    p.add(kept_text(DatumGetTextPP(reason)));
    int32 extra = 0;
    bool has_extra = arg_count_opt(fcinfo, 6, "extra_attempts", core::kMaxAttempts, &extra);
    p.add(Int32GetDatum(extra), !has_extra);
    p.add(TimestampTzGetDatum(GetCurrentTimestamp())).add(caller_name(access));

    spi_open(access);
    check_queue_exists(queue);
    // compat(0.1.0): the 0.1.0 schema's requeue, without cap_epoch.
    execute(queues_paused_column_exists() ? requeue_dead : requeue_dead_0_1, p, SPI_OK_SELECT);
    int32 requeued = DatumGetInt32(result_column(0, 1));
    bool wake = requeued > 0 && DatumGetBool(result_column(0, 2));
    spi_close(access);
    // Requeued jobs wake the queue's listeners as an enqueue does (sent at commit).
    if (wake)
        Async_Notify("jobcap", queue.cstr);
    PG_RETURN_INT32(requeued);
}

JOBCAP_FUNCTION(purge_dead, Duty::operator_)
{
    Params p;
    NameArg queue = add_dead_filter(p, fcinfo, 1, 4);

    spi_open(access);
    check_queue_exists(queue);
    // compat(0.2.0): the 0.2.0 schema's, without edges.
    execute(workflows_schema_exists() ? purge_dead : purge_dead_0_2, p, SPI_OK_SELECT);
    int32 purged = DatumGetInt32(result_column(0, 1));
    spi_close(access);
    PG_RETURN_INT32(purged);
}
