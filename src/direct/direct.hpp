// The direct path (jobcap.hot_path = direct): enqueue, claim, complete, fail, heartbeat and
// assert_fence on jobcap.jobs (and the failures' history in jobcap.job_errors) without SPI, the
// planner or the executor's plan nodes, the way PostgreSQL's own logical replication apply
// worker changes rows (src/backend/executor/execReplication.c): find the row through an index
// with a fresh snapshot, lock it (SKIP LOCKED for a claim, waiting for a settle, like UPDATE),
// re-check every predicate on the locked version (what EvalPlanQual does for the SQL
// statement), update the heap tuple, and insert index entries only when the update was not HOT
// (so every index of the table is kept, whatever a DBA added). Enqueues insert as COPY FROM does
// (heap_multi_insert). WAL, logical decoding, statistics and HOT are heapam's, the same as for
// the SQL statements.
//
// The operations pair with the SQL functions that call them: claim.cpp with functions/claim.cpp,
// settle.cpp (and history.cpp, a failure's history) with functions/settle.cpp, enqueue.cpp with
// functions/enqueue.cpp. What they share is private to src/direct/: heap.hpp (PostgreSQL's
// headers), shape.hpp (the tables as learnt, shape.cpp, and vetted, vet.hpp) and rows.hpp (one
// call's table and indexes; a row found, locked, re-checked and updated).
//
// The SQL statements stay the reference (jobcap.hot_path = sql), and serve every call the direct
// path does not: REPEATABLE READ and SERIALIZABLE (where a row changed since the snapshot must
// raise a serialization failure), tables with triggers, row security, constraints or anything
// else only the executor applies or that would run a DBA's code (docs/direct_path.md lists it),
// the 0.1.0 schema, and every claim of a queue that is missing, paused, capped or not the
// caller's (the SQL path then decides and raises). The differential test
// (test/t/140_direct_path.pl) runs the same operations through both and compares the states.
#pragma once

#include "pg.hpp"

#include "spi/rates.hpp"

#include "spi/access.hpp"
#include "spi/calls.hpp"

namespace jobcap::direct {

// Whether this call of function may take the direct path (see above); says which at DEBUG2.
// Cheap after the first call of a session: the tables' shape is cached and forgotten when the
// relcache entry of one of them is invalidated.
// What the call needs besides updating jobs: insert (enqueue_job, enqueue_jobs) needs every
// column the SQL path's INSERT leaves to its default to have a constant one; fail (fail_job,
// crash_job) writes and prunes jobcap.job_errors too, which must be as plain; claim, insert and
// fail read the queue's row (update: complete, heartbeat, assert_fence do not). access: the
// caller's (a privileged caller's call reads no grants).
enum class Need { update, claim, insert, fail };
bool usable(const char* function, const Access& access, Need need = Need::update);

// The fenced calls, with their arguments as spi/calls.hpp reads them. Each returns false when
// no current row matched (job_id, fence, running, a queue the caller may work): the caller then
// raises with raise_not_current, as the SQL path.
// complete: state succeeded, finished_at = now, lease dropped, output kept (NULL: none).
// *has_dependents: jobs wait for this one (read from the locked version; the caller releases
// them with the SQL statements, housekeeping/workflows.hpp).
bool complete(const Access& access, const CompleteCall& call, bool* has_dependents);
// complete for a batch (complete_jobs), all in one snapshot: returns the index of the first
// (job_id, fence) pair in input order that was not current (nothing more is tried: the caller
// raises, and the transaction rolls back), or -1 with *settled = the jobs completed. A pair
// listed twice is settled once. outputs: NULL, or one per job (no_outputs[i]: none).
// dependents (room for n) gets the completed jobs that others wait for, *ndependents of them.
int complete_many(const Access& access, const int64* job_ids, const int64* fences,
                  const Datum* outputs, const bool* no_outputs, int n, TimestampTz now,
                  int* settled, int64* dependents, int* ndependents);
// heartbeat: the lease pushed to now + extend (NULL: the claim's lease), never shortened;
// *expires gets the lease's new end.
bool heartbeat(const Access& access, const HeartbeatCall& call, TimestampTz* expires);
// assert_fence: the row locked (FOR NO KEY UPDATE) to the end of the transaction.
bool assert_fence(const Access& access, const FencedCall& call);
// fail_job and crash_job: the attempt failed; the job goes back to pending after a backoff
// (retry_in, or the queue's) or, when its attempts reached its cap, dies. A history row with
// the error text unless jobcap.error_history is 0, the job's history cut to that many rows.
// Returns false when no current row matched; else *state = the new state and *wake = the queue
// whose listeners are to be woken (a retry on a queue with notify on), or nullptr.
bool fail(const Access& access, const FailCall& call, Datum* state, char** wake);

// The enum value of jobs.state 'succeeded' (complete_job's result).
Datum succeeded_state();

// One claimed job, as claim_job returns it (payload copied into the caller's memory).
struct Claimed {
    int64 job_id;
    int64 fence;
    int32 attempts;
    int32 cap;
    bool no_cap;
    Datum payload;
    TimestampTz lease_expires_at;
};

// A claim of a rate-limited queue under the shared turn: the slot it claimed under and the
// queue's window, the slot's own row to be charged with what it claimed (claim() writes it, in
// the claim's transaction). slot -1: nothing charged. covered: the claim is made under this
// backend's charge ahead (core::RateAllowance), neither reading nor writing the window.
struct RateCharge {
    int slot;
    bool covered;
    RateRows window;
    bool found;  // the own row exists, its version read at tid
    ItemPointerData tid;

    void clear()  // nothing charged, nothing covered
    {
        slot = -1;
        covered = false;
    }
};

// Claims up to call.batch pending, due jobs of call.queue below their cap, in claim order
// (priority, run_at, job_id), skipping rows locked by others and the jobs in call.uncounted,
// into out (room for call.batch), and sets *charge. Returns how many, or -1 without claiming
// anything when the queue is missing, paused, capped (near a limit, or a limit the shared turn
// does not serve) or not the caller's: the SQL path then decides.
int claim(const Access& access, const ClaimCall& call, Claimed* out, RateCharge* charge);

// Inserts one job per payload (n of them, in this order) into queue, with ids from jobs.job_id's
// identity sequence in the same order, into ids (room for n); *notify = the queue's notify.
// Returns n, or -1 without inserting anything when the queue is missing or not the caller's:
// the SQL path then decides and raises. The caller holds lock_queue_for_insert's lock.
int enqueue(const Access& access, Datum queue, const Datum* payloads, int n,
            const EnqueueValues& values, int64* ids, bool* notify);

}  // namespace jobcap::direct
