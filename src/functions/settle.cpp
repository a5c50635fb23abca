// complete_job, fail_job, crash_job, release_job, heartbeat, assert_fence: the calls a worker
// makes while it holds a lease. Each is a compare-and-swap on (job_id, fence, state = running): a worker whose lease was
// reaped, re-claimed, cancelled or settled matches no row and gets the stale-fence error, and
// whatever it wrote in the same transaction rolls back with it. The last parameter of each is
// the caller (access.hpp): a job of a queue not granted to it matches no row either, and
// raise_not_current tells the two apart.
#include "direct/direct.hpp"
#include "spi/access.hpp"
#include "spi/args.hpp"
#include "boundary.hpp"
#include "spi/errors.hpp"
#include "spi/history.hpp"
#include "jobcap.hpp"
#include "spi/plans.hpp"
#include "spi/statements.hpp"
#include "spi/cap.hpp"

namespace jobcap {
namespace statements {

// $5 = output (already bounded: kept_output), NULL for none.
JOBCAP_STATEMENT(
    complete_job,
    "UPDATE jobcap.jobs SET state = 'succeeded', finished_at = $3, lease_expires_at = NULL,"
    "   output = $5"
    " WHERE job_id = $1 AND fence = $2 AND state = 'running'"
    "   AND " JOBCAP_MAY_WORK("$4", "jobs.queue") " RETURNING state",
    {INT8OID, INT8OID, TIMESTAMPTZOID, OIDOID, JSONBOID}, PlanKind::generic);

// complete_job of the 0.1.0 schema (no output column), for the 0.1.0 declarations that call
// this library between its installation and ALTER EXTENSION jobcap UPDATE.
JOBCAP_STATEMENT(
    complete_job_0_1,
    "UPDATE jobcap.jobs SET state = 'succeeded', finished_at = $3, lease_expires_at = NULL"
    " WHERE job_id = $1 AND fence = $2 AND state = 'running'"
    "   AND " JOBCAP_MAY_WORK("$4", "jobs.queue") " RETURNING state",
    {INT8OID, INT8OID, TIMESTAMPTZOID, OIDOID}, PlanKind::generic);

// The attempt that just failed was the last when attempts has reached the cap (CAP: the cap of
// job j joined with queue q, spi/cap.hpp): the claim counted it already. fail_job and crash_job
// differ only in the history row's KIND. $4 = retry_in (NULL: the queue's backoff), $5 = now,
// $6 = caller. Returns the new state, whether to wake the queue's listeners (a retry on a queue
// with notify on), and the queue.
#define FAIL_THE_ATTEMPT(KIND, CAP)                                                                \
    "WITH failed AS (UPDATE jobcap.jobs j"                                                         \
    "   SET state = CASE WHEN j.attempts >= " CAP                                                  \
    " THEN 'dead' ELSE 'pending' END::jobcap.job_state,"                                           \
    "       run_at = CASE WHEN j.attempts >= " CAP                                                 \
    " THEN j.run_at ELSE $5 +"                                                                     \
    "         coalesce($4, jobcap.backoff(j.attempts, q.backoff_base, q.backoff_max)) END,"        \
    "       finished_at = CASE WHEN j.attempts >= " CAP                                            \
    " THEN $5 END,"                                                                                \
    "       lease_expires_at = NULL"                                                               \
    "  FROM jobcap.queues q"                                                                       \
    " WHERE j.job_id = $1 AND j.fence = $2 AND j.state = 'running' AND q.queue = j.queue"          \
    "   AND " JOBCAP_MAY_WORK("$6", "j.queue")                                                     \
    " RETURNING j.job_id, j.queue, j.attempts, j.fence, j.worker, j.state),"                       \
    JOBCAP_HISTORY_CTES("failed", KIND, "$3", "$5")                                                \
    " SELECT f.state, f.state = 'pending' AND q.notify, f.queue"                                   \
    "   FROM failed f JOIN jobcap.queues q ON q.queue = f.queue"

JOBCAP_STATEMENT(fail_job, FAIL_THE_ATTEMPT("'error'", JOBCAP_CAP),
                 {INT8OID, INT8OID, TEXTOID, INTERVALOID, TIMESTAMPTZOID, OIDOID},
                 PlanKind::generic);

// fail_job of the 0.1.0 schema (0.1.0's cap rule: no cap_epoch yet), between installing this
// library and ALTER EXTENSION jobcap UPDATE.
JOBCAP_STATEMENT(fail_job_0_1, FAIL_THE_ATTEMPT("'error'", JOBCAP_CAP_0_1),
                 {INT8OID, INT8OID, TEXTOID, INTERVALOID, TIMESTAMPTZOID, OIDOID},
                 PlanKind::generic);
// The handler's process died (seen by the process that holds the lease): an attempt that
// counts, recorded as a crash.
JOBCAP_STATEMENT(crash_job, FAIL_THE_ATTEMPT("'crashed'", JOBCAP_CAP),
                 {INT8OID, INT8OID, TEXTOID, INTERVALOID, TIMESTAMPTZOID, OIDOID},
                 PlanKind::generic);

// A claimed job whose handler never started goes back: pending, the claim's attempt given back
// (the claim counted it), the lease dropped. The fence stays where the claim put it, and the job
// is no longer running, so that fence is stale for good: the next claim takes a newer one from
// the sequence. run_at is kept: the job was due when it was claimed. The history row names the
// attempt given back. $3 = now, $4 = caller.
JOBCAP_STATEMENT(release_job,
    "WITH released AS (UPDATE jobcap.jobs j SET state = 'pending', attempts = j.attempts - 1,"
    "       lease_expires_at = NULL"
    " WHERE j.job_id = $1 AND j.fence = $2 AND j.state = 'running' AND j.attempts > 0"
    "   AND " JOBCAP_MAY_WORK("$4", "j.queue")
    " RETURNING j.job_id, j.queue, j.attempts + 1 AS attempts, j.fence, j.worker, j.state),"
    JOBCAP_HISTORY_CTES("released", "'released'", "NULL", "$3")
    " SELECT state FROM released",
    {INT8OID, INT8OID, TIMESTAMPTZOID, OIDOID}, PlanKind::generic);

// A batch completion: one compare-and-swap UPDATE for all the jobs, and the first (in input
// order) whose (job, fence) pair was not settled, if any (matched on the pair, so a job listed
// twice, once with a stale fence, still raises); the caller then raises, and nothing of the batch
// commits. $1 = job ids, $2 = fences, $3 = now, $4 = caller: a job of a queue not granted to it
// is not settled either, and raise_not_current then refuses it with 42501.
// $5 = outputs (NULL: none; else as long as $1, each already bounded).
JOBCAP_STATEMENT(complete_jobs, "WITH input AS (SELECT * FROM unnest($1::bigint[], $2::bigint[], $5::jsonb[])"
    "                 WITH ORDINALITY AS i(job_id, fence, output, n)),"
    " settled AS (UPDATE jobcap.jobs j SET state = 'succeeded', finished_at = $3,"
    "     lease_expires_at = NULL, output = i.output"
    "   FROM input i WHERE j.job_id = i.job_id AND (j.fence = i.fence AND j.state = 'running') IS TRUE"
    "     AND " JOBCAP_MAY_WORK("$4", "j.queue")
    "   RETURNING j.job_id, j.fence)"
    " SELECT c.settled, m.job_id, m.fence"
    "   FROM (SELECT count(*)::int AS settled FROM settled) c"
    "   LEFT JOIN LATERAL (SELECT i.job_id, i.fence FROM input i"
    "      WHERE NOT EXISTS (SELECT FROM settled s WHERE s.job_id = i.job_id AND s.fence = i.fence)"
    "      ORDER BY i.n LIMIT 1) m ON true",
    {INT8ARRAYOID, INT8ARRAYOID, TIMESTAMPTZOID, OIDOID, JSONBARRAYOID}, PlanKind::steered);

// complete_jobs of the 0.1.0 schema (no output column), for its two-argument declaration.
JOBCAP_STATEMENT(complete_jobs_0_1, "WITH input AS (SELECT * FROM unnest($1::bigint[], $2::bigint[])"
    "                 WITH ORDINALITY AS i(job_id, fence, n)),"
    " settled AS (UPDATE jobcap.jobs j SET state = 'succeeded', finished_at = $3,"
    "     lease_expires_at = NULL"
    "   FROM input i WHERE j.job_id = i.job_id AND (j.fence = i.fence AND j.state = 'running') IS TRUE"
    "     AND " JOBCAP_MAY_WORK("$4", "j.queue")
    "   RETURNING j.job_id, j.fence)"
    " SELECT c.settled, m.job_id, m.fence"
    "   FROM (SELECT count(*)::int AS settled FROM settled) c"
    "   LEFT JOIN LATERAL (SELECT i.job_id, i.fence FROM input i"
    "      WHERE NOT EXISTS (SELECT FROM settled s WHERE s.job_id = i.job_id AND s.fence = i.fence)"
    "      ORDER BY i.n LIMIT 1) m ON true",
    {INT8ARRAYOID, INT8ARRAYOID, TIMESTAMPTZOID, OIDOID}, PlanKind::steered);

// A heartbeat never shortens a lease. $3 = extend (NULL: the length the claim granted), $4 = now,
// $5 = caller.
// lease_expires_at is in no index, so this is a HOT update.
JOBCAP_STATEMENT(heartbeat,
                 "UPDATE jobcap.jobs SET lease_expires_at ="
                 "   greatest(lease_expires_at, $4 + coalesce($3, lease))"
                 " WHERE job_id = $1 AND fence = $2 AND state = 'running'"
                 "   AND " JOBCAP_MAY_WORK("$5", "jobs.queue") " RETURNING lease_expires_at",
                 {INT8OID, INT8OID, INTERVALOID, TIMESTAMPTZOID, OIDOID}, PlanKind::generic);

// The row lock is held to the end of the caller's transaction: the reaper skips locked rows,
// and any other settle waits, so effects committed with this transaction committed under a
// current lease.
JOBCAP_STATEMENT(assert_fence,
                 "SELECT FROM jobcap.jobs WHERE job_id = $1 AND fence = $2 AND state = 'running'"
                 "   AND " JOBCAP_MAY_WORK("$3", "jobs.queue") " FOR NO KEY UPDATE",
                 {INT8OID, INT8OID, OIDOID}, PlanKind::generic);

}  // namespace statements

namespace {

// A text result as a C string allocated outside SPI's memory, so it outlives spi_close().
char* spi_copy_cstring(Datum value)
{
    text* t = DatumGetTextPP(value);
    char* copy = static_cast<char*>(SPI_palloc(VARSIZE_ANY_EXHDR(t) + 1));
    text_to_cstring_buffer(t, copy, VARSIZE_ANY_EXHDR(t) + 1);
    return copy;
}

// Runs one fenced compare-and-swap as the tables' owner and returns its single result column
// (passed by value: a state, a timestamp), or raises the stale-fence error when it matched no
// row. assert_fence's statement returns no column: its result is (Datum) 0.
Datum compare_and_swap(Access& access, Statement& s, const char* function, int64 job_id,
                       int64 fence, const Params& p, int expected)
{
    spi_open(access);
    if (execute(s, p, expected) == 0)
        raise_not_current(access, function, job_id, fence);
    Datum result = SPI_tuptable->tupdesc->natts > 0 ? result_column(0, 1) : (Datum) 0;
    spi_close(access);
    return result;
}

// complete_jobs' outputs, each bounded as complete_job bounds one; NULL elements stay NULL.
Datum kept_outputs(ArrayType* outputs, int count)
{
    if (ARR_NDIM(outputs) > 1)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("outputs must be a one-dimensional array")));
    Datum* elems = nullptr;
    bool* nulls = nullptr;
    int n = 0;
    deconstruct_array(outputs, JSONBOID, -1, false, TYPALIGN_INT, &elems, &nulls, &n);
    if (n != count)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("outputs must be NULL or have one element per job"),
                        errdetail("%d job ids, %d outputs.", count, n)));
    if (n == 0)
        return PointerGetDatum(outputs);
    for (int i = 0; i < n; ++i)
        if (!nulls[i])
            elems[i] = kept_output(elems[i]);
    int dims[1] = {n};
    int lbs[1] = {1};
    return PointerGetDatum(
        construct_md_array(elems, nulls, 1, dims, lbs, JSONBOID, -1, false, TYPALIGN_INT));
}

