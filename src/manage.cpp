// cancel_job and requeue_job: an operator's hand on one job. requeue_job is the only way out of
// dead or cancelled; nothing leaves succeeded. Counters and fences never go back.
#include "args.hpp"
#include "boundary.hpp"
#include "history.hpp"
#include "plans.hpp"

namespace jobcap {
namespace {

// A running job is cancelled at once: its worker learns it at its next fenced call, which gets
// the stale-fence error, so nothing it writes with that call commits.
Statement cancel = {
    "UPDATE jobcap.jobs SET state = 'cancelled', finished_at = statement_timestamp(),"
    " lease_expires_at = NULL"
    " WHERE job_id = $1 AND state IN ('pending', 'running') RETURNING job_id",
    1, {INT8OID}, nullptr};

// The budget becomes attempts + extra ($3, NULL: the queue's cap); the reason goes to history.
Statement requeue = {
    "WITH requeued AS (UPDATE jobcap.jobs j SET state = 'pending',"
    "     max_attempts = j.attempts + coalesce($3, q.max_attempts),"
    "     run_at = statement_timestamp(), finished_at = NULL, lease_expires_at = NULL"
    "   FROM jobcap.queues q"
    "  WHERE j.job_id = $1 AND j.state IN ('dead', 'cancelled') AND q.queue = j.queue"
    "  RETURNING j.job_id, j.queue, j.attempts, j.fence, current_user::text AS worker),"
    JOBCAP_HISTORY_CTES("requeued", "'requeued'", "$2")
    " SELECT job_id FROM requeued",
    3, {INT8OID, TEXTOID, INT4OID}, nullptr};

Statement job_exists = {"SELECT FROM jobcap.jobs WHERE job_id = $1", 1, {INT8OID}, nullptr};

}  // namespace
}  // namespace jobcap

using namespace jobcap;

JOBCAP_FUNCTION(jobcap_cancel_job)
{
    return guard("cancel_job", [&]() -> Datum {
        int64 job_id = arg_job_id(fcinfo, 0);
        Datum values[1] = {Int64GetDatum(job_id)};

        SPI_connect();
        bool cancelled = run(cancel, values, nullptr, SPI_OK_UPDATE_RETURNING) > 0;
        if (!cancelled && run(job_exists, values, nullptr, SPI_OK_SELECT) == 0)
            raise_unknown_job(job_id);
        SPI_finish();
        PG_RETURN_BOOL(cancelled);
    });
}

JOBCAP_FUNCTION(jobcap_requeue_job)
{
    return guard("requeue_job", [&]() -> Datum {
        int64 job_id = arg_job_id(fcinfo, 0);
        Datum reason = arg_required(fcinfo, 1, "reason");
        if (VARSIZE_ANY_EXHDR(DatumGetTextPP(reason)) == 0)
            ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                            errmsg("reason must not be empty"),
                            errhint("Say why the job deserves more attempts; it is kept in the job's history.")));
        int32 extra = 0;
        bool has_extra = arg_count_opt(fcinfo, 2, "extra_attempts", core::kMaxAttempts, &extra);
        Datum values[3] = {Int64GetDatum(job_id), reason, Int32GetDatum(extra)};
        char nulls[4] = {' ', ' ', has_extra ? ' ' : 'n', '\0'};

        SPI_connect();
        bool requeued = run(requeue, values, nulls, SPI_OK_SELECT) > 0;
        if (!requeued && run(job_exists, values, nullptr, SPI_OK_SELECT) == 0)
            raise_unknown_job(job_id);
        SPI_finish();
        PG_RETURN_BOOL(requeued);
    });
}
