#include "spi/rates.hpp"

#include "spi/plans.hpp"

extern "C" {
#include "utils/array.h"
#include "utils/timestamp.h"
}

namespace jobcap {

int64 rate_period_usec(Datum period)
{
    const Interval* i = DatumGetIntervalP(period);
    return (int64) i->month * 30 * USECS_PER_DAY + (int64) i->day * USECS_PER_DAY + i->time;
}

RateRows rate_rows(int capacity)
{
    RateRows r = {};
    r.capacity = Max(capacity, 0) + 1;
    r.rows = static_cast<core::RateWindow*>(palloc(sizeof(core::RateWindow) * r.capacity));
    r.own = -1;
    return r;
}

void add_rate_row(RateRows& r, bool own, int64 row_slot_us, int64 newest,
                  const int32 counts[core::kRateRing], int64 slot_us, TimestampTz now)
{
    if (r.n >= r.capacity - 1) {  // more rows than expected (one added by hand): room for them
        r.capacity *= 2;
        r.rows =
            static_cast<core::RateWindow*>(repalloc(r.rows, sizeof(core::RateWindow) * r.capacity));
    }
    core::RateWindow w = core::rate_empty(slot_us, now);
    // A row changed by hand into another shape counts what it can.
    if (row_slot_us >= 1) {
        w.slot_us = row_slot_us;
        w.newest = newest;
        memcpy(w.counts, counts, sizeof w.counts);
    }
    if (own) {
        r.own = r.n;
        r.moved = w.slot_us != slot_us;
    }
    core::rate_advance(w, slot_us, now);
    r.rows[r.n++] = w;
}

void add_rate_row(RateRows& r, bool own, Datum row_slot_us, Datum newest, Datum counts,
                  int64 slot_us, TimestampTz now)
{
    Datum* values = nullptr;
    bool* nulls = nullptr;
    int n = 0;
    deconstruct_array(DatumGetArrayTypeP(counts), INT4OID, 4, true, TYPALIGN_INT, &values, &nulls,
                      &n);
    int32 row[core::kRateRing] = {};
    for (int s = 0; s < n && s < core::kRateRing; ++s)
        row[s] = nulls[s] ? 0 : DatumGetInt32(values[s]);
    add_rate_row(r, own, DatumGetInt64(row_slot_us), DatumGetInt64(newest), row, slot_us, now);
}

int32 rate_rows_room(RateRows& r, int64 slot_us, TimestampTz now, int32 limit)
{
    if (r.own < 0) {
        r.own = r.n;
        r.rows[r.n++] = core::rate_empty(slot_us, now);
    }
    core::rate_align(r.rows, r.n, slot_us, now);
    return core::rate_room(r.rows, r.n, limit);
}

namespace statements {

// A rate-limited queue's window: its rows, read with a fresh snapshot after the claim's turn
// (the charges of every claim that went before have committed), and the claim's own row charged.
JOBCAP_STATEMENT(read_rate,
                 "SELECT r.slot = -1, r.slot_us, r.newest, r.counts FROM jobcap.queue_rates r"
                 " WHERE r.queue = $1",
                 {TEXTOID});
JOBCAP_STATEMENT(
    charge_rate,
    "INSERT INTO jobcap.queue_rates AS r (queue, slot, slot_us, newest, counts)"
    " VALUES ($1, $2, $3, $4, $5) ON CONFLICT (queue, slot) DO UPDATE"
    " SET slot_us = excluded.slot_us, newest = excluded.newest, counts = excluded.counts",
    {TEXTOID, INT4OID, INT8OID, INT8OID, INT4ARRAYOID});

JOBCAP_STATEMENT(delete_slot_rates,
                 "DELETE FROM jobcap.queue_rates WHERE queue = $1 AND slot <> -1", {TEXTOID});

}  // namespace statements

int32 read_rate_window(Datum queue, int64 slot_us, TimestampTz now, int32 limit, RateRows* window)
{
    Params p;
    p.add(queue);
    uint64 n = execute_fresh(statements::read_rate, p, SPI_OK_SELECT);
    *window = rate_rows(static_cast<int>(n));
    for (uint64 i = 0; i < n; ++i)
        add_rate_row(*window, DatumGetBool(result_column(i, 1)), result_column(i, 2),
                     result_column(i, 3), result_column(i, 4), slot_us, now);
    return rate_rows_room(*window, slot_us, now, limit);
}

void charge_rate_window(RateRows& window, Datum queue, int slot, uint64 n, bool fresh)
{
    core::RateWindow& own = window.rows[window.own];
    core::rate_charge(own, static_cast<int32>(n));
    Datum counts[core::kRateRing];
    for (int s = 0; s < core::kRateRing; ++s)
        counts[s] = Int32GetDatum(own.counts[s]);
    Params p;
    p.add(queue).add(Int32GetDatum(slot)).add(Int64GetDatum(own.slot_us));
    p.add(Int64GetDatum(own.newest));
    p.add(
        PointerGetDatum(construct_array(counts, core::kRateRing, INT4OID, 4, true, TYPALIGN_INT)));
    if (fresh)
        execute_fresh(statements::charge_rate, p, SPI_OK_INSERT);
    else
        execute(statements::charge_rate, p, SPI_OK_INSERT);
}

void fold_rate_window(Datum queue, int64 slot_us, TimestampTz now)
{
    RateRows w;
    read_rate_window(queue, slot_us, now, 0, &w);
    core::RateWindow& own = w.rows[w.own];
    bool counted = false;
    for (int i = 0; i < w.n; ++i) {
        counted = counted || core::rate_counted(w.rows[i]) > 0;
        if (i == w.own)
            continue;
        for (int s = 0; s < core::kRateRing; ++s)
            own.counts[s] = static_cast<int32>(
                Min(static_cast<int64>(own.counts[s]) + w.rows[i].counts[s], core::kMaxRateLimit));
    }
    // Written and deleted in the snapshot the rows were read in: at REPEATABLE READ the
    // transaction's would leave rows charged after it (counted twice then) or fail to update.
    if (counted || w.n > 1)
        charge_rate_window(w, queue, -1, 0, true);
    Params p;
    p.add(queue);
    execute_fresh(statements::delete_slot_rates, p, SPI_OK_DELETE);
}

}  // namespace jobcap