// fail_job and crash_job: the job, its fence and the error text (argument 2, cut to
// jobcap.max_error_bytes; NULL allowed), the first parameters of both statements.
Params failed_attempt_params(FunctionCallInfo fcinfo, int64 job_id, int64 fence)
{
    Params p;
    p.add(Int64GetDatum(job_id)).add(Int64GetDatum(fence));
    p.add(PG_ARGISNULL(2) ? (Datum) 0 : kept_text(PG_GETARG_TEXT_PP(2)), PG_ARGISNULL(2));
    return p;
}

// fail_job and crash_job: the fenced compare-and-swap of a failed attempt; a retry wakes the
// queue's listeners as an enqueue does (the NOTIFY is sent at commit).
Datum fail_attempt(Access& access, Statement& s, const char* function, int64 job_id, int64 fence,
                   const Params& p, const char* kind)
{
    // Params: job, fence, error, retry_in, now (failed_attempt_params, then the caller's).
    if (kind != nullptr && direct::usable(function, direct::Need::fail)) {
        Datum state = (Datum) 0;
        char* wake = nullptr;
        if (direct::fail(access, job_id, fence, p.values[2], p.nulls[2] == 'n', p.values[3],
                         p.nulls[3] == 'n', kind, DatumGetTimestampTz(p.values[4]), &state,
                         &wake)) {
            if (wake != nullptr)
                Async_Notify("jobcap", wake);
            return state;
        }
        spi_open(access);
        raise_not_current(access, function, job_id, fence);
    }
    spi_open(access);
    if (execute(s, p, SPI_OK_SELECT) == 0)
        raise_not_current(access, function, job_id, fence);
    Datum state = result_column(0, 1);
    char* wake =
        DatumGetBool(result_column(0, 2)) ? spi_copy_cstring(result_column(0, 3)) : nullptr;
    spi_close(access);
    if (wake != nullptr)
        Async_Notify("jobcap", wake);
    return state;
}

}  // namespace

}  // namespace jobcap

