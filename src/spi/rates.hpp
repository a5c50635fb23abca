// A rate-limited queue's window as jobcap.queue_rates keeps it (docs/flow_control.md): read by
// the claims, with a fresh snapshot after their claim turn, to charge it, and by the statistics,
// as their snapshot has it, to tell how many due jobs the limit holds back. The rule itself is
// core/flow.hpp's.
#pragma once

#include "pg.hpp"

#include "core/flow.hpp"

namespace jobcap {

// The length of a rate_period in microseconds (a month counts 30 days, a day 24 hours).
int64 rate_period_usec(Datum period);

// A queue's window as the rows of its claim turns keep it (one per turn: -1 for the claims that
// take it exclusive, 0 to 15 for the shared turn's slots), each charged by its own claims only:
// their sum is the window. Read with a fresh snapshot by the claim, which charges its own row.
struct RateRows {
    core::RateWindow* rows;  // palloc'd
    int n, capacity;
    int own;     // the index of the claim's own row (-1 until added)
    bool moved;  // the own row was kept in another slot width: write it even if nothing is claimed
};

// Room for capacity rows, more as they come (a queue has up to 17; one more for the claim's own
// when it has none).
RateRows rate_rows(int capacity);

// Adds a row (slot_us, newest, counts) in slots of slot_us, now: the claim's own when own.
void add_rate_row(RateRows& r, bool own, Datum row_slot_us, Datum newest, Datum counts,
                  int64 slot_us, TimestampTz now);
// The same with the row's columns read (counts: its 17 slots).
void add_rate_row(RateRows& r, bool own, int64 row_slot_us, int64 newest,
                  const int32 counts[core::kRateRing], int64 slot_us, TimestampTz now);

// Once every row is added: adds an empty own row if there was none, aligns them (core::rate_align)
// and returns how many more claims they admit under limit.
int32 rate_rows_room(RateRows& r, int64 slot_us, TimestampTz now, int32 limit);

// Inside an SPI connection. The SQL path's claim: queue's rows read with a fresh snapshot,
// the exclusive turn's (slot -1) its own; returns the room they leave under limit. An own row
// kept in another slot width (rate_period changed) is marked moved: its claims, now counted as
// made in this width's newest slot, must be written so even when the claim takes nothing (or
// they would stay counted for as long as the old width's slot).
int32 read_rate_window(Datum queue, int64 slot_us, TimestampTz now, int32 limit, RateRows* window);

// Inside an SPI connection: writes window's own row, that of slot (-1: the exclusive turn's),
// charged with n claims (fresh: in the latest snapshot, the one read_rate_window read it in).
void charge_rate_window(RateRows& window, Datum queue, int slot, uint64 n, bool fresh = false);

// Inside an SPI connection, under the queue's exclusive claim turn, after its rate_period
// changed to one of slot_us slots: folds the window's rows into the exclusive turn's, every
// claim counted as made at the end of its row's newest slot (core::rate_advance), and deletes
// the others. Unfolded, a slot's row that no claim writes again would count its claims for as
// long as a slot of the old period (a sixteenth of an hour, after '1 hour').
void fold_rate_window(Datum queue, int64 slot_us, TimestampTz now);

}  // namespace jobcap
