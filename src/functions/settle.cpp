// complete_job, fail_job, crash_job, release_job, heartbeat, assert_fence: the calls a worker makes
// while it holds a lease. Each is a compare-and-swap on (job_id, fence, state = running): a worker
// whose lease was reaped, re-claimed, cancelled or settled matches no row and gets the stale-fence
// error, and whatever it wrote in the same transaction rolls back with it. The last parameter of
// each is the caller (access.hpp): a job of a queue not granted to it matches no row either, and
// raise_not_current tells the two apart. The fence and state tests sit inside IS TRUE, as in the
// batch statements and the reaper's, so that the row is found by its primary key: jobs_running
// matches state = 'running' but is keyed by the queue's hash first (0.3.0), and a generic plan
// made while it looked small would walk every running job's entry for a job_id that is not its
// first key.
#include "functions/hot_path.hpp"
#include "spi/access.hpp"
#include "spi/args.hpp"
#include "boundary.hpp"
#include "spi/errors.hpp"
#include "spi/history.hpp"
#include "jobcap.hpp"
#include "spi/plans.hpp"
#include "spi/schema.hpp"
#include "spi/statements.hpp"
#include "spi/cap.hpp"
#include "housekeeping/workflows.hpp"

namespace jobcap {
namespace statements {

// $5 = output (already bounded: kept_output), NULL for none. Column 2: whether jobs wait for
// this one (their release follows: housekeeping/workflows.hpp), read from the version the
// UPDATE locked, so that a dependent enqueued while the completion waited for the row counts.
#define COMPLETE_JOB(DEPENDENTS)                                                                   \
    "UPDATE jobcap.jobs SET state = 'succeeded', finished_at = $3, lease_expires_at = NULL,"       \
    "   output = $5"                                                                               \
    " WHERE job_id = $1 AND (fence = $2 AND state = 'running') IS TRUE"                            \
    "   AND " JOBCAP_MAY_WORK("$4", "jobs.queue") " RETURNING state, " DEPENDENTS

JOBCAP_STATEMENT(complete_job, COMPLETE_JOB("has_dependents"),
                 {INT8OID, INT8OID, TIMESTAMPTZOID, OIDOID, JSONBOID}, PlanKind::generic);

// compat(0.2.0): the same on the 0.2.0 schema, where nothing depends on a job.
JOBCAP_STATEMENT(complete_job_0_2, COMPLETE_JOB("NULL::boolean"),
                 {INT8OID, INT8OID, TIMESTAMPTZOID, OIDOID, JSONBOID}, PlanKind::generic);

// compat(0.1.0): complete_job of the 0.1.0 schema (no output column), for the 0.1.0 declarations
// that call this library between its installation and ALTER EXTENSION jobcap UPDATE.
JOBCAP_STATEMENT(
    complete_job_0_1,
    "UPDATE jobcap.jobs SET state = 'succeeded', finished_at = $3, lease_expires_at = NULL"
    " WHERE job_id = $1 AND (fence = $2 AND state = 'running') IS TRUE"
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
    " WHERE j.job_id = $1 AND (j.fence = $2 AND j.state = 'running') IS TRUE AND q.queue = j.queue"          \
    "   AND " JOBCAP_MAY_WORK("$6", "j.queue")                                                     \
    " RETURNING j.job_id, j.queue, j.attempts, j.fence, j.worker, j.state),"                       \
    JOBCAP_HISTORY_CTES("failed", KIND, "$3", "$5")                                                \
    " SELECT f.state, f.state = 'pending' AND q.notify, f.queue"                                   \
    "   FROM failed f JOIN jobcap.queues q ON q.queue = f.queue"

JOBCAP_STATEMENT(fail_job, FAIL_THE_ATTEMPT("'error'", JOBCAP_CAP),
                 {INT8OID, INT8OID, TEXTOID, INTERVALOID, TIMESTAMPTZOID, OIDOID},
                 PlanKind::generic);

// compat(0.1.0): fail_job of the 0.1.0 schema (0.1.0's cap rule: no cap_epoch yet), between
// installing this library and ALTER EXTENSION jobcap UPDATE.
JOBCAP_STATEMENT(fail_job_0_1, FAIL_THE_ATTEMPT("'error'", JOBCAP_CAP_0_1),
                 {INT8OID, INT8OID, TEXTOID, INTERVALOID, TIMESTAMPTZOID, OIDOID},
                 PlanKind::generic);
// The handler's process died (seen by the process that holds the lease): an attempt that
// counts, recorded as a crash.
JOBCAP_STATEMENT(crash_job, FAIL_THE_ATTEMPT("'crashed'", JOBCAP_CAP),
                 {INT8OID, INT8OID, TEXTOID, INTERVALOID, TIMESTAMPTZOID, OIDOID},
                 PlanKind::generic);
// The worker's own hard time limit ended the handler: an attempt that counts, recorded as the
// background worker records an attempt past its max_run_time.
JOBCAP_STATEMENT(time_out_job, FAIL_THE_ATTEMPT("'timed_out'", JOBCAP_CAP),
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
    " WHERE j.job_id = $1 AND (j.fence = $2 AND j.state = 'running') IS TRUE AND j.attempts > 0"
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
// $5 = outputs (NULL: none; else as long as $1, each already bounded). Column 4: the completed
// jobs that others wait for (released next: housekeeping/workflows.hpp), NULL for none.
#define COMPLETE_JOBS(DEPENDENTS)                                                                  \
    "WITH input AS (SELECT * FROM unnest($1::bigint[], $2::bigint[], $5::jsonb[])"                 \
    "                 WITH ORDINALITY AS i(job_id, fence, output, n)),"                            \
    " settled AS (UPDATE jobcap.jobs j SET state = 'succeeded', finished_at = $3,"                 \
    "     lease_expires_at = NULL, output = i.output"                                              \
    "   FROM input i WHERE j.job_id = i.job_id AND (j.fence = i.fence AND j.state = 'running') "   \
    "IS "                                                                                          \
    "TRUE"                                                                                         \
    "     AND " JOBCAP_MAY_WORK(                                                                   \
        "$4", "j.queue") "   RETURNING j.job_id, j.fence, " DEPENDENTS                             \
                         " AS dependents)"                                                         \
                         " SELECT c.settled, m.job_id, m.fence,"                                   \
                         "   (SELECT array_agg(s.job_id) FROM settled s WHERE s.dependents)"       \
                         "   FROM (SELECT count(*)::int AS settled FROM settled) c"                \
                         "   LEFT JOIN LATERAL (SELECT i.job_id, i.fence FROM input i"             \
                         "      WHERE NOT EXISTS (SELECT FROM settled s WHERE s.job_id = "         \
                         "i.job_id AND s.fence = "                                                 \
                         "i.fence)"                                                                \
                         "      ORDER BY i.n LIMIT 1) m ON true"

JOBCAP_STATEMENT(complete_jobs, COMPLETE_JOBS("j.has_dependents"),
                 {INT8ARRAYOID, INT8ARRAYOID, TIMESTAMPTZOID, OIDOID, JSONBARRAYOID},
                 PlanKind::steered);

// compat(0.2.0): the same on the 0.2.0 schema, where nothing depends on a job.
JOBCAP_STATEMENT(complete_jobs_0_2, COMPLETE_JOBS("NULL::boolean"),
                 {INT8ARRAYOID, INT8ARRAYOID, TIMESTAMPTZOID, OIDOID, JSONBARRAYOID},
                 PlanKind::steered);

// compat(0.1.0): complete_jobs of the 0.1.0 schema (no output column), for its two-argument
// declaration.
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
                 " WHERE job_id = $1 AND (fence = $2 AND state = 'running') IS TRUE"
                 "   AND " JOBCAP_MAY_WORK("$5", "jobs.queue") " RETURNING lease_expires_at",
                 {INT8OID, INT8OID, INTERVALOID, TIMESTAMPTZOID, OIDOID}, PlanKind::generic);

// The row lock is held to the end of the caller's transaction: the reaper skips locked rows,
// and any other settle waits, so effects committed with this transaction committed under a
// current lease.
JOBCAP_STATEMENT(
    assert_fence,
    "SELECT FROM jobcap.jobs WHERE job_id = $1 AND (fence = $2 AND state = 'running') IS TRUE"
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
Datum compare_and_swap(Access& access, Statement& s, const char* function, const FencedCall& job,
                       const Params& p, int expected)
{
    spi_open(access);
    if (execute(s, p, expected) == 0)
        raise_not_current(access, function, job.job_id, job.fence);
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

// job_id and fence (arguments 0 and 1), and the call's clock reading: every fenced call's.
FencedCall read_fenced(FunctionCallInfo fcinfo)
{
    FencedCall job;
    job.job_id = arg_job_id(fcinfo, 0);
    job.fence = arg_fence(fcinfo, 1);
    job.now = GetCurrentTimestamp();
    return job;
}

// The job and its fence, then the call's clock reading and the caller: the parameters that
// complete_job, release_job (and, with the output, complete_job on the 0.2.0 schema) take.
Params fenced_params(const FencedCall& job, const Access& access)
{
    Params p;
    p.add(Int64GetDatum(job.job_id)).add(Int64GetDatum(job.fence));
    p.add(TimestampTzGetDatum(job.now)).add_caller(access);
    return p;
}

// fail_job and crash_job: the fenced call and the error text (argument 2, cut to
// jobcap.max_error_bytes; NULL allowed); retry_in is the caller's to set.
FailCall read_failure(FunctionCallInfo fcinfo, const char* kind)
{
    FailCall f = {};
    f.job = read_fenced(fcinfo);
    f.no_error = PG_ARGISNULL(2);
    f.error = f.no_error ? (Datum) 0 : kept_text(PG_GETARG_TEXT_PP(2));
    f.no_retry_in = true;
    f.kind = kind;
    return f;
}

// fail_job and crash_job: the fenced compare-and-swap of a failed attempt (statement s on the
// SQL path; direct: whether the direct path may serve it at all); a retry wakes the queue's
// listeners as an enqueue does (the NOTIFY is sent at commit).
Datum fail_attempt(Access& access, Statement& s, const char* function, const FailCall& f,
                   bool direct)
{
    Datum state = (Datum) 0;
    char* wake = nullptr;
    if (direct && served_directly(access, function, direct::Need::fail, [&](FencedCall* stale) {
            *stale = f.job;
            return direct::fail(access, f, &state, &wake);
        })) {
        if (wake != nullptr) {
            Async_Notify("jobcap", wake);
        } else if (job_state_is(state, "dead")) {
            // A job that died takes the jobs waiting for it with it.
            spi_open(access);
            cancel_dependents(&f.job.job_id, 1, f.job.now);
            spi_close(access);
        }
        return state;
    }
    Params p;
    p.add(Int64GetDatum(f.job.job_id)).add(Int64GetDatum(f.job.fence)).add(f.error, f.no_error);
    p.add(f.retry_in, f.no_retry_in).add(TimestampTzGetDatum(f.job.now)).add_caller(access);
    spi_open(access);
    if (execute(s, p, SPI_OK_SELECT) == 0)
        raise_not_current(access, function, f.job.job_id, f.job.fence);
    state = result_column(0, 1);
    wake = DatumGetBool(result_column(0, 2)) ? spi_copy_cstring(result_column(0, 3)) : nullptr;
    if (job_state_is(state, "dead"))
        cancel_dependents(&f.job.job_id, 1, f.job.now);
    spi_close(access);
    if (wake != nullptr)
        Async_Notify("jobcap", wake);
    return state;
}

}  // namespace

Datum complete_with_statements(Access& access, const char* function, const CompleteCall& c,
                               bool schema_0_1)
{
    Params p = fenced_params(c.job, access);
    // compat(0.1.0): the 0.1.0 schema's statement, without output. compat(0.2.0): the 0.2.0
    // schema's, where nothing depends on a job.
    Statement& s = schema_0_1                  ? statements::complete_job_0_1
                   : workflows_schema_exists() ? statements::complete_job
                                               : statements::complete_job_0_2;
    if (!schema_0_1)
        p.add(c.output, c.no_output);
    if (execute(s, p, SPI_OK_UPDATE_RETURNING) == 0)
        raise_not_current(access, function, c.job.job_id, c.job.fence);
    Datum state = result_column(0, 1);
    bool none = schema_0_1;
    Datum dependents = none ? (Datum) 0 : result_column(0, 2, &none);
    if (!none && DatumGetBool(dependents))
        release_dependents(&c.job.job_id, 1, c.job.now);
    return state;
}

void release_after_direct(Access& access, const int64* ids, int n, TimestampTz now)
{
    if (n == 0)
        return;
    spi_open(access);
    release_dependents(ids, n, now);
    spi_close(access);
}

}  // namespace jobcap

using namespace jobcap;

JOBCAP_FUNCTION(complete_job, Duty::worker)
{
    CompleteCall c = {};
    c.job = read_fenced(fcinfo);
    // compat(0.1.0): the 0.1.0 declaration (two arguments) runs on the 0.1.0 schema, which has
    // no output column yet.
    bool schema_0_1 = PG_NARGS() < 3;
    c.no_output = schema_0_1 || PG_ARGISNULL(2);
    c.output = c.no_output ? (Datum) 0 : kept_output(PG_GETARG_DATUM(2));
    bool dependents = false;
    if (!schema_0_1 &&
        served_directly(access, function, direct::Need::update, [&](FencedCall* stale) {
            *stale = c.job;
            return direct::complete(access, c, &dependents);
        })) {
        release_after_direct(access, &c.job.job_id, dependents ? 1 : 0, c.job.now);
        return direct::succeeded_state();
    }
    spi_open(access);
    Datum state = complete_with_statements(access, function, c, schema_0_1);
    spi_close(access);
    return state;
}

JOBCAP_FUNCTION(fail_job, Duty::worker)
{
    FailCall f = read_failure(fcinfo, "error");
    f.retry_in = arg_span(fcinfo, 3, "retry_in", true, true, &f.no_retry_in);
    // compat(0.1.0): the 0.1.0 schema's statement, with 0.1.0's cap rule, on the SQL path.
    if (!queues_paused_column_exists())
        return fail_attempt(access, statements::fail_job_0_1, function, f, false);
    return fail_attempt(access, statements::fail_job, function, f, true);
}

JOBCAP_FUNCTION(crash_job, Duty::worker)
{
    // No retry_in: a crash waits out the queue's backoff.
    FailCall f = read_failure(fcinfo, "crashed");
    return fail_attempt(access, statements::crash_job, function, f, true);
}

JOBCAP_FUNCTION(time_out_job, Duty::worker)
{
    // No retry_in: a time-out waits out the queue's backoff, as a crash does.
    FailCall f = read_failure(fcinfo, "timed_out");
    return fail_attempt(access, statements::time_out_job, function, f, true);
}

JOBCAP_FUNCTION(release_job, Duty::worker)
{
    FencedCall job = read_fenced(fcinfo);
    return compare_and_swap(access, statements::release_job, function, job,
                            fenced_params(job, access), SPI_OK_SELECT);
}

JOBCAP_FUNCTION(heartbeat, Duty::worker)
{
    HeartbeatCall h = {};
    h.job = read_fenced(fcinfo);
    h.extend = arg_span(fcinfo, 2, "extend", false, true, &h.no_extend);
    TimestampTz expires = 0;
    if (served_directly(access, function, direct::Need::update, [&](FencedCall* stale) {
            *stale = h.job;
            return direct::heartbeat(access, h, &expires);
        }))
        return TimestampTzGetDatum(expires);
    Params p;
    p.add(Int64GetDatum(h.job.job_id)).add(Int64GetDatum(h.job.fence)).add(h.extend, h.no_extend);
    p.add(TimestampTzGetDatum(h.job.now)).add_caller(access);
    return compare_and_swap(access, statements::heartbeat, function, h.job, p,
                            SPI_OK_UPDATE_RETURNING);
}

JOBCAP_FUNCTION(assert_fence, Duty::worker)
{
    FencedCall job = read_fenced(fcinfo);
    if (!served_directly(access, function, direct::Need::update, [&](FencedCall* stale) {
            *stale = job;
            return direct::assert_fence(access, job);
        })) {
        Params p;
        p.add(Int64GetDatum(job.job_id)).add(Int64GetDatum(job.fence)).add_caller(access);
        compare_and_swap(access, statements::assert_fence, function, job, p, SPI_OK_SELECT);
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
    // compat(0.1.0): outputs is new in 0.2.0, the 0.1.0 declaration passes two arguments. Else
    // NULL or one per job.
    bool schema_0_1 = PG_NARGS() < 3;
    bool no_outputs = schema_0_1 || PG_ARGISNULL(2);
    Datum outputs =
        no_outputs ? (Datum) 0 : kept_outputs(DatumGetArrayTypeP(PG_GETARG_DATUM(2)), count);
    TimestampTz now = GetCurrentTimestamp();
    int settled = 0;
    int64* dependents = static_cast<int64*>(palloc(sizeof(int64) * Max(count, 1)));
    int ndependents = 0;
    if (!schema_0_1 &&
        served_directly(access, function, direct::Need::update, [&](FencedCall* stale) {
            int64* job_ids = reinterpret_cast<int64*>(ARR_DATA_PTR(ids));
            int64* job_fences = reinterpret_cast<int64*>(ARR_DATA_PTR(fences));
            Datum* kept = nullptr;
            bool* no_kept = nullptr;
            if (!no_outputs && count > 0) {
                int n = 0;
                deconstruct_array(DatumGetArrayTypeP(outputs), JSONBOID, -1, false, TYPALIGN_INT,
                                  &kept, &no_kept, &n);
            }
            int i = direct::complete_many(access, job_ids, job_fences, kept, no_kept, count, now,
                                          &settled, dependents, &ndependents);
            if (i >= 0)
                *stale = FencedCall{job_ids[i], job_fences[i], now};
            return i < 0;
        })) {
        release_after_direct(access, dependents, ndependents, now);
        PG_RETURN_INT32(settled);
    }
    Params p;
    p.add(PointerGetDatum(ids)).add(PointerGetDatum(fences));
    p.add(TimestampTzGetDatum(now)).add_caller(access);
    if (!schema_0_1)
        p.add(outputs, no_outputs);
    spi_open(access);
    // compat(0.2.0): the 0.2.0 schema's statement, where nothing depends on a job.
    execute(schema_0_1                  ? statements::complete_jobs_0_1
            : workflows_schema_exists() ? statements::complete_jobs
                                        : statements::complete_jobs_0_2,
            p, SPI_OK_SELECT);
    settled = DatumGetInt32(result_column(0, 1));
    bool all_current = false;
    Datum stale_job = result_column(0, 2, &all_current);
    if (!all_current)
        raise_not_current(access, function, DatumGetInt64(stale_job),
                          DatumGetInt64(result_column(0, 3)));
    bool none = schema_0_1;
    Datum released = none ? (Datum) 0 : result_column(0, 4, &none);
    if (!none) {
        ArrayType* a = DatumGetArrayTypePCopy(released);
        release_dependents(reinterpret_cast<int64*>(ARR_DATA_PTR(a)),
                           ArrayGetNItems(ARR_NDIM(a), ARR_DIMS(a)), now);
    }
    spi_close(access);
    PG_RETURN_INT32(settled);
}
