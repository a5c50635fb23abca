// What the direct path knows of jobcap's tables (their shape), learnt once per backend and
// forgotten when the relcache entry of one of them is invalidated: src/direct/shape.cpp learns
// it, src/direct/vet.cpp decides what the direct path may do itself. Private to src/direct/.
#pragma once

#include "direct/heap.hpp"

#include "direct/direct.hpp"

namespace jobcap::direct {

// The columns the direct path reads or writes, found by name (column order is not part of the
// tables' contract: an upgraded database and a fresh one may differ). Their names and types are
// in shape.cpp.
enum JobColumn {
    kJobId,
    kQueue,
    kState,
    kPriority,
    kRunAt,
    kAttempts,
    kMaxAttempts,
    kFence,
    kLease,
    kLeaseExpiresAt,
    kWorker,
    kFirstClaimedAt,
    kClaimedAt,
    kFinishedAt,
    kPayload,
    kCapEpoch,
    kOutput,
    kDedupeKey,
    kEnqueuedAt,
    kJobColumns
};
enum QueueColumn {
    kQQueue,
    kQMaxAttempts,
    kQLease,
    kQPaused,
    kQMaxRunning,
    kQCapEpoch,
    kQNotify,
    kQBackoffBase,
    kQBackoffMax,
    kQueueColumns
};
// jobcap.job_errors, the history fail_job and crash_job add to (and prune).
enum ErrorColumn {
    kESeq,
    kEJobId,
    kEQueue,
    kEAttempt,
    kEFence,
    kEKind,
    kEWorker,
    kEError,
    kEAt,
    kErrorColumns
};

enum class Learnt : uint8 { unknown, yes, no };

// What the direct path knows of the installed tables. Learned on first use and forgotten when
// the relcache entry of one of them is invalidated (ALTER TABLE, CREATE TRIGGER, CREATE INDEX,
// ALTER EXTENSION jobcap UPDATE, DROP EXTENSION, ...).
struct Shape {
    bool known;
    bool direct;  // 0.2.0 columns present, no triggers, no row security, indexes as expected
    Oid jobs, jobs_pkey, jobs_claim, queues, queues_pkey, grants, grants_pkey, fences;
    // jobs_running, a shared claim's count of its queue's running jobs (claim.cpp), vetted:
    // every running job and only those, on (hashtextextended(queue, 0), job_id)
    // (running_by_queue) or, compat(0.2.0), on job_id; InvalidOid otherwise (the claims of a
    // queue with max_running then go to the SQL path).
    Oid jobs_running;
    bool running_by_queue;
    AttrNumber job[kJobColumns];
    AttrNumber queue[kQueueColumns];
    AttrNumber grant_queue, grant_grantee;
    // compat(0.2.0): the workflow columns of jobs, InvalidAttrNumber on the 0.2.0 schema (a
    // column of another type there sends every call to the SQL path): has_dependents (read by
    // completions), start_by (claims skip a job never claimed past it; enqueues write it) and
    // max_run_time (enqueues write it).
    AttrNumber has_dependents, start_by, max_run_time;
    // compat(0.2.0): jobs.concurrency_key (enqueues write it), InvalidAttrNumber on the 0.2.0
    // schema, as the workflow columns.
    AttrNumber concurrency_key;
    // compat(0.2.0): queues.rate_limit, InvalidAttrNumber on the 0.2.0 schema (of another type
    // there, every call goes to the SQL path). A queue with one is capped: its claims take the
    // shared turn far below it, else go to the SQL path (docs/direct_path.md).
    AttrNumber queue_rate_limit;
    AttrNumber
        queue_rate_period;  // (an interval, NOT NULL) InvalidAttrNumber: rated claims go to SQL
    // compat(0.2.0): queues.max_running_per_key and fairness, InvalidAttrNumber on the 0.2.0
    // schema (of another type there, every call goes to the SQL path). A queue with a per-key
    // limit or round-robin fairness is capped too: its claims go to the SQL path.
    AttrNumber queue_per_key, queue_fairness;
    // jobcap.queue_rates (queue, slot, slot_us, newest, counts) and its primary key on (queue,
    // slot), vetted: a shared claim of a rate-limited queue reads its rows (claim.cpp). Invalid
    // otherwise (compat(0.2.0): none there), and such claims go to the SQL path.
    Oid rates, rates_pkey;
    AttrNumber rate_queue, rate_slot, rate_slot_us, rate_newest, rate_counts;
    // A round-robin queue's claim of one job (turns.cpp): jobs_keys (pending jobs with a key, by
    // queue hash, key, priority, run_at, job_id), vetted as the claim index is, and
    // jobcap.queue_turns (queue, last_key) with its primary key on queue, vetted as queue_rates.
    // Invalid otherwise (compat(0.2.0): none there), and such claims go to the SQL path.
    Oid jobs_keys, turns, turns_pkey;
    AttrNumber turn_queue, turn_last_key;
    Oid pending, running, succeeded, dead;  // jobs.state's enum values
    // Enqueueing (insertable): every column the INSERT of the SQL path leaves to its default
    // has none (NULL, on a nullable column) or a constant one, kept in defaults (shape_context);
    // job_id is an identity column whose sequence is identity. Learnt on the first enqueue
    // (learn_need), so that a default that cannot be computed fails enqueues only, as on the
    // SQL path.
    Learnt insertable;
    Oid identity;
    int natts;
    Datum* defaults;
    bool* default_nulls;
    // Failing (failable): job_errors has no triggers, rules or row security, CHECK constraints
    // of built-in functions only (the direct path evaluates them as the executor does), seq an
    // identity column, constant defaults elsewhere, and its index on (job_id, seq). Learnt on
    // the first failure.
    Learnt failable;
    Oid errors, errors_by_job, errors_identity;
    AttrNumber error[kErrorColumns];
    Datum* error_defaults;
    bool* error_default_nulls;
};
extern Shape shape;
extern MemoryContext shape_context;  // the shape's defaults; reset when it is learnt again
extern uint64 invalidations;         // relcache invalidations of the tables seen so far

}  // namespace jobcap::direct
