// What the Celery and Django-Q adapters call beyond the worker's settle calls: give_up_job (a
// worker's "dead now", for a rejected message), queue_depth (a queue's size, for workers of a
// granted queue) and purge_pending (an operator's purge, in bounded batches).
#include "spi/access.hpp"
#include "spi/args.hpp"
#include "boundary.hpp"
#include "spi/history.hpp"
#include "spi/plans.hpp"

namespace jobcap {
namespace {

constexpr int64 kMaxPurgeBatch = 10000;

// The fenced compare-and-swap of fail_job, ending the job instead of retrying it: the budget
// becomes the attempts already counted, so the attempt that gave up was the last, and a
// requeue_job raises the budget from there. $3 = reason, $4 = now, $5 = caller.
Statement give_up = {
    "WITH given_up AS (UPDATE jobcap.jobs j SET state = 'dead', max_attempts = j.attempts,"
    "       finished_at = $4, lease_expires_at = NULL"
    " WHERE j.job_id = $1 AND j.fence = $2 AND j.state = 'running'"
    "   AND " JOBCAP_MAY_WORK("$5", "j.queue")
    " RETURNING j.job_id, j.queue, j.attempts, j.fence, j.worker, j.state),"
    JOBCAP_HISTORY_CTES("given_up", "'error'", "$3", "$4")
    " SELECT state FROM given_up",
    5, {INT8OID, INT8OID, TEXTOID, TIMESTAMPTZOID, OIDOID}, nullptr, false, true};

// $1 = queue, $2 = now, $3 = caller. Pending jobs at or over their cap are not ready: the next
// sweep makes them dead.
Statement depth = {
    "SELECT count(*) FILTER (WHERE j.state = 'pending' AND j.run_at <= $2"
    "                         AND j.attempts < coalesce(j.max_attempts, q.max_attempts)),"
    "       count(*) FILTER (WHERE j.state = 'pending' AND j.run_at > $2"
    "                         AND j.attempts < coalesce(j.max_attempts, q.max_attempts)),"
    "       count(*) FILTER (WHERE j.state = 'running')"
    "  FROM jobcap.jobs j JOIN jobcap.queues q ON q.queue = j.queue"
    " WHERE j.queue = $1 AND j.state IN ('pending', 'running')"
    "   AND " JOBCAP_MAY_WORK("$3", "$1"),
    3, {TEXTOID, TIMESTAMPTZOID, OIDOID}, nullptr, false, true};

Statement queue_exists = {"SELECT FROM jobcap.queues WHERE queue = $1", 1, {TEXTOID}, nullptr};

// Deletes up to $2 pending jobs of queue $1 with their history, oldest first, skipping rows
// another transaction holds (a claim in progress). Running jobs settle normally.
Statement purge = {
    "WITH doomed AS MATERIALIZED (SELECT j.job_id FROM jobcap.jobs j"
    "   WHERE j.queue = $1 AND j.state = 'pending'"
    "   ORDER BY j.job_id LIMIT $2 FOR UPDATE OF j SKIP LOCKED),"
    " gone AS (DELETE FROM jobcap.jobs j"
    "   WHERE j.job_id = ANY (ARRAY(SELECT job_id FROM doomed)) AND j.state = 'pending'"
    "   RETURNING j.job_id),"
    " history_gone AS (DELETE FROM jobcap.job_errors e"
    "   WHERE e.job_id = ANY (ARRAY(SELECT job_id FROM gone)))"
    " SELECT count(*)::int FROM gone",
    2, {TEXTOID, INT4OID}, nullptr};

}  // namespace
}  // namespace jobcap

using namespace jobcap;

JOBCAP_FUNCTION(jobcap_give_up_job)
{
    return guard("give_up_job", [&]() -> Datum {
        Access access = admit("give_up_job", Duty::worker);
        int64 job_id = arg_job_id(fcinfo, 0);
        int64 fence = arg_fence(fcinfo, 1);
        Datum reason = arg_required(fcinfo, 2, "reason");
        if (VARSIZE_ANY_EXHDR(DatumGetTextPP(reason)) == 0)
            ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                            errmsg("reason must not be empty"),
                            errhint("Say why the job cannot succeed; it is kept in the job's "
                                    "history.")));
        char nulls[6] = {' ', ' ', ' ', ' ', ' ', '\0'};
        Datum values[5] = {Int64GetDatum(job_id), Int64GetDatum(fence),
                           kept_text(DatumGetTextPP(reason)),
                           TimestampTzGetDatum(GetCurrentTimestamp()),
                           caller_param(access, &nulls[4])};

        connect(access);
        if (run(give_up, values, nulls, SPI_OK_SELECT) == 0)
            raise_not_current(access, "give_up_job", job_id, fence);
        Datum state = column(0, 1);
        finish(access);
        return state;
    });
}

JOBCAP_FUNCTION(jobcap_queue_depth)
{
    return guard("queue_depth", [&]() -> Datum {
        Access access = admit("queue_depth", Duty::worker);
        NameArg queue = arg_queue(fcinfo, 0);
        char nulls[4] = {' ', ' ', ' ', '\0'};
        Datum values[3] = {queue.datum, TimestampTzGetDatum(GetCurrentTimestamp()),
                           caller_param(access, &nulls[2])};
        InitMaterializedSRF(fcinfo, 0);
        ReturnSetInfo* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);

        connect(access);
        check_queue(access, "queue_depth", queue.datum, queue.cstr);
        run(depth, values, nulls, SPI_OK_SELECT);
        Datum v[3];
        bool n[3] = {false, false, false};
        for (int c = 0; c < 3; ++c)
            v[c] = column(0, c + 1);
        tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, v, n);
        finish(access);
        return (Datum) 0;
    });
}

JOBCAP_FUNCTION(jobcap_purge_pending)
{
    return guard("purge_pending", [&]() -> Datum {
        Access access = admit("purge_pending", Duty::operator_);
        NameArg queue = arg_queue(fcinfo, 0);
        Datum values[2] = {queue.datum,
                           Int32GetDatum(arg_count(fcinfo, 1, "max_jobs", kMaxPurgeBatch))};

        connect(access);
        if (run(queue_exists, values, nullptr, SPI_OK_SELECT) == 0)
            raise_unknown_queue(queue.cstr);
        run(purge, values, nullptr, SPI_OK_SELECT);
        int32 purged = DatumGetInt32(column(0, 1));
        finish(access);
        PG_RETURN_INT32(purged);
    });
}
