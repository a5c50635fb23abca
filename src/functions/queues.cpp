// create_queue, alter_queue, drop_queue.
#include "spi/access.hpp"
#include "spi/args.hpp"
#include "boundary.hpp"
#include "spi/errors.hpp"
#include "jobcap.hpp"
#include "spi/plans.hpp"
#include "spi/queue_lock.hpp"

namespace jobcap {
namespace {

Statement insert_queue = {
    "INSERT INTO jobcap.queues (queue, max_attempts, lease, backoff_base, backoff_max, notify)"
    " VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (queue) DO NOTHING",
    6,
    {TEXTOID, INT4OID, INTERVALOID, INTERVALOID, INTERVALOID, BOOLOID},
    nullptr};

// alter_queue checks the merged backoff settings under this row lock, then writes them.
Statement lock_queue = {
    "SELECT backoff_base, backoff_max FROM jobcap.queues WHERE queue = $1 FOR UPDATE",
    1,
    {TEXTOID},
    nullptr};

Statement update_queue = {
    "UPDATE jobcap.queues SET max_attempts = coalesce($2, max_attempts),"
    " lease = coalesce($3, lease), backoff_base = coalesce($4, backoff_base),"
    " backoff_max = coalesce($5, backoff_max), notify = coalesce($6, notify)"
    " WHERE queue = $1",
    6,
    {TEXTOID, INT4OID, INTERVALOID, INTERVALOID, INTERVALOID, BOOLOID},
    nullptr};

// drop_queue locks only what belongs to the queue, in this order, each to commit: the queue row
// (an alter_queue or another drop of it waits), every job of the queue (settles, claims and
// requeues of those jobs wait or skip them; a worker holding assert_fence's lock on one is
// waited for here, before the queue lock, so its own enqueue into the queue cannot deadlock
// with the drop), then the queue lock (queue_lock.hpp: waits for transactions that inserted
// jobs into it; later inserts wait for the drop and then find no queue), then the jobs again,
// with a snapshot taken after the queue lock: those inserted in between. After that no job of
// the queue can appear or change, so the check and the deletes see every job there will be.
// Claims, enqueues and settles on other queues never wait for a drop.
Statement lock_queue_row = {
    "SELECT FROM jobcap.queues WHERE queue = $1 FOR UPDATE", 1, {TEXTOID}, nullptr};

Statement lock_queue_jobs = {
    "SELECT count(*) FILTER (WHERE state IN ('pending', 'running')) > 0"
    "  FROM (SELECT state FROM jobcap.jobs WHERE queue = $1 FOR UPDATE) j",
    1,
    {TEXTOID},
    nullptr};

Statement delete_queue = {
    "WITH jobs AS (DELETE FROM jobcap.jobs WHERE queue = $1),"
    " history AS (DELETE FROM jobcap.job_errors WHERE queue = $1)"
    " DELETE FROM jobcap.queues WHERE queue = $1",
    1,
    {TEXTOID},
    nullptr};

core::Span span_of(Datum d)
{
    Interval* iv = DatumGetIntervalP(d);
    core::Span s;
    s.months = iv->month;
    s.days = iv->day;
    s.usec = iv->time;
    return s;
}

// Reads the five settings shared by create_queue and alter_queue (arguments 1..5), each
// optional; nulls[] says which were given.
void queue_settings(FunctionCallInfo fcinfo, Datum* values, char* nulls)
{
    int32 cap = 0;
    bool is_null = false;
    if (arg_count_opt(fcinfo, 1, "max_attempts", core::kMaxAttempts, &cap)) {
        values[1] = Int32GetDatum(cap);
        nulls[1] = ' ';
    } else {
        nulls[1] = 'n';
    }
    values[2] = arg_span(fcinfo, 2, "lease", false, true, &is_null);
    nulls[2] = is_null ? 'n' : ' ';
    values[3] = arg_span(fcinfo, 3, "backoff_base", true, true, &is_null);
    nulls[3] = is_null ? 'n' : ' ';
    values[4] = arg_span(fcinfo, 4, "backoff_max", true, true, &is_null);
    nulls[4] = is_null ? 'n' : ' ';
    values[5] = PG_ARGISNULL(5) ? (Datum) 0 : PG_GETARG_DATUM(5);
    nulls[5] = PG_ARGISNULL(5) ? 'n' : ' ';
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
    Datum values[6];
    char nulls[7] = "      ";
    values[0] = queue.datum;
    queue_settings(fcinfo, values, nulls);
    // Every setting but the cap is required here: their defaults are in the signature.
    static const char* const names[] = {nullptr,        nullptr,       "lease",
                                        "backoff_base", "backoff_max", "notify"};
    for (int i = 2; i <= 5; ++i)
        if (nulls[i] == 'n')
            raise_problem(core::check_not_null(names[i], true));
    if (nulls[1] == 'n') {
        values[1] = Int32GetDatum(guc_default_max_attempts);
        nulls[1] = ' ';
    }
    check_backoff(values[3], values[4]);

    spi_open(access);
    if (execute(insert_queue, values, nulls, SPI_OK_INSERT) == 0)
        ereport(ERROR, (errcode(ERRCODE_DUPLICATE_OBJECT),
                        errmsg("queue \"%s\" already exists", queue.cstr),
                        errhint("Change its settings with jobcap.alter_queue.")));
    spi_close(access);
    PG_RETURN_VOID();
}

JOBCAP_FUNCTION(alter_queue, Duty::operator_)
{
    NameArg queue = arg_queue(fcinfo, 0);
    Datum values[6];
    char nulls[7] = "      ";
    values[0] = queue.datum;
    queue_settings(fcinfo, values, nulls);

    spi_open(access);
    if (execute(lock_queue, values, nullptr, SPI_OK_SELECT) == 0)
        raise_unknown_queue(queue.cstr);
    check_backoff(nulls[3] == 'n' ? result_column(0, 1) : values[3],
                  nulls[4] == 'n' ? result_column(0, 2) : values[4]);
    execute(update_queue, values, nulls, SPI_OK_UPDATE);
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
    Datum values[1] = {queue.datum};

    spi_open(access);
    if (execute(lock_queue_row, values, nullptr, SPI_OK_SELECT) == 0)
        raise_unknown_queue(queue.cstr);
    execute(lock_queue_jobs, values, nullptr, SPI_OK_SELECT);
    lock_queue_for_drop(queue.datum);
    execute(lock_queue_jobs, values, nullptr, SPI_OK_SELECT);
    if (DatumGetBool(result_column(0, 1)) && !force)
        ereport(
            ERROR,
            (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
             errmsg("queue \"%s\" has pending or running jobs", queue.cstr),
             errhint(
                 "Wait for them to finish, cancel them, or drop the queue with force => true.")));
    execute(delete_queue, values, nullptr, SPI_OK_DELETE);
    spi_close(access);
    PG_RETURN_VOID();
}
