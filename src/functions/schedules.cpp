// Periodic jobs: schedule_job, unschedule_job, run_schedules, cron_next, and the step the
// background worker runs every cycle (run_due_schedules).
//
// A schedule's slots are the minutes its cron expression names (UTC, src/core/cron.hpp). Its
// row keeps last_slot, the latest slot handled; the slot due now is the latest one in
// (last_slot, now]. Slots missed while nothing ran are not made up: only the latest is
// enqueued. Enqueueing a slot is one statement that advances last_slot from the value read to
// the slot (a compare-and-swap: a second caller, or a worker after a restart that read the old
// value, matches no row) and inserts the job with the schedule's dedupe key; it commits with
// the transaction, or neither does.
#include "functions/schedules.hpp"

#include "spi/access.hpp"
#include "spi/args.hpp"
#include "boundary.hpp"
#include "spi/errors.hpp"
#include "spi/plans.hpp"
#include "spi/queue_lock.hpp"

#include "core/cron.hpp"

extern "C" {
#include "catalog/namespace.h"
#include "utils/lsyscache.h"
}

namespace jobcap {
namespace {

// The schedules, read without locks: which are due is decided in C, and the compare-and-swap
// below settles races.
JOBCAP_STATEMENT(
    schedules_due,
    "SELECT s.name, s.cron, s.last_slot, s.queue FROM jobcap.job_schedules s ORDER BY s.name", {});

// $1 = name, $2 = last_slot as read, $3 = the slot, $4 = now. Column 1: whether this call
// won the slot; column 2: the job it enqueued (NULL: a job of the schedule holds the key);
// column 3: whether the queue wants a notification.
JOBCAP_STATEMENT(
    schedule_enqueue,
    "WITH s AS (UPDATE jobcap.job_schedules s SET last_slot = $3"
    "   WHERE s.name = $1 AND s.last_slot = $2"
    "   RETURNING s.name, s.queue, s.payload, s.priority, s.max_attempts),"
    " ins AS (INSERT INTO jobcap.jobs"
    "     (queue, payload, run_at, priority, max_attempts, dedupe_key, enqueued_at)"
    "   SELECT s.queue, s.payload, $3, s.priority, s.max_attempts, 'jobcap.schedule:' || s.name, $4"
    "     FROM s"
    "   ON CONFLICT (queue, dedupe_key)"
    "     WHERE dedupe_key IS NOT NULL AND state IN ('pending', 'running', 'dead')"
    "   DO NOTHING RETURNING job_id)"
    " SELECT EXISTS (SELECT FROM s), (SELECT job_id FROM ins),"
    "   coalesce((SELECT q.notify FROM jobcap.queues q, s WHERE q.queue = s.queue), false)",
    {TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID});

// The row the compare-and-swap locked: what the slot did.
JOBCAP_STATEMENT(schedule_record,
                 "UPDATE jobcap.job_schedules SET last_run_at = $2,"
                 "   last_job_id = coalesce($3, last_job_id),"
                 "   skipped = skipped + CASE WHEN $3 IS NULL THEN 1 ELSE 0 END"
                 " WHERE name = $1 RETURNING queue",
                 {TEXTOID, TIMESTAMPTZOID, INT8OID});

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

constexpr int64 kUsecPerMinute = INT64CONST(60000000);
// Minutes from 1970-01-01 (the core's epoch) to PostgreSQL's, 2000-01-01.
constexpr int64 kUnixToPostgresMinutes =
    (int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * MINS_PER_HOUR * HOURS_PER_DAY;

// The minute (since 1970) that holds t; t is finite.
constexpr int64 minute_of(TimestampTz t)
{
    int64 m = t / kUsecPerMinute;
    if (t % kUsecPerMinute < 0)
        --m;
    return m + kUnixToPostgresMinutes;
}

// The start of a minute no later than the last representable timestamp (kLastMinute).
TimestampTz time_of(int64 minute)
{
    return (minute - kUnixToPostgresMinutes) * kUsecPerMinute;
}

// The last minute that starts within PostgreSQL's timestamp range: no slot lies after it.
constexpr int64 kLastMinute = minute_of(END_TIMESTAMP - 1);

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
    int64 from = TIMESTAMP_IS_NOBEGIN(after) ? minute_of(MIN_TIMESTAMP) - 1 : minute_of(after);
    int64 slot = 0;
    if (!core::cron_next(spec, from, kLastMinute, &slot))
        return false;
    *next = time_of(slot);
    return true;
}

bool schema_has_schedules()
{
    Oid schema = get_namespace_oid("jobcap", true);
    return OidIsValid(schema) && OidIsValid(get_relname_relid("job_schedules", schema));
}

}  // namespace

uint64 run_due_schedules(TimestampTz now, int32 max_schedules, uint64* handled)
{
    *handled = 0;
    if (!schema_has_schedules())
        return 0;
    uint64 rows = execute(schedules_due, Params(), SPI_OK_SELECT);
    SPITupleTable* all = SPI_tuptable;
    int64 upto = minute_of(now);
    uint64 enqueued = 0;
    for (uint64 r = 0; r < rows && *handled < (uint64) max_schedules; ++r) {
        bool null = false;
        HeapTuple row = all->vals[r];
        Datum name = SPI_getbinval(row, all->tupdesc, 1, &null);
        text* cron = DatumGetTextPP(SPI_getbinval(row, all->tupdesc, 2, &null));
        Datum last = SPI_getbinval(row, all->tupdesc, 3, &null);
        core::CronSpec spec;
        if (core::parse_cron(VARDATA_ANY(cron), VARSIZE_ANY_EXHDR(cron), &spec))
            continue;  // written by hand: schedule_job never stores a bad expression
        int64 slot = 0;
        if (!core::cron_latest(spec, minute_of(DatumGetTimestampTz(last)), upto, &slot))
            continue;
        // Like every insert of jobs, under the queue lock, so drop_queue cannot miss the job.
        lock_queue_for_insert(SPI_getbinval(row, all->tupdesc, 4, &null));
        Params p;
        p.add(name).add(last).add(TimestampTzGetDatum(time_of(slot))).add(TimestampTzGetDatum(now));
        execute(schedule_enqueue, p, SPI_OK_SELECT);
        if (!DatumGetBool(result_column(0, 1)))
            continue;  // another caller handled it first
        bool skipped = false;
        Datum job = result_column(0, 2, &skipped);
        bool notify = DatumGetBool(result_column(0, 3));
        Params record;
        record.add(name).add(TimestampTzGetDatum(now)).add(job, skipped);
        execute(schedule_record, record, SPI_OK_UPDATE_RETURNING);
        if (!skipped) {
            ++enqueued;
            if (notify)
                Async_Notify("jobcap", TextDatumGetCString(result_column(0, 1)));
        }
        ++*handled;
    }
    return enqueued;
}

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
