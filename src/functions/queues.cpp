// create_queue, alter_queue, drop_queue, pause_queue, resume_queue.
#include "spi/access.hpp"
#include "spi/args.hpp"
#include "boundary.hpp"
#include "spi/errors.hpp"
#include "jobcap.hpp"
#include "spi/plans.hpp"

namespace jobcap {
namespace {

// $7 = max_running: NULL or 0 for no limit.
JOBCAP_STATEMENT(
    insert_queue,
    "INSERT INTO jobcap.queues (queue, max_attempts, lease, backoff_base, backoff_max, notify,"
    "   max_running)"
    " VALUES ($1, $2, $3, $4, $5, $6, nullif($7, 0)) ON CONFLICT (queue) DO NOTHING",
    {TEXTOID, INT4OID, INTERVALOID, INTERVALOID, INTERVALOID, BOOLOID, INT4OID});

// The same on the 0.1.0 schema (no max_running), for its six-argument declarations.
JOBCAP_STATEMENT(
    insert_queue_0_1,
    "INSERT INTO jobcap.queues (queue, max_attempts, lease, backoff_base, backoff_max, notify)"
    " VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (queue) DO NOTHING",
    {TEXTOID, INT4OID, INTERVALOID, INTERVALOID, INTERVALOID, BOOLOID});

// alter_queue checks the merged backoff settings under this row lock, then writes them.
JOBCAP_STATEMENT(lock_queue,
                 "SELECT backoff_base, backoff_max FROM jobcap.queues WHERE queue = $1 FOR UPDATE",
                 {TEXTOID});

// A lower max_attempts binds every job of the queue at once and ends the budgets requeue_job
// granted before it: cap_epoch counts the lowerings (src/spi/cap.hpp).
JOBCAP_STATEMENT(update_queue,
                 "UPDATE jobcap.queues SET max_attempts = coalesce($2, max_attempts),"
                 " cap_epoch = cap_epoch + (coalesce($2, max_attempts) < max_attempts)::int,"
                 " lease = coalesce($3, lease), backoff_base = coalesce($4, backoff_base),"
                 " backoff_max = coalesce($5, backoff_max), notify = coalesce($6, notify),"
                 " max_running = CASE WHEN $7 IS NULL THEN max_running ELSE nullif($7, 0) END"
                 " WHERE queue = $1",
                 {TEXTOID, INT4OID, INTERVALOID, INTERVALOID, INTERVALOID, BOOLOID, INT4OID});

JOBCAP_STATEMENT(update_queue_0_1,
                 "UPDATE jobcap.queues SET max_attempts = coalesce($2, max_attempts),"
                 " lease = coalesce($3, lease), backoff_base = coalesce($4, backoff_base),"
                 " backoff_max = coalesce($5, backoff_max), notify = coalesce($6, notify)"
                 " WHERE queue = $1",
                 {TEXTOID, INT4OID, INTERVALOID, INTERVALOID, INTERVALOID, BOOLOID});

// pause_queue and resume_queue: the flag as it was, under the row lock (a capped queue's claim
// in flight holds it: the change waits for that claim to commit).
JOBCAP_STATEMENT(lock_paused, "SELECT paused FROM jobcap.queues WHERE queue = $1 FOR NO KEY UPDATE",
                 {TEXTOID});

JOBCAP_STATEMENT(set_paused, "UPDATE jobcap.queues SET paused = $2 WHERE queue = $1",
                 {TEXTOID, BOOLOID});

// drop_queue holds this lock to commit: no job of the queue can be written meanwhile, so the
// check for active jobs and the deletes below see every job there will be. EXCLUSIVE (not
// SHARE ROW EXCLUSIVE) so that it also waits for a worker holding assert_fence's row lock:
// that worker already holds a lock on the table, so its complete_job goes ahead of the waiting
// drop instead of deadlocking with it.
JOBCAP_STATEMENT(lock_jobs, "LOCK TABLE jobcap.jobs IN EXCLUSIVE MODE", {});

JOBCAP_STATEMENT(
    queue_activity,
    "SELECT EXISTS (SELECT FROM jobcap.jobs WHERE queue = $1 AND state IN ('pending', 'running'))"
    " FROM jobcap.queues WHERE queue = $1 FOR UPDATE",
    {TEXTOID});

JOBCAP_STATEMENT(delete_queue,
                 "WITH jobs AS (DELETE FROM jobcap.jobs WHERE queue = $1),"
                 " history AS (DELETE FROM jobcap.job_errors WHERE queue = $1)"
                 " DELETE FROM jobcap.queues WHERE queue = $1",
                 {TEXTOID});

core::Span span_of(Datum d)
{
    Interval* iv = DatumGetIntervalP(d);
    core::Span s;
    s.months = iv->month;
    s.days = iv->day;
    s.usec = iv->time;
    return s;
}

// The queue (argument 0) and the six settings shared by create_queue and alter_queue
// (arguments 1..6), each optional: the parameters of insert_queue and update_queue, in order.
// max_running (argument 6) is new in 0.2.0: the 0.1.0 declarations pass six arguments.
// With `required`, every setting but the cap must be given (create_queue's defaults are in its
// signature) and a missing cap is jobcap.default_max_attempts.
Params queue_settings(FunctionCallInfo fcinfo, bool required)
{
    static const char* const kNames[] = {"lease", "backoff_base", "backoff_max", "notify"};
    Params p;
    p.add(arg_queue(fcinfo, 0).datum);
    int32 cap = guc_default_max_attempts;
    bool has_cap = arg_count_opt(fcinfo, 1, "max_attempts", core::kMaxAttempts, &cap);
    p.add(Int32GetDatum(cap), !has_cap && !required);
    for (int a = 2; a <= 5; ++a) {
        bool is_null = PG_ARGISNULL(a);
        Datum d = a == 5 ? (is_null ? (Datum) 0 : PG_GETARG_DATUM(5))
                         : arg_span(fcinfo, a, kNames[a - 2], a != 2, true, &is_null);
        if (is_null && required)
            raise_problem(core::check_not_null(kNames[a - 2], true));
        p.add(d, is_null);
    }
    if (PG_NARGS() < 7)
        return p;  // the 0.1.0 declaration, on the 0.1.0 schema: insert_queue_0_1, update_queue_0_1
    bool uncapped = PG_ARGISNULL(6);
    int32 running = uncapped ? 0 : PG_GETARG_INT32(6);
    if (running < 0 || running > core::kMaxRunning)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("max_running must be between 0 and %d, not %d",
                               static_cast<int>(core::kMaxRunning), running),
                        errhint("0 (or NULL when creating the queue) means no limit.")));
    p.add(Int32GetDatum(running), uncapped);
    return p;
}

