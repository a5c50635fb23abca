#include "housekeeping/rates.hpp"

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

core::RateWindow rate_window(bool no_row, Datum row_slot_us, Datum newest, Datum counts,
                             int64 slot_us, TimestampTz now, bool* moved)
{
    core::RateWindow w = core::rate_empty(slot_us, now);
    *moved = false;
    if (!no_row) {
        w.slot_us = DatumGetInt64(row_slot_us);
        w.newest = DatumGetInt64(newest);
        Datum* values = nullptr;
        bool* nulls = nullptr;
        int n = 0;
        deconstruct_array(DatumGetArrayTypeP(counts), INT4OID, 4, true, TYPALIGN_INT, &values,
                          &nulls, &n);
        // A row changed by hand into another shape counts what it can.
        for (int s = 0; s < n && s < core::kRateRing; ++s)
            w.counts[s] = nulls[s] ? 0 : DatumGetInt32(values[s]);
        if (w.slot_us < 1)
            w = core::rate_empty(slot_us, now);
        *moved = w.slot_us != slot_us;
    }
    core::rate_advance(w, slot_us, now);
    return w;
}

}  // namespace jobcap