using namespace jobcap;

// The output argument is new in 0.2.0: the 0.1.0 declaration passes two arguments.
JOBCAP_FUNCTION(complete_job, Duty::worker)
{
    int64 job_id = arg_job_id(fcinfo, 0);
    int64 fence = arg_fence(fcinfo, 1);
    Params p;
    p.add(Int64GetDatum(job_id)).add(Int64GetDatum(fence));
    p.add(TimestampTzGetDatum(GetCurrentTimestamp())).add_caller(access);
    // The 0.1.0 declaration (two arguments) runs on the 0.1.0 schema: no output column yet.
    bool schema_0_1 = PG_NARGS() < 3;
    if (schema_0_1)
        return compare_and_swap(access, statements::complete_job_0_1, function, job_id, fence, p,
                                SPI_OK_UPDATE_RETURNING);
    bool no_output = PG_ARGISNULL(2);
    p.add(no_output ? (Datum) 0 : kept_output(PG_GETARG_DATUM(2)), no_output);
    if (direct::usable(function)) {
        if (direct::complete(access, job_id, fence, DatumGetTimestampTz(p.values[2]), p.values[4],
                             no_output))
            return direct::succeeded_state();
        spi_open(access);
        raise_not_current(access, function, job_id, fence);
    }
    return compare_and_swap(access, statements::complete_job, function, job_id, fence, p,
                            SPI_OK_UPDATE_RETURNING);
}

