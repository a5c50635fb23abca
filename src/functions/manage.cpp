// cancel_job and requeue_job: an operator's hand on one job. requeue_job is the only way out of
// dead or cancelled; nothing leaves succeeded. Counters and fences never go back.
#include "spi/access.hpp"
#include "spi/args.hpp"
#include "boundary.hpp"
#include "spi/errors.hpp"
#include "spi/history.hpp"
#include "spi/plans.hpp"
#include "spi/schema.hpp"
#include "housekeeping/workflows.hpp"

namespace jobcap {
namespace {

// A running job is cancelled at once: its worker learns it from a notification sent at commit
// (housekeeping/workflows.hpp) or at its next fenced call, which gets the stale-fence error, so
// nothing it writes with that call commits. The job's row is locked first, so the state it had
// is known: a running job's worker is notified. A history row keeps who cancelled it ($4). $3 =
// caller (NULL: an operator, who may cancel any job). Returns whether it was running, and its
// fence.
JOBCAP_STATEMENT(
    cancel_job,
    "WITH old AS MATERIALIZED (SELECT j.job_id, j.state FROM jobcap.jobs j"
    "    WHERE j.job_id = $1 AND " JOBCAP_MAY_WORK("$3", "j.queue") " FOR NO KEY UPDATE OF j),"
    " cancelled AS (UPDATE jobcap.jobs j SET state = 'cancelled', finished_at = $2,"
    "     lease_expires_at = NULL"
    "    FROM old o WHERE j.job_id = o.job_id AND j.state IN ('pending', 'running', 'waiting')"
    "    RETURNING j.job_id, j.queue, j.attempts, j.fence, $4::text AS worker, o.state AS was),"
    JOBCAP_HISTORY_CTES("cancelled", "'cancelled'", "'cancelled by ' || s.worker", "$2")
    " SELECT was = 'running', fence FROM cancelled",
    {INT8OID, TIMESTAMPTZOID, OIDOID, TEXTOID}, PlanKind::generic);

// compat(0.2.0): the 0.2.0 schema's (no waiting state, no history kind cancelled).
JOBCAP_STATEMENT(
    cancel_job_0_2,
    "UPDATE jobcap.jobs j SET state = 'cancelled', finished_at = $2, lease_expires_at = NULL"
    " WHERE j.job_id = $1 AND j.state IN ('pending', 'running')"
    "   AND " JOBCAP_MAY_WORK("$3", "j.queue") " RETURNING false, j.fence",
    {INT8OID, TIMESTAMPTZOID, OIDOID}, PlanKind::generic);

// The budget becomes attempts + extra ($3, NULL: the queue's cap), held until the queue's cap is
// next lowered (the job takes the queue's cap_epoch, src/spi/cap.hpp: EPOCH sets it). A new fence
// starts a new generation: a claim that rolled back before the requeue is not counted against the
// new budget (housekeeping/rollbacks.cpp counts only below the claim's fence). The reason goes to
// history with the calling role ($5: the statement runs as the tables' owner, see access.hpp). A
// job whose dedupe key another live job now holds stays where it is (see why_not_requeued).
#define REQUEUE_JOB(EPOCH, STATE)                                                                  \
    "WITH requeued AS (UPDATE jobcap.jobs j SET state = " STATE ","                                \
    "     max_attempts = j.attempts + coalesce($3, q.max_attempts)," EPOCH                         \
    "     run_at = $4, finished_at = NULL, lease_expires_at = NULL,"                               \
    "     fence = nextval('jobcap.fences')"                                                        \
    "   FROM jobcap.queues q"                                                                      \
    "  WHERE j.job_id = $1 AND j.state IN ('dead', 'cancelled') AND q.queue = j.queue"             \
    "    AND NOT EXISTS (SELECT FROM jobcap.jobs o WHERE o.queue = j.queue"                        \
    "          AND o.dedupe_key = j.dedupe_key AND o.job_id <> j.job_id"                           \
    "          AND o.state IN ('pending', 'running', 'dead'))"                                     \
    "  RETURNING j.job_id, j.queue, j.attempts, j.fence, $5 AS worker)," JOBCAP_HISTORY_CTES(      \
        "requeued", "'requeued'", "$2",                                                            \
        "$4") " SELECT r.job_id, q.notify, r.queue FROM requeued r"                                \
              " JOIN jobcap.queues q ON q.queue = r.queue"

JOBCAP_STATEMENT(requeue_job, REQUEUE_JOB(" cap_epoch = q.cap_epoch,", "'pending'"),
                 {INT8OID, TEXTOID, INT4OID, TIMESTAMPTZOID, TEXTOID});

// A job that depends on others goes back to waiting for those that have not succeeded ($6: how
// many, under their row locks: lock_depended_on), or to pending when none is left.
JOBCAP_STATEMENT(
    requeue_dependent,
    REQUEUE_JOB(" cap_epoch = q.cap_epoch, waiting_on = $6,",
                "(CASE WHEN $6 > 0 THEN 'waiting' ELSE 'pending' END)::jobcap.job_state"),
    {INT8OID, TEXTOID, INT4OID, TIMESTAMPTZOID, TEXTOID, INT4OID});

// compat(0.1.0): the same on the 0.1.0 schema (no cap_epoch yet: under 0.1.0's cap rule the job's
// own max_attempts is its cap), between installing this library and ALTER EXTENSION jobcap UPDATE.
JOBCAP_STATEMENT(requeue_job_0_1, REQUEUE_JOB("", "'pending'"),
                 {INT8OID, TEXTOID, INT4OID, TIMESTAMPTZOID, TEXTOID});

// The jobs a job depends on, in job_id order (none: NULL).
JOBCAP_STATEMENT(depends_on,
                 "SELECT array_agg(d.depends_on ORDER BY d.depends_on)"
                 "  FROM jobcap.job_dependencies d WHERE d.job_id = $1",
                 {INT8OID});

JOBCAP_STATEMENT(job_exists, "SELECT FROM jobcap.jobs WHERE job_id = $1", {INT8OID});

// Why a requeue changed nothing: no such job (error), a state requeue does not apply to (false),
// or its dedupe key taken by another live job (error: the caller must choose which one runs).
JOBCAP_STATEMENT(why_not_requeued,
                 "SELECT j.state IN ('dead', 'cancelled'), j.dedupe_key,"
                 "  (SELECT o.job_id FROM jobcap.jobs o WHERE o.queue = j.queue"
                 "     AND o.dedupe_key = j.dedupe_key AND o.job_id <> j.job_id"
                 "     AND o.state IN ('pending', 'running', 'dead') LIMIT 1)"
                 " FROM jobcap.jobs j WHERE j.job_id = $1",
                 {INT8OID});

}  // namespace
}  // namespace jobcap

