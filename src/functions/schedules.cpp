// Periodic jobs: schedule_job, unschedule_job, run_schedules and cron_next. The slots are
// enqueued by run_due_schedules (housekeeping/schedules.hpp), which the background worker runs
// every cycle and run_schedules runs on demand.
#include "boundary.hpp"
#include "housekeeping/schedules.hpp"
#include "spi/access.hpp"
#include "spi/args.hpp"
#include "spi/errors.hpp"
#include "spi/plans.hpp"

#include "core/cron.hpp"

namespace jobcap {
namespace {

// Created with last_slot = the current minute, so its first slot is the next one. Replacing a
// schedule keeps its last_slot (and its history): a slot it handled is not handled again.
JOBCAP_STATEMENT(
    upsert_schedule,
    "INSERT INTO jobcap.job_schedules AS s (name, cron, queue, payload, priority, max_attempts,"
    "   last_slot)"
    " SELECT $1, $2, q.queue, $4, $5, $6, date_trunc('minute', $7, 'UTC')"
    "   FROM jobcap.queues q WHERE q.queue = $3"
    " ON CONFLICT (name) DO UPDATE SET cron = excluded.cron, queue = excluded.queue,"
    "   payload = excluded.payload, priority = excluded.priority,"
    "   max_attempts = excluded.max_attempts"
    " RETURNING s.last_slot",
    {TEXTOID, TEXTOID, TEXTOID, JSONBOID, INT4OID, INT4OID, TIMESTAMPTZOID});

JOBCAP_STATEMENT(delete_schedule, "DELETE FROM jobcap.job_schedules WHERE name = $1", {TEXTOID});

core::CronSpec parse_or_raise(text* cron)
{
    core::CronSpec spec;
    core::Problem p = core::parse_cron(VARDATA_ANY(cron), VARSIZE_ANY_EXHDR(cron), &spec);
    if (p)
        raise_problem(p);
    return spec;
}

// The first slot after `after`; false when none comes before the end of PostgreSQL's timestamp
// range (then SQL gets NULL: there is no next run), or after is 'infinity'. '-infinity' counts
// from the first representable minute.
bool next_after(const core::CronSpec& spec, TimestampTz after, TimestampTz* next)
{
    if (TIMESTAMP_IS_NOEND(after))
        return false;
    int64 from =
        TIMESTAMP_IS_NOBEGIN(after) ? cron_minute_of(MIN_TIMESTAMP) - 1 : cron_minute_of(after);
    int64 slot = 0;
    if (!core::cron_next(spec, from, last_cron_minute(), &slot))
        return false;
    *next = time_of_cron_minute(slot);
    return true;
}

}  // namespace
}  // namespace jobcap

using namespace jobcap;

JOBCAP_FUNCTION(cron_next, Duty::anyone)
{
    core::CronSpec spec = parse_or_raise(PG_GETARG_TEXT_PP(0));
    TimestampTz next = 0;
    if (!next_after(spec, PG_GETARG_TIMESTAMPTZ(1), &next))
        PG_RETURN_NULL();
    PG_RETURN_TIMESTAMPTZ(next);
}

JOBCAP_FUNCTION(schedule_job, Duty::operator_)
{
    NameArg name = arg_schedule(fcinfo, 0);
    text* cron = DatumGetTextPP(arg_required(fcinfo, 1, "cron"));
    core::CronSpec spec = parse_or_raise(cron);
    NameArg queue = arg_queue(fcinfo, 2);
    Params p;
    p.add(name.datum).add(PointerGetDatum(cron)).add(queue.datum).add(arg_payload(fcinfo, 3));
    p.add(arg_required(fcinfo, 4, "priority"));
    int32 cap = 0;
    bool has_cap = arg_count_opt(fcinfo, 5, "max_attempts", core::kMaxAttempts, &cap);
    p.add(Int32GetDatum(cap), !has_cap);
    p.add(TimestampTzGetDatum(GetCurrentTransactionStartTimestamp()));

    spi_open(access);
    if (execute(upsert_schedule, p, SPI_OK_INSERT_RETURNING) == 0)
        raise_unknown_queue(queue.cstr);
    TimestampTz last = DatumGetTimestampTz(result_column(0, 1));
    spi_close(access);
    TimestampTz next = 0;
    if (!next_after(spec, last, &next))
        PG_RETURN_NULL();
    PG_RETURN_TIMESTAMPTZ(next);
}

JOBCAP_FUNCTION(unschedule_job, Duty::operator_)
{
    NameArg name = arg_schedule(fcinfo, 0);
    Params p;
    p.add(name.datum);
    spi_open(access);
    uint64 rows = execute(delete_schedule, p, SPI_OK_DELETE);
    spi_close(access);
    PG_RETURN_BOOL(rows > 0);
}

// Without the preload nothing enqueues scheduled jobs: schedule this call once a minute
// (pg_cron: SELECT cron.schedule('jobcap-schedules', '* * * * *', 'SELECT jobcap.run_schedules()')).
// Slots are due as of now(), the transaction's start, as for every other SQL statement.
JOBCAP_FUNCTION(run_schedules, Duty::operator_)
{
    spi_open(access);
    uint64 handled = 0;
    uint64 enqueued = run_due_schedules(GetCurrentTransactionStartTimestamp(), INT32_MAX, &handled);
    spi_close(access);
    PG_RETURN_INT32((int32) enqueued);
}