JOBCAP_FUNCTION(fail_job, Duty::worker)
{
    int64 job_id = arg_job_id(fcinfo, 0);
    int64 fence = arg_fence(fcinfo, 1);
    bool no_retry_in = false;
    Datum retry_in = arg_span(fcinfo, 3, "retry_in", true, true, &no_retry_in);
    Params p = failed_attempt_params(fcinfo, job_id, fence);
    p.add(retry_in, no_retry_in).add(TimestampTzGetDatum(GetCurrentTimestamp())).add_caller(access);
    if (!schema_is_0_2())
        return fail_attempt(access, statements::fail_job_0_1, function, job_id, fence, p, nullptr);
    return fail_attempt(access, statements::fail_job, function, job_id, fence, p, "error");
}

JOBCAP_FUNCTION(crash_job, Duty::worker)
{
    int64 job_id = arg_job_id(fcinfo, 0);
    int64 fence = arg_fence(fcinfo, 1);
    Params p = failed_attempt_params(fcinfo, job_id, fence);
    // No retry_in: a crash waits out the queue's backoff.
    p.add((Datum) 0, true).add(TimestampTzGetDatum(GetCurrentTimestamp())).add_caller(access);
    return fail_attempt(access, statements::crash_job, function, job_id, fence, p, "crashed");
}

JOBCAP_FUNCTION(release_job, Duty::worker)
{
    int64 job_id = arg_job_id(fcinfo, 0);
    int64 fence = arg_fence(fcinfo, 1);
    Params p;
    p.add(Int64GetDatum(job_id)).add(Int64GetDatum(fence));
    p.add(TimestampTzGetDatum(GetCurrentTimestamp())).add_caller(access);
    return compare_and_swap(access, statements::release_job, function, job_id, fence, p,
                            SPI_OK_SELECT);
}

JOBCAP_FUNCTION(heartbeat, Duty::worker)
{
    int64 job_id = arg_job_id(fcinfo, 0);
    int64 fence = arg_fence(fcinfo, 1);
    bool no_extend = false;
    Datum extend = arg_span(fcinfo, 2, "extend", false, true, &no_extend);
    Params p;
    p.add(Int64GetDatum(job_id)).add(Int64GetDatum(fence)).add(extend, no_extend);
    p.add(TimestampTzGetDatum(GetCurrentTimestamp())).add_caller(access);
    if (direct::usable(function)) {
        TimestampTz expires = 0;
        if (direct::heartbeat(access, job_id, fence, extend, no_extend,
                              DatumGetTimestampTz(p.values[3]), &expires))
            return TimestampTzGetDatum(expires);
        spi_open(access);
        raise_not_current(access, function, job_id, fence);
    }
    return compare_and_swap(access, statements::heartbeat, function, job_id, fence, p,
                            SPI_OK_UPDATE_RETURNING);
}

