// What the Celery and Django-Q adapters call beyond the worker's settle calls: give_up_job (a
// worker's "dead now", for a rejected message), queue_depth (a queue's size, for workers of a
// granted queue), job_result (a job's outcome, for the side that enqueued it) and purge_pending
// (an operator's purge, in bounded batches).
#include "spi/access.hpp"
#include "spi/args.hpp"
#include "boundary.hpp"
#include "spi/cap.hpp"
#include "spi/errors.hpp"
#include "spi/history.hpp"
#include "spi/plans.hpp"
#include "spi/statements.hpp"
#include "spi/schema.hpp"
#include "housekeeping/workflows.hpp"

namespace jobcap {
namespace {

constexpr int64 kMaxPurgeBatch = 10000;

// The fenced compare-and-swap of fail_job, ending the job instead of retrying it: the budget
// becomes the attempts already counted, so the attempt that gave up was the last, and a
// requeue_job raises the budget from there. $3 = reason, $4 = now, $5 = caller.
JOBCAP_STATEMENT(
    give_up_job,
    "WITH given_up AS (UPDATE jobcap.jobs j SET state = 'dead', max_attempts = j.attempts,"
    "       finished_at = $4, lease_expires_at = NULL"
    " WHERE j.job_id = $1 AND (j.fence = $2 AND j.state = 'running') IS TRUE"
    "   AND " JOBCAP_MAY_WORK("$5", "j.queue")
    " RETURNING j.job_id, j.queue, j.attempts, j.fence, j.worker, j.state),"
    JOBCAP_HISTORY_CTES("given_up", "'error'", "$3", "$4")
    " SELECT state FROM given_up",
    {INT8OID, INT8OID, TEXTOID, TIMESTAMPTZOID, OIDOID}, PlanKind::generic);

// $1 = queue, $2 = now, $3 = caller. Pending jobs at or over their cap are not ready: the next
// sweep makes them dead. The pending jobs come from the claim index, the running ones from
// jobs_running: one branch per state. With state IN ('pending', 'running') no partial index
// would match, and every call would read the whole table, the finished jobs kept included.
JOBCAP_STATEMENT(
    queue_depth,
    "SELECT count(*) FILTER (WHERE j.state = 'pending' AND j.run_at <= $2"
    "                         AND j.attempts < " JOBCAP_CAP
    "),"
    "       count(*) FILTER (WHERE j.state = 'pending' AND j.run_at > $2"
    "                         AND j.attempts < " JOBCAP_CAP
    "),"
    "       count(*) FILTER (WHERE j.state = 'running')"
    "  FROM (SELECT j.queue, j.state, j.run_at, j.attempts, j.cap_epoch, j.max_attempts"
    "          FROM jobcap.jobs j"
    "         WHERE hashtextextended(j.queue, 0) = hashtextextended($1, 0)"
    "           AND j.queue = $1 AND j.state = 'pending'"
    "        UNION ALL"
    "        SELECT j.queue, j.state, j.run_at, j.attempts, j.cap_epoch, j.max_attempts"
    "          FROM jobcap.jobs j"
    "         WHERE hashtextextended(j.queue, 0) = hashtextextended($1, 0)"
    "           AND j.queue = $1 AND j.state = 'running') j"
    "  JOIN jobcap.queues q ON q.queue = j.queue"
    " WHERE " JOBCAP_MAY_WORK("$3", "$1"),
    {TEXTOID, TIMESTAMPTZOID, OIDOID}, PlanKind::generic);

// $1 = job_id, $2 = caller. One row whenever the job exists, with whether the caller may see it,
// so that a job of another queue and a job that does not exist are refused alike.
JOBCAP_STATEMENT(
    job_result,
    "SELECT " JOBCAP_MAY_WORK("$2", "j.queue") ", j.state, j.attempts, j.output,"
    "       (SELECT e.error FROM jobcap.job_errors e WHERE e.job_id = j.job_id"
    "          AND e.error IS NOT NULL ORDER BY e.seq DESC LIMIT 1),"
    "       j.finished_at"
    "  FROM jobcap.jobs j WHERE j.job_id = $1",
    {INT8OID, OIDOID}, PlanKind::generic);

// Deletes up to $2 pending jobs of queue $1 with their history, oldest first, skipping rows
// another transaction holds (a claim in progress). Running jobs settle normally. Column 2: the
// deleted jobs that others depend on (the caller cancels those: housekeeping/workflows.hpp).
#define PURGE_PENDING(DELETE_DOOMED, DEPENDED_ON)                                                  \
    "WITH doomed AS MATERIALIZED (SELECT j.job_id FROM jobcap.jobs j"                              \
    "   WHERE hashtextextended(j.queue, 0) = hashtextextended($1, 0) AND j.queue = $1"             \
    "     AND j.state = 'pending'"                                                                 \
    "   ORDER BY j.job_id LIMIT $2 FOR UPDATE OF j SKIP LOCKED)," DELETE_DOOMED(                   \
        " AND j.state = 'pending'") " SELECT count(*)::int, " DEPENDED_ON " FROM gone"

JOBCAP_STATEMENT(purge_pending,
                 PURGE_PENDING(JOBCAP_DELETE_DOOMED_WITH_EDGES,
                               "array_agg(job_id) FILTER (WHERE has_dependents)"),
                 {TEXTOID, INT4OID});

// compat(0.2.0): the 0.2.0 schema's, which has no edges.
JOBCAP_STATEMENT(purge_pending_0_2, PURGE_PENDING(JOBCAP_DELETE_DOOMED, "NULL::bigint[]"),
                 {TEXTOID, INT4OID});

}  // namespace
}  // namespace jobcap

