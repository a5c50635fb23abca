// claim_job and claim_job_by_id: the execution boundary. A job runs only after passing through
// one of these statements, and each is ONE statement that locks, counts and caps:
//   state -> running, attempts + 1, a new fence, lease set, only while attempts < the cap.
// However a job came to be pending (enqueue, reaper, requeue, a row inserted by hand), it cannot
// run past its cap, and the count is committed before any work starts.
#include "spi/access.hpp"
#include "spi/args.hpp"
#include "boundary.hpp"
#include "spi/errors.hpp"
#include "spi/plans.hpp"
#include "spi/statements.hpp"
#include "spi/cap.hpp"
#include "core/order.hpp"

namespace jobcap {
namespace statements {

// The locking scan is a MATERIALIZED CTE, so it runs exactly once and locks at most the batch:
// every eligibility predicate sits inside it (rows over their cap never take a batch slot), and
// LockRows sits under the LIMIT (rows skipped or re-checked away do not count). The UPDATE
// repeats every guard, because a materialised cohort is not re-checked by READ COMMITTED; the
// guards are wrapped in IS TRUE (same meaning in a WHERE) so the planner cannot use them to pick
// an index: it must reach the claimed rows by primary key, never by walking the backlog.
// The fence comes from a sequence, so a claim that rolled back never hands its fence out again.
// Parameters common to both claims: $1 = now (one clock reading per call), $2 = worker,
// $3 = lease (NULL: the queue's). The grant check (access.hpp) sits in the cohort: a caller
// may claim only jobs of queues granted to it.
#define CLAIM_THE_COHORT                                                                           \
    " UPDATE jobcap.jobs j SET state = 'running', attempts = j.attempts + 1,"                      \
    "     fence = nextval('jobcap.fences'), lease = coalesce($3, q.lease),"                        \
    "     lease_expires_at = $1 + coalesce($3, q.lease), worker = $2, claimed_at = $1,"            \
    "     first_claimed_at = coalesce(j.first_claimed_at, $1)"                                     \
    "   FROM jobcap.queues q"                                                                      \
    "  WHERE j.job_id = ANY (ARRAY(SELECT job_id FROM cohort)) AND q.queue = j.queue"              \
    "    AND (j.state = 'pending' AND j.run_at <= $1"                                              \
    "         AND j.attempts < " JOBCAP_CAP                                                        \
    ") IS TRUE"                                                                                    \
    "  RETURNING j.job_id, j.fence, j.attempts, " JOBCAP_CAP                                       \
    ","                                                                                            \
    "    j.payload, j.lease_expires_at, j.priority, j.run_at"

// $4 = queue, $5 = batch, $6 = caller (NULL: privileged). The grant check does not depend on
// the row: it runs once, as a one-time filter before the scan.
JOBCAP_STATEMENT(claim_job, "WITH cohort AS MATERIALIZED ("
    "  SELECT j.job_id FROM jobcap.jobs j"
    "   WHERE j.queue = $4 AND j.state = 'pending' AND j.run_at <= $1"
    "     AND " JOBCAP_MAY_WORK("$6", "$4")
    "     AND j.attempts < " JOBCAP_CAP_BY("$4")
    "   ORDER BY j.priority, j.run_at, j.job_id"
    "   LIMIT $5"
    "   FOR NO KEY UPDATE OF j SKIP LOCKED)"
    CLAIM_THE_COHORT,
    {TIMESTAMPTZOID, TEXTOID, INTERVALOID, TEXTOID, INT4OID, OIDOID}, PlanKind::steered);

// $4 = job_id, $5 = caller (NULL: privileged).
JOBCAP_STATEMENT(claim_job_by_id,
                 "WITH cohort AS MATERIALIZED ("
                 "  SELECT j.job_id FROM jobcap.jobs j"
                 "   WHERE j.job_id = $4 AND j.state = 'pending' AND j.run_at <= $1"
                 "     AND j.attempts < " JOBCAP_CAP_BY("j.queue") "     AND " JOBCAP_MAY_WORK(
                     "$5", "j.queue") "   FOR NO KEY UPDATE OF j SKIP LOCKED)" CLAIM_THE_COHORT,
                 {TIMESTAMPTZOID, TEXTOID, INTERVALOID, INT8OID, OIDOID}, PlanKind::steered);

}  // namespace statements

namespace {

// A claim must commit before the work, or the attempt it counted rolls back with the work and
// the job can loop without a count. Inside a savepoint or an exception block it always would: refuse there.
void refuse_subtransaction(const char* function)
{
    if (IsSubTransaction())
        ereport(ERROR,
                (errcode(ERRCODE_ACTIVE_SQL_TRANSACTION),
                 errmsg("%s cannot run inside a subtransaction", function),
                 errdetail("A savepoint or exception block that rolls back would undo the claim, "
                           "and the attempt it counted."),
                 errhint("Claim in its own transaction and commit it before doing the work.")));
}

// Copies the claimed rows into the function's result, in claim order (the UPDATE returns them
// in the order it met them; columns 7 and 8 are priority and run_at).
void return_claimed(FunctionCallInfo fcinfo, uint64 rows)
{
    ReturnSetInfo* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
    core::ClaimKey* keys =
        static_cast<core::ClaimKey*>(palloc(sizeof(core::ClaimKey) * (rows + 1)));
    for (uint64 r = 0; r < rows; ++r)
        keys[r] = {DatumGetInt32(result_column(r, 7)), DatumGetTimestampTz(result_column(r, 8)),
                   DatumGetInt64(result_column(r, 1)), static_cast<uint32>(r)};
    core::sort_claim_order(keys, rows);
    for (uint64 i = 0; i < rows; ++i) {
        Datum values[6];
        bool nulls[6] = {false, false, false, false, false, false};
        for (int c = 0; c < 6; ++c)
            values[c] = result_column(keys[i].row, c + 1);
        tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
    }
    pfree(keys);
}

}  // namespace
}  // namespace jobcap