// pause_queue and resume_queue: sets the flag; false when it was set already.
bool set_queue_paused(Access& access, NameArg queue, bool paused)
{
    Params p;
    p.add(queue.datum).add(BoolGetDatum(paused));
    Params q;
    q.add(queue.datum);
    spi_open(access);
    if (execute(lock_paused, q, SPI_OK_SELECT) == 0)
        raise_unknown_queue(queue.cstr);
    bool changed = DatumGetBool(result_column(0, 1)) != paused;
    if (changed)
        execute(set_paused, p, SPI_OK_UPDATE);
    spi_close(access);
    return changed;
}

void check_backoff(Datum base, Datum max)
{
    core::Problem p = core::check_backoff_order(span_of(base), span_of(max));
    if (p)
        raise_problem(p);
}

}  // namespace
}  // namespace jobcap

using namespace jobcap;

JOBCAP_FUNCTION(create_queue, Duty::operator_)
{
    NameArg queue = arg_queue(fcinfo, 0);
    Params p = queue_settings(fcinfo, true);
    check_backoff(p.values[3], p.values[4]);

    spi_open(access);
    if (execute(PG_NARGS() < 7 ? insert_queue_0_1 : insert_queue, p, SPI_OK_INSERT) == 0)
        ereport(ERROR, (errcode(ERRCODE_DUPLICATE_OBJECT),
                        errmsg("queue \"%s\" already exists", queue.cstr),
                        errhint("Change its settings with jobcap.alter_queue.")));
    spi_close(access);
    PG_RETURN_VOID();
}

JOBCAP_FUNCTION(alter_queue, Duty::operator_)
{
    NameArg queue = arg_queue(fcinfo, 0);
    Params p = queue_settings(fcinfo, false);
    Params q;
    q.add(queue.datum);

    spi_open(access);
    if (execute(lock_queue, q, SPI_OK_SELECT) == 0)
        raise_unknown_queue(queue.cstr);
    check_backoff(p.nulls[3] == 'n' ? result_column(0, 1) : p.values[3],
                  p.nulls[4] == 'n' ? result_column(0, 2) : p.values[4]);
    execute(PG_NARGS() < 7 ? update_queue_0_1 : update_queue, p, SPI_OK_UPDATE);
    spi_close(access);
    PG_RETURN_VOID();
}

JOBCAP_FUNCTION(drop_queue, Duty::operator_)
{
    NameArg queue = arg_queue(fcinfo, 0);
    bool force = DatumGetBool(arg_required(fcinfo, 1, "force"));
    if (IsolationUsesXactSnapshot())
        ereport(
            ERROR,
            (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
             errmsg("cannot drop a queue in a REPEATABLE READ or SERIALIZABLE transaction"),
             errdetail("Jobs enqueued after this transaction's snapshot would survive the queue."),
             errhint("Run jobcap.drop_queue at READ COMMITTED.")));
    Params p;
    p.add(queue.datum);

    spi_open(access);
    execute(lock_jobs, Params(), SPI_OK_UTILITY);
    if (execute(queue_activity, p, SPI_OK_SELECT) == 0)
        raise_unknown_queue(queue.cstr);
    if (DatumGetBool(result_column(0, 1)) && !force)
        ereport(
            ERROR,
            (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
             errmsg("queue \"%s\" has pending or running jobs", queue.cstr),
             errhint(
                 "Wait for them to finish, cancel them, or drop the queue with force => true.")));
    execute(delete_queue, p, SPI_OK_DELETE);
    spi_close(access);
    PG_RETURN_VOID();
}

// A paused queue hands out nothing (every claim reads the flag in the statement that claims);
// running jobs settle normally and enqueue still works.
JOBCAP_FUNCTION(pause_queue, Duty::operator_)
{
    NameArg queue = arg_queue(fcinfo, 0);
    PG_RETURN_BOOL(set_queue_paused(access, queue, true));
}

JOBCAP_FUNCTION(resume_queue, Duty::operator_)
{
    NameArg queue = arg_queue(fcinfo, 0);
    PG_RETURN_BOOL(set_queue_paused(access, queue, false));
}
