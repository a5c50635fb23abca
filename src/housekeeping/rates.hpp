// A rate-limited queue's window as jobcap.queue_rates keeps it (docs/flow_control.md): read by
// the claim, under the queue's row lock, to charge it, and by the statistics, as their snapshot
// has it, to tell how many due jobs the limit holds back. The rule itself is core/flow.hpp's.
#pragma once

#include "pg.hpp"

#include "core/flow.hpp"

namespace jobcap {

// The length of a rate_period in microseconds (a month counts 30 days, a day 24 hours).
int64 rate_period_usec(Datum period);

// The window in a queue_rates row (slot_us, newest, counts; no_row: the queue has none yet, an
// empty window), moved to now in slots of slot_us. *moved: it was kept in another slot width.
core::RateWindow rate_window(bool no_row, Datum row_slot_us, Datum newest, Datum counts,
                             int64 slot_us, TimestampTz now, bool* moved);

}  // namespace jobcap