using namespace jobcap;

// An operator cancels any job; a worker role the jobs of the queues granted to it.
JOBCAP_FUNCTION(cancel_job, Duty::worker)
{
    int64 job_id = arg_job_id(fcinfo, 0);
    TimestampTz now = GetCurrentTimestamp();
    bool operates = may_operate(access);
    Params p;
    p.add(Int64GetDatum(job_id)).add(TimestampTzGetDatum(now));
    p.add(ObjectIdGetDatum(access.caller), operates);
    Params job;
    job.add(Int64GetDatum(job_id));

    spi_open(access);
    // compat(0.2.0): the 0.2.0 schema's statement, without the worker's notification.
    bool workflows = workflows_schema_exists();
    if (workflows)
        p.add(caller_name(access));
    bool cancelled = execute(workflows ? cancel_job : cancel_job_0_2, p,
                             workflows ? SPI_OK_SELECT : SPI_OK_UPDATE_RETURNING) > 0;
    if (cancelled && DatumGetBool(result_column(0, 1)))
        notify_attempt_ended(job_id, DatumGetInt64(result_column(0, 2)), "cancelled");
    if (cancelled)
        cancel_dependents(&job_id, 1, now);
    else if (!operates)
        check_job(access, function, job_id);  // 42501 unless the caller may work it
    else if (execute(job_exists, job, SPI_OK_SELECT) == 0)
        raise_unknown_job(job_id);
    spi_close(access);
    PG_RETURN_BOOL(cancelled);
}

