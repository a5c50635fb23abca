// How the reaper runs the steps of a cycle (reap, schedule, count, prune, vacuum, report): each
// batch is a transaction of its own; a batch that fails is rolled back, logged, and its step
// backs off on its own (src/background/steps.cpp). Private to src/background/.
#pragma once

#include "pg.hpp"

namespace jobcap {

// Fixed limits (documented in docs/worker.md).
constexpr int32 kBatchMax = 1000;      // jobs per reap or prune transaction
constexpr int32 kBatchMin = 10;        // ... after shrinking on timeouts
constexpr long kBackoffMaxMs = 60000;  // longest wait after repeated failures

enum class Outcome { done, absent, timed_out, failed };

// A step's batch: returns how many rows it handled (a short batch ends the step).
typedef uint64 (*Step)(int32 batch);

// Each step of a cycle keeps its own batch size and back-off, so one that fails or times out
// (a slow count, a prune behind a lock) delays only itself.
struct StepState {
    int32 batch;            // current batch size
    int failures;           // consecutive failed attempts
    TimestampTz resume_at;  // backing off (vacuuming: or spaced) until then
};

// What the log says of one step, in whole sentences: `failed` when a batch fails (database,
// wait in ms, next batch size; the error itself goes into the detail), `done` at DEBUG1 after
// each batch (rows, database, batch size); `activity` is its pg_stat_activity query text.
struct StepMessages {
    const char* activity;
    const char* failed;
    const char* done;
};

// The database this reaper serves (reaper.cpp), for the log.
const char* reaper_database();

long reap_interval_ms();

// Runs step(batch) in its own transaction with its own statement start time, snapshot and
// statement timeout. Never raises ERROR: a failure is rolled back and returned, with its error
// copied into *error (in the caller's memory context) for the caller to log.
Outcome in_transaction(const char* activity, Step step, int32 batch, uint64* rows,
                       ErrorData** error);

// In a PG_CATCH: the error copied into the caller's memory context, the transaction rolled
// back, and what the error means for the step (a cancel or a lock wait that timed out, or a
// failure).
Outcome rolled_back(MemoryContext caller, uint32 holdoff, ErrorData** error);

// After a step: DROP EXTENSION may commit between the step's check and its statements (or
// while a batch waits for a lock), which then fail on a relation that is gone: that is the
// extension's absence, not a failure to log.
Outcome finished(Outcome outcome, ErrorData** error);

// Whether a wait until `until` still holds at `now`.
bool waiting(TimestampTz now, TimestampTz until);

// After a failed batch of one step: shrink its batch if it timed out, and let it wait longer
// each time in a row, and at least min_wait_ms; the other steps carry on.
void back_off(StepState& step, const char* failed, Outcome outcome, ErrorData* error,
              long min_wait_ms = 0);

}  // namespace jobcap
