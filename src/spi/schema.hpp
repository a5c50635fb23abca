// What the installed schema has, for the code that serves a database still at jobcap 0.1.0.
//
// compat(0.1.0): between installing this library and ALTER EXTENSION jobcap UPDATE, a database
// keeps the 0.1.0 schema: no queue controls, job output, cap_epoch, schedules or history kind
// claim_rolled_back. The statements that need any of them then run their 0.1.0 variants (the
// _0_1 statements, with 0.1.0's semantics), chosen by these probes; the SQL functions of the
// 0.1.0 declarations, which pass fewer arguments, are told apart by PG_NARGS(). Every such site
// carries the tag compat(0.1.0); UPDATING.md says which release retires them.
#pragma once

#include "pg.hpp"

namespace jobcap {

// Whether jobcap.queues.paused exists, i.e. whether ALTER EXTENSION jobcap UPDATE to 0.2.0 has
// run: the update script adds every 0.2.0 column, constraint and table in one transaction, so
// one of them stands for all. Two syscache look-ups, no state kept.
bool queues_paused_column_exists();

// Whether jobcap.job_schedules exists (0.2.0's periodic jobs).
bool job_schedules_table_exists();

// compat(0.2.0): between installing this library and ALTER EXTENSION jobcap UPDATE to 0.3.0, a
// database keeps the 0.2.0 schema: no workflows (no job_state 'waiting', no
// jobcap.job_dependencies, no per-job deadlines, snoozes or run-time limits, no history kinds
// snoozed, timed_out and cancelled). The statements that need them run only where this probe
// says the schema has them; elsewhere their _0_2 variants, with 0.2.0's semantics, serve the call.
// Every such site carries the tag compat(0.2.0). Whether jobcap.job_dependencies exists: the
// update adds every 0.3.0 workflow object in one transaction, so one stands for all. Two syscache
// look-ups, no state kept.
bool workflows_schema_exists();

// compat(0.2.0): whether jobcap.queue_rates exists, i.e. the 0.3.0 flow control (queues'
// rate_limit and rate_period): the same update adds them all. Claims of the 0.2.0 schema read no
// rate limit.
bool flow_schema_exists();

}  // namespace jobcap
