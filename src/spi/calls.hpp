// The arguments of the hot path's calls, read once from fcinfo by the SQL functions
// (src/functions/claim.cpp, settle.cpp, enqueue.cpp) and taken as they are by both paths: the
// SQL path binds them as its statements' parameters, the direct path (src/direct/direct.hpp)
// works with them. Plain data.
#pragma once

#include "pg.hpp"

#include "spi/args.hpp"

namespace jobcap {

// A fenced call's job: the job, the fence its caller holds, and the call's one clock reading.
struct FencedCall {
    int64 job_id;
    int64 fence;
    TimestampTz now;
};

// complete_job (and complete_and_claim's completion): output already bounded (kept_output).
struct CompleteCall {
    FencedCall job;
    Datum output;
    bool no_output;
};

// heartbeat: extend NULL is the claim's lease.
struct HeartbeatCall {
    FencedCall job;
    Datum extend;
    bool no_extend;
};

// fail_job and crash_job: error already cut (kept_text; NULL: none), retry_in NULL is the
// queue's backoff; kind is the history row's kind ("error", "crashed").
struct FailCall {
    FencedCall job;
    Datum error;
    bool no_error;
    Datum retry_in;
    bool no_retry_in;
    const char* kind;
};

// claim_job (and complete_and_claim's claim): lease NULL is the queue's; uncounted is an int8[]
// of jobs whose rolled-back claim waits to be counted (housekeeping/rollbacks.hpp).
struct ClaimCall {
    NameArg queue;
    NameArg worker;
    int32 batch;
    Datum lease;
    bool no_lease;
    TimestampTz now;
    Datum uncounted;
};

// What an enqueue gives every job (enqueue_job, enqueue_jobs; the SQL path's INSERT lists the
// same columns).
struct EnqueueValues {
    TimestampTz run_at;
    int32 priority;
    int32 max_attempts;
    bool no_max_attempts;   // NULL: the queue's cap
    bool lists_dedupe_key;  // enqueue_job: dedupe_key NULL (a key goes to the SQL path);
                            // enqueue_jobs: the column's default
    TimestampTz now;        // enqueued_at
    // compat(0.2.0): the 0.3.0 declarations' start_by and max_run_time (NULL: none, and always
    // on the 0.2.0 declarations).
    TimestampTz start_by;
    bool no_start_by;
    Datum max_run_time;
    bool no_max_run_time;
    // compat(0.2.0): the 0.3.0 declarations' concurrency keys, one per job (keys: NULL when none
    // is given; key_nulls[i]: job i has none). enqueue_job's one key is keys[0].
    const Datum* keys;
    const bool* key_nulls;
    Datum keys_array;  // enqueue_jobs: the text[] as given ((Datum) 0: NULL)
};

}  // namespace jobcap
