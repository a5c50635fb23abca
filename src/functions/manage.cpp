// cancel_job and requeue_job: an operator's hand on one job. requeue_job is the only way out of
// dead or cancelled; nothing leaves succeeded. Counters and fences never go back.
#include "spi/access.hpp"
#include "spi/args.hpp"
#include "boundary.hpp"
#include "spi/history.hpp"
#include "spi/plans.hpp"

namespace jobcap {
namespace {

// A running job is cancelled at once: its worker learns it at its next fenced call, which gets
// the stale-fence error, so nothing it writes with that call commits.
Statement cancel = {
    "UPDATE jobcap.jobs SET state = 'cancelled', finished_at = $2, lease_expires_at = NULL"
    " WHERE job_id = $1 AND state IN ('pending', 'running') RETURNING job_id",
    2, {INT8OID, TIMESTAMPTZOID}, nullptr};

// The budget becomes attempts + extra ($3, NULL: the queue's cap); the reason goes to history
// with the calling role ($5: the statement runs as the tables' owner, see access.hpp).
// A job whose dedupe key another live job now holds stays where it is (see why_not_requeued).
Statement requeue = {
    "WITH requeued AS (UPDATE jobcap.jobs j SET state = 'pending',"
    "     max_attempts = j.attempts + coalesce($3, q.max_attempts),"
    "     run_at = $4, finished_at = NULL, lease_expires_at = NULL"
    "   FROM jobcap.queues q"
    "  WHERE j.job_id = $1 AND j.state IN ('dead', 'cancelled') AND q.queue = j.queue"
    "    AND NOT EXISTS (SELECT FROM jobcap.jobs o WHERE o.queue = j.queue"
    "          AND o.dedupe_key = j.dedupe_key AND o.job_id <> j.job_id"
    "          AND o.state IN ('pending', 'running', 'dead'))"
    "  RETURNING j.job_id, j.queue, j.attempts, j.fence, $5 AS worker),"
    JOBCAP_HISTORY_CTES("requeued", "'requeued'", "$2", "$4")
    " SELECT r.job_id, q.notify, r.queue FROM requeued r JOIN jobcap.queues q ON q.queue = r.queue",
    5, {INT8OID, TEXTOID, INT4OID, TIMESTAMPTZOID, TEXTOID}, nullptr};

Statement job_exists = {"SELECT FROM jobcap.jobs WHERE job_id = $1", 1, {INT8OID}, nullptr};

// Why a requeue changed nothing: no such job (error), a state requeue does not apply to (false),
// or its dedupe key taken by another live job (error: the caller must choose which one runs).
Statement why_not_requeued = {
    "SELECT j.state IN ('dead', 'cancelled'), j.dedupe_key,"
    "  (SELECT o.job_id FROM jobcap.jobs o WHERE o.queue = j.queue"
    "     AND o.dedupe_key = j.dedupe_key AND o.job_id <> j.job_id"
    "     AND o.state IN ('pending', 'running', 'dead') LIMIT 1)"
    " FROM jobcap.jobs j WHERE j.job_id = $1",
    1, {INT8OID}, nullptr};

}  // namespace
}  // namespace jobcap

using namespace jobcap;

JOBCAP_FUNCTION(jobcap_cancel_job)
{
    return guard("cancel_job", [&]() -> Datum {
        Access access = admit("cancel_job", Duty::operator_);
        int64 job_id = arg_job_id(fcinfo, 0);
        Datum values[2] = {Int64GetDatum(job_id), TimestampTzGetDatum(GetCurrentTimestamp())};

        connect(access);
        bool cancelled = run(cancel, values, nullptr, SPI_OK_UPDATE_RETURNING) > 0;
        if (!cancelled && run(job_exists, values, nullptr, SPI_OK_SELECT) == 0)
            raise_unknown_job(job_id);
        finish(access);
        PG_RETURN_BOOL(cancelled);
    });
}

JOBCAP_FUNCTION(jobcap_requeue_job)
{
    return guard("requeue_job", [&]() -> Datum {
        Access access = admit("requeue_job", Duty::operator_);
        int64 job_id = arg_job_id(fcinfo, 0);
        Datum reason = arg_required(fcinfo, 1, "reason");
        if (VARSIZE_ANY_EXHDR(DatumGetTextPP(reason)) == 0)
            ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                            errmsg("reason must not be empty"),
                            errhint("Say why the job deserves more attempts; it is kept in the job's history.")));
        int32 extra = 0;
        bool has_extra = arg_count_opt(fcinfo, 2, "extra_attempts", core::kMaxAttempts, &extra);
        Datum values[5] = {Int64GetDatum(job_id), kept_text(DatumGetTextPP(reason)),
                           Int32GetDatum(extra), TimestampTzGetDatum(GetCurrentTimestamp()),
                           caller_name(access)};
        char nulls[6] = {' ', ' ', has_extra ? ' ' : 'n', ' ', ' ', '\0'};

        connect(access);
        bool requeued = run(requeue, values, nulls, SPI_OK_SELECT) > 0;
        // A requeued job wakes the queue's listeners as an enqueue does (sent at commit).
        char* wake = nullptr;
        if (requeued && DatumGetBool(column(0, 2))) {
            text* queue = DatumGetTextPP(column(0, 3));
            wake = static_cast<char*>(SPI_palloc(VARSIZE_ANY_EXHDR(queue) + 1));
            text_to_cstring_buffer(queue, wake, VARSIZE_ANY_EXHDR(queue) + 1);
        }
        if (!requeued) {
            if (run(why_not_requeued, values, nullptr, SPI_OK_SELECT) == 0)
                raise_unknown_job(job_id);
            bool no_holder = false;
            Datum holder = column(0, 3, &no_holder);
            if (DatumGetBool(column(0, 1)) && !no_holder)
                ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                                errmsg("cannot requeue job %lld: job %lld holds its dedupe key \"%s\"",
                                       static_cast<long long>(job_id),
                                       static_cast<long long>(DatumGetInt64(holder)),
                                       TextDatumGetCString(column(0, 2))),
                                errhint("Cancel job %lld first, or enqueue the work again.",
                                        static_cast<long long>(DatumGetInt64(holder)))));
        }
        finish(access);
        if (wake != nullptr)
            Async_Notify("jobcap", wake);
        PG_RETURN_BOOL(requeued);
    });
}