using namespace jobcap;

JOBCAP_FUNCTION(give_up_job, Duty::worker)
{
    int64 job_id = arg_job_id(fcinfo, 0);
    int64 fence = arg_fence(fcinfo, 1);
    Datum reason = arg_required(fcinfo, 2, "reason");
    if (VARSIZE_ANY_EXHDR(DatumGetTextPP(reason)) == 0)
        ereport(ERROR,
                (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("reason must not be empty"),
                 errhint("Say why the job cannot succeed; it is kept in the job's "
                         "history.")));
    Params p;
    p.add(Int64GetDatum(job_id)).add(Int64GetDatum(fence)).add(kept_text(DatumGetTextPP(reason)));
    p.add(TimestampTzGetDatum(GetCurrentTimestamp())).add_caller(access);

    TimestampTz now = GetCurrentTimestamp();
    spi_open(access);
    if (execute(give_up_job, p, SPI_OK_SELECT) == 0)
        raise_not_current(access, function, job_id, fence);
    Datum state = result_column(0, 1);
    cancel_dependents(&job_id, 1, now);  // it is dead: so are the jobs waiting for it
    spi_close(access);
    return state;
}

JOBCAP_FUNCTION(queue_depth, Duty::worker)
{
    NameArg queue = arg_queue(fcinfo, 0);
    Params p;
    p.add(queue.datum).add(TimestampTzGetDatum(GetCurrentTimestamp())).add_caller(access);
    InitMaterializedSRF(fcinfo, 0);
    ReturnSetInfo* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);

    spi_open(access);
    check_queue(access, function, queue.datum, queue.cstr);
    execute(queue_depth, p, SPI_OK_SELECT);
    Datum v[3];
    bool n[3] = {false, false, false};
    for (int c = 0; c < 3; ++c)
        v[c] = result_column(0, c + 1);
    tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, v, n);
    spi_close(access);
    return (Datum) 0;
}

JOBCAP_FUNCTION(job_result, Duty::worker)
{
    int64 job_id = arg_job_id(fcinfo, 0);
    Params p;
    p.add(Int64GetDatum(job_id)).add_caller(access);
    InitMaterializedSRF(fcinfo, 0);
    ReturnSetInfo* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);

    spi_open(access);
    refuse_job(access, function, job_id, execute(job_result, p, SPI_OK_SELECT));
    Datum v[5];
    bool n[5];
    for (int c = 0; c < 5; ++c)
        v[c] = result_column(0, c + 2, &n[c]);
    // The tuplestore lives in the caller's memory: it copies the values out of SPI's.
    tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, v, n);
    spi_close(access);
    return (Datum) 0;
}

JOBCAP_FUNCTION(purge_pending, Duty::operator_)
{
    NameArg queue = arg_queue(fcinfo, 0);
    Params p;
    p.add(queue.datum).add(Int32GetDatum(arg_count(fcinfo, 1, "max_jobs", kMaxPurgeBatch)));
    Params q;
    q.add(queue.datum);

    spi_open(access);
    if (execute(statements::queue_exists, q, SPI_OK_SELECT) == 0)
        raise_unknown_queue(queue.cstr);
    // compat(0.2.0): the 0.2.0 schema's, without edges.
    execute(workflows_schema_exists() ? purge_pending : purge_pending_0_2, p, SPI_OK_SELECT);
    int32 purged = DatumGetInt32(result_column(0, 1));
    bool none = false;
    Datum depended_on = result_column(0, 2, &none);
    if (!none) {
        ArrayType* a = DatumGetArrayTypePCopy(depended_on);
        cancel_dependents(reinterpret_cast<int64*>(ARR_DATA_PTR(a)),
                          ArrayGetNItems(ARR_NDIM(a), ARR_DIMS(a)), GetCurrentTimestamp());
    }
    spi_close(access);
    PG_RETURN_INT32(purged);
}
