// Periodic jobs: the step the background worker runs every cycle, and jobcap.run_schedules()
// with it (run_due_schedules).
//
// A schedule's slots are the minutes its cron expression names (UTC, src/core/cron.hpp). Its
// row keeps last_slot, the latest slot handled; the slot due now is the latest one in
// (last_slot, now]. Slots missed while nothing ran are not made up: only the latest is
// enqueued. Enqueueing a slot is one statement that advances last_slot from the value read to
// the slot (a compare-and-swap: a second caller, or a worker after a restart that read the old
// value, matches no row) and inserts the job with the schedule's dedupe key; it commits with
// the transaction, or neither does.
#include "housekeeping/schedules.hpp"

#include "spi/plans.hpp"
#include "spi/queue_lock.hpp"
#include "spi/schema.hpp"

#include "core/cron.hpp"

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

constexpr int64 kUsecPerMinute = INT64CONST(60000000);
// Minutes from 1970-01-01 (the core's epoch) to PostgreSQL's, 2000-01-01.
constexpr int64 kUnixToPostgresMinutes =
    (int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * MINS_PER_HOUR * HOURS_PER_DAY;

}  // namespace

int64 cron_minute_of(TimestampTz t)
{
    int64 m = t / kUsecPerMinute;
    if (t % kUsecPerMinute < 0)
        --m;
    return m + kUnixToPostgresMinutes;
}

// Computed from the minute, not the microseconds since 1970, which overflow int64 after the
// year 294247 (PostgreSQL's timestamps go on to 294276).
TimestampTz time_of_cron_minute(int64 minute)
{
    return (minute - kUnixToPostgresMinutes) * kUsecPerMinute;
}

int64 last_cron_minute()
{
    return cron_minute_of(END_TIMESTAMP - 1);
}

uint64 run_due_schedules(TimestampTz now, int32 max_schedules, uint64* handled)
{
    *handled = 0;
    // compat(0.1.0): the 0.1.0 schema has no schedules.
    if (!job_schedules_table_exists())
        return 0;
    uint64 rows = execute(schedules_due, Params(), SPI_OK_SELECT);
    SPITupleTable* all = SPI_tuptable;
    int64 upto = cron_minute_of(now);
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
        if (!core::cron_latest(spec, cron_minute_of(DatumGetTimestampTz(last)), upto, &slot))
            continue;
        // Like every insert of jobs, under the queue lock, so drop_queue cannot miss the job.
        lock_queue_for_insert(SPI_getbinval(row, all->tupdesc, 4, &null));
        Params p;
        p.add(name)
            .add(last)
            .add(TimestampTzGetDatum(time_of_cron_minute(slot)))
            .add(TimestampTzGetDatum(now));
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