using namespace jobcap;

JOBCAP_FUNCTION(claim_job, Duty::worker)
{
    NameArg queue = arg_queue(fcinfo, 0);
    NameArg worker = arg_worker(fcinfo, 1);
    int32 batch = arg_count(fcinfo, 2, "batch", core::kMaxBatch);
    bool no_lease = false;
    Datum lease = arg_span(fcinfo, 3, "lease", false, true, &no_lease);
    refuse_subtransaction(function);
    InitMaterializedSRF(fcinfo, 0);

    Params p;
    p.add(TimestampTzGetDatum(GetCurrentTimestamp())).add(worker.datum).add(lease, no_lease);
    p.add(queue.datum).add(Int32GetDatum(batch)).add_caller(access);
    spi_open(access);
    uint64 rows = execute(statements::claim_job, p, SPI_OK_UPDATE_RETURNING);
    if (rows == 0)
        check_queue(access, function, queue.datum, queue.cstr);
    return_claimed(fcinfo, rows);
    spi_close(access);
    return (Datum) 0;
}

// One commit per job instead of two: the previous job's completion (the same compare-and-swap
// as complete_job) and the next claim run in the caller's one transaction. A stale fence raises
// JC001 before anything is claimed.
JOBCAP_FUNCTION(complete_and_claim, Duty::worker)
{
    int64 job_id = arg_job_id(fcinfo, 0);
    int64 fence = arg_fence(fcinfo, 1);
    NameArg queue = arg_queue(fcinfo, 2);
    NameArg worker = arg_worker(fcinfo, 3);
    int32 batch = arg_count(fcinfo, 4, "batch", core::kMaxBatch);
    bool no_lease = false;
    Datum lease = arg_span(fcinfo, 5, "lease", false, true, &no_lease);
    refuse_subtransaction(function);
    InitMaterializedSRF(fcinfo, 0);

    Datum now = TimestampTzGetDatum(GetCurrentTimestamp());
    Params done;
    done.add(Int64GetDatum(job_id)).add(Int64GetDatum(fence)).add(now).add_caller(access);
    Params claim;
    claim.add(now).add(worker.datum).add(lease, no_lease);
    claim.add(queue.datum).add(Int32GetDatum(batch)).add_caller(access);
    spi_open(access);
    if (execute(statements::complete_job, done, SPI_OK_UPDATE_RETURNING) == 0)
        raise_not_current(access, function, job_id, fence);
    uint64 rows = execute(statements::claim_job, claim, SPI_OK_UPDATE_RETURNING);
    if (rows == 0)
        check_queue(access, function, queue.datum, queue.cstr);
    return_claimed(fcinfo, rows);
    spi_close(access);
    return (Datum) 0;
}

JOBCAP_FUNCTION(claim_job_by_id, Duty::worker)
{
    int64 job_id = arg_job_id(fcinfo, 0);
    NameArg worker = arg_worker(fcinfo, 1);
    bool no_lease = false;
    Datum lease = arg_span(fcinfo, 2, "lease", false, true, &no_lease);
    refuse_subtransaction(function);
    InitMaterializedSRF(fcinfo, 0);

    Params p;
    p.add(TimestampTzGetDatum(GetCurrentTimestamp())).add(worker.datum).add(lease, no_lease);
    p.add(Int64GetDatum(job_id)).add_caller(access);
    spi_open(access);
    uint64 rows = execute(statements::claim_job_by_id, p, SPI_OK_UPDATE_RETURNING);
    if (rows == 0)
        check_job(access, function, job_id);
    return_claimed(fcinfo, rows);
    spi_close(access);
    return (Datum) 0;
}