JOBCAP_FUNCTION(assert_fence, Duty::worker)
{
    int64 job_id = arg_job_id(fcinfo, 0);
    int64 fence = arg_fence(fcinfo, 1);
    Params p;
    p.add(Int64GetDatum(job_id)).add(Int64GetDatum(fence)).add_caller(access);
    if (!direct::usable(function)) {
        compare_and_swap(access, statements::assert_fence, function, job_id, fence, p,
                         SPI_OK_SELECT);
    } else if (!direct::assert_fence(access, job_id, fence)) {
        spi_open(access);
        raise_not_current(access, function, job_id, fence);
    }
    // The row lock is the point of the call, and rolling back to a savepoint releases the row
    // locks taken after it: the job could then be reaped and claimed again while this
    // transaction goes on to commit its effects. Refused there, after the fence check, so that
    // a stale fence is still reported as such.
    refuse_subtransaction(function,
                          "Rolling back to a savepoint would release the job's row lock, and the "
                          "job could be reaped and claimed again while this transaction commits.",
                          "Call jobcap.assert_fence outside savepoints and exception blocks, in "
                          "the transaction that writes the job's effects.");
    PG_RETURN_VOID();
}

JOBCAP_FUNCTION(complete_jobs, Duty::worker)
{
    ArrayType* ids = DatumGetArrayTypeP(arg_required(fcinfo, 0, "job_ids"));
    ArrayType* fences = DatumGetArrayTypeP(arg_required(fcinfo, 1, "fences"));
    int count = ArrayGetNItems(ARR_NDIM(ids), ARR_DIMS(ids));
    if (count != ArrayGetNItems(ARR_NDIM(fences), ARR_DIMS(fences)))
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("job_ids and fences must have the same length")));
    if (array_contains_nulls(ids) || array_contains_nulls(fences))
        ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
                        errmsg("job_ids and fences must not contain nulls")));
    if (count > core::kMaxBatch)
        ereport(ERROR,
                (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
                 errmsg("cannot complete %d jobs in one call", count),
                 errhint("Complete at most %d jobs per call.", static_cast<int>(core::kMaxBatch))));
    // outputs is new in 0.2.0 (the 0.1.0 declaration passes two arguments): NULL or one per job.
    bool no_outputs = PG_NARGS() < 3 || PG_ARGISNULL(2);
    Datum outputs =
        no_outputs ? (Datum) 0 : kept_outputs(DatumGetArrayTypeP(PG_GETARG_DATUM(2)), count);
    Params p;
    p.add(PointerGetDatum(ids)).add(PointerGetDatum(fences));
    p.add(TimestampTzGetDatum(GetCurrentTimestamp())).add_caller(access);
    bool schema_0_1 = PG_NARGS() < 3;
    if (!schema_0_1 && direct::usable(function)) {
        int64* job_ids = reinterpret_cast<int64*>(ARR_DATA_PTR(ids));
        int64* job_fences = reinterpret_cast<int64*>(ARR_DATA_PTR(fences));
        Datum* kept = nullptr;
        bool* no_kept = nullptr;
        if (!no_outputs && count > 0) {
            int n = 0;
            deconstruct_array(DatumGetArrayTypeP(outputs), JSONBOID, -1, false, TYPALIGN_INT, &kept,
                              &no_kept, &n);
        }
        int settled = 0;
        int stale = direct::complete_many(access, job_ids, job_fences, kept, no_kept, count,
                                          DatumGetTimestampTz(p.values[2]), &settled);
        if (stale >= 0) {
            spi_open(access);
            raise_not_current(access, function, job_ids[stale], job_fences[stale]);
        }
        PG_RETURN_INT32(settled);
    }
    if (!schema_0_1)
        p.add(outputs, no_outputs);
    spi_open(access);
    execute(schema_0_1 ? statements::complete_jobs_0_1 : statements::complete_jobs, p,
            SPI_OK_SELECT);
    int32 settled = DatumGetInt32(result_column(0, 1));
    bool all_current = false;
    Datum stale_job = result_column(0, 2, &all_current);
    if (!all_current)
        raise_not_current(access, function, DatumGetInt64(stale_job),
                          DatumGetInt64(result_column(0, 3)));
    spi_close(access);
    PG_RETURN_INT32(settled);
}
