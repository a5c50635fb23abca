// create_queue, alter_queue, drop_queue.
#include "spi/access.hpp"
#include "spi/args.hpp"
#include "boundary.hpp"
#include "spi/errors.hpp"
#include "jobcap.hpp"
#include "spi/plans.hpp"

namespace jobcap {
namespace {

JOBCAP_STATEMENT(
    insert_queue,
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
                 " backoff_max = coalesce($5, backoff_max), notify = coalesce($6, notify)"
                 " WHERE queue = $1",
                 {TEXTOID, INT4OID, INTERVALOID, INTERVALOID, INTERVALOID, BOOLOID});

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

// The queue (argument 0) and the five settings shared by create_queue and alter_queue
// (arguments 1..5), each optional: the parameters of insert_queue and update_queue, in order.
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
    return p;
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
    if (execute(insert_queue, p, SPI_OK_INSERT) == 0)
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
    execute(update_queue, p, SPI_OK_UPDATE);
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