JOBCAP_FUNCTION(requeue_job, Duty::operator_)
{
    int64 job_id = arg_job_id(fcinfo, 0);
    Datum reason = arg_required(fcinfo, 1, "reason");
    if (VARSIZE_ANY_EXHDR(DatumGetTextPP(reason)) == 0)
        ereport(
            ERROR,
            (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("reason must not be empty"),
             errhint("Say why the job deserves more attempts; it is kept in the job's history.")));
    int32 extra = 0;
    bool has_extra = arg_count_opt(fcinfo, 2, "extra_attempts", core::kMaxAttempts, &extra);
    Params p;
    p.add(Int64GetDatum(job_id)).add(kept_text(DatumGetTextPP(reason)));
    p.add(Int32GetDatum(extra), !has_extra).add(TimestampTzGetDatum(GetCurrentTimestamp()));
    p.add(caller_name(access));
    Params job;
    job.add(Int64GetDatum(job_id));

    spi_open(access);
    // A job that depends on others waits for them again (docs/workflows.md): those are locked
    // and counted first, and one that is dead or cancelled must be requeued before it.
    // compat(0.2.0): nothing depends on anything on the 0.2.0 schema.
    Statement* requeue = &requeue_job;
    if (workflows_schema_exists() && execute(depends_on, job, SPI_OK_SELECT) > 0) {
        bool none = false;
        Datum parents = result_column(0, 1, &none);
        if (!none) {
            ArrayType* a = DatumGetArrayTypePCopy(parents);
            DependedOn on = lock_depended_on(access, reinterpret_cast<int64*>(ARR_DATA_PTR(a)),
                                             ArrayGetNItems(ARR_NDIM(a), ARR_DIMS(a)));
            if (on.cause != 0)
                ereport(ERROR,
                        (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                         errmsg("cannot requeue job %lld: job %lld, which it depends on, %s",
                                static_cast<long long>(job_id), static_cast<long long>(on.cause),
                                on.cause_dead ? "is dead" : "was cancelled"),
                         errhint("Requeue job %lld first.", static_cast<long long>(on.cause))));
            p.add(Int32GetDatum(on.waiting));
            requeue = &requeue_dependent;
        }
    }
    // compat(0.1.0): the 0.1.0 schema's requeue, without cap_epoch.
    bool requeued =
        execute(queues_paused_column_exists() ? *requeue : requeue_job_0_1, p, SPI_OK_SELECT) > 0;
    // A requeued job wakes the queue's listeners as an enqueue does (sent at commit); the name
    // is copied out of SPI's memory to outlive spi_close().
    char* wake = nullptr;
    if (requeued && DatumGetBool(result_column(0, 2))) {
        text* queue = DatumGetTextPP(result_column(0, 3));
        wake = static_cast<char*>(SPI_palloc(VARSIZE_ANY_EXHDR(queue) + 1));
        text_to_cstring_buffer(queue, wake, VARSIZE_ANY_EXHDR(queue) + 1);
    }
    if (!requeued) {
        if (execute(why_not_requeued, job, SPI_OK_SELECT) == 0)
            raise_unknown_job(job_id);
        bool no_holder = false;
        Datum holder = result_column(0, 3, &no_holder);
        if (DatumGetBool(result_column(0, 1)) && !no_holder)
            ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                            errmsg("cannot requeue job %lld: job %lld holds its dedupe key \"%s\"",
                                   static_cast<long long>(job_id),
                                   static_cast<long long>(DatumGetInt64(holder)),
                                   TextDatumGetCString(result_column(0, 2))),
                            errhint("Cancel job %lld first, or enqueue the work again.",
                                    static_cast<long long>(DatumGetInt64(holder)))));
    }
    spi_close(access);
    if (wake != nullptr)
        Async_Notify("jobcap", wake);
    PG_RETURN_BOOL(requeued);
}
