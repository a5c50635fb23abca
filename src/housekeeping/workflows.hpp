// Workflows (docs/workflows.md), shared by the SQL functions and the background worker: what
// happens to the jobs that depend on a job when it settles, and the deadlines the worker
// enforces (a running job's max_run_time, an unclaimed job's start_by). Each runs inside an open
// SPI connection, in statements of its own, after the statement that settled the job: at READ
// COMMITTED each takes a new snapshot, so it sees every job enqueued as a dependent before the
// settle locked the job it depends on (an enqueue locks that row too: they take turns). Plain
// data only.
#pragma once

#include "pg.hpp"

namespace jobcap {

// The channel of the notifications that tell a worker its attempt ended under it: the payload is
// {"job_id": n, "fence": n, "reason": "cancelled" | "timed_out"}. Sent at commit.
constexpr const char* kAttemptEndedChannel = "jobcap_cancel";
void notify_attempt_ended(int64 job_id, int64 fence, const char* reason);

struct Access;

// What an enqueue (or a requeue) that depends on the jobs ids[0..n) (sorted, distinct) finds,
// after locking them in job_id order and marking them as depended on (has_dependents): the first
// that does not exist, the first of a queue the caller may not work, how many have not succeeded,
// and the first that is dead or cancelled (0 for none). The lock is the one a completion or a
// death of those jobs takes: the two take turns, and each sees the other's outcome.
struct DependedOn {
    int64 missing;
    int64 denied;
    int waiting;
    int64 cause;
    bool cause_dead;
};
DependedOn lock_depended_on(const Access& access, const int64* ids, int n);

// The jobs ids[0..n) have just succeeded in this transaction (each once: a completion is fenced).
// Each waiting job that depends on some of them counts them off (waiting_on), once per edge: the
// children's rows are locked in job_id order and the count is taken from the latest version, so
// parents that succeed at the same instant on different connections take turns and the last one
// releases the child. A child whose count reaches 0 becomes pending (its payload given its
// parents' outputs, when it asked for them), and its queue's listeners are woken at commit.
void release_dependents(const int64* ids, int n, TimestampTz now);

// Merges into the payloads of the jobs ids[0..n) (pending, every job they depend on succeeded)
// the outputs of those jobs that pass theirs: {"parent_outputs": {"<id>": output, ...}}.
void pass_parent_outputs(const int64* ids, int n);

// The jobs ids[0..n) have just ended dead or cancelled in this transaction, or were deleted (ids
// of jobs in other states are ignored). Every waiting job that depends on one of them is
// cancelled, with a history row of kind cancelled naming the job it depended on, and so on down
// to their own dependents, level by level. compat(0.2.0): nothing on the 0.2.0 schema.
void cancel_dependents(const int64* ids, int n, TimestampTz now);

// One reaped job, as reap_jobs() returns it (job_id, queue, outcome): the Datums are SPI's.
using ReapedRow = void (*)(void* arg, Datum job_id, Datum queue, Datum state);

// The background worker's deadlines, for reap() (housekeeping/reap.hpp), each over at most
// max_jobs jobs, skipping rows other transactions hold. Running jobs past their max_run_time
// (the shorter of the job's and its queue's; timed out even while they heartbeat): the attempt
// ends as a failure does, history kind timed_out, and the worker holding it is notified. Jobs
// never claimed whose start_by has passed: cancelled, reason "expired". Both cancel the jobs
// that depend on what ended. Each reaped job goes to row (when not nullptr). Return how many.
// compat(0.2.0): both do nothing on the 0.2.0 schema.
uint64 time_out_overdue(int32 max_jobs, TimestampTz now, ReapedRow row, void* arg);
uint64 expire_unclaimed(int32 max_jobs, TimestampTz now, ReapedRow row, void* arg);

// Whether state (a jobcap.job_state) is the one labelled label.
bool job_state_is(Datum state, const char* label);

// An int8[] of ids[0..n) (palloc'd in the current memory context).
Datum int8_array(const int64* ids, int n);

}  // namespace jobcap
