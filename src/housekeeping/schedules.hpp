// Periodic jobs, shared by jobcap.run_schedules() and the background worker
// (src/housekeeping/schedules.cpp says how a slot is enqueued once).
#pragma once

#include "pg.hpp"

namespace jobcap {

// Enqueues the due slot of up to max_schedules schedules, inside an open SPI connection, as of
// now; each slot once (a compare-and-swap on the schedule's last_slot in this transaction).
// Sets *handled to the schedules whose slot it handled (enqueued or skipped by the dedupe key)
// and returns how many jobs it enqueued. Does nothing before the 0.2.0 schema is installed.
uint64 run_due_schedules(TimestampTz now, int32 max_schedules, uint64* handled);

// A finite time as the minutes core/cron.hpp counts (since 1970-01-01 UTC, rounded down), and
// back (for a minute up to last_cron_minute()).
int64 cron_minute_of(TimestampTz t);
TimestampTz time_of_cron_minute(int64 minute);

// The last minute that starts within PostgreSQL's timestamp range: no slot lies after it.
int64 last_cron_minute();

}  // namespace jobcap
