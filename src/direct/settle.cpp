// The fenced calls on the direct path (direct.hpp): complete, complete_many, heartbeat,
// assert_fence and fail, each a compare-and-swap on (job_id, fence, running) under the row lock.
#include "direct/history.hpp"

#include "core/backoff.hpp"
#include "core/rules.hpp"
#include "spi/args.hpp"
#include "spi/errors.hpp"

namespace jobcap::direct {

namespace {
// complete on an open Op; *has_dependents from the locked version.
bool complete_in(Op& op, const Access& access, int64 job_id, int64 fence, TimestampTz now,
                 Datum output, bool no_output, bool* has_dependents)
{
    if (!lock_current(op, access, job_id, fence))
        return false;
    // compat(0.2.0): no has_dependents column on the 0.2.0 schema, where nothing depends on a job.
    bool none = true;
    Datum dependents = shape.has_dependents == InvalidAttrNumber
                           ? (Datum) 0
                           : slot_getattr(op.found, shape.has_dependents, &none);
    *has_dependents = !none && DatumGetBool(dependents);
    set(op, kState, ObjectIdGetDatum(shape.succeeded));
    set(op, kFinishedAt, TimestampTzGetDatum(now));
    set(op, kLeaseExpiresAt, (Datum) 0, true);
    set(op, kOutput, output, no_output);
    update(op);
    return true;
}
}  // namespace

bool complete(const Access& access, const CompleteCall& call, bool* has_dependents)
{
    Op op;
    begin(op);
    bool done = complete_in(op, access, call.job.job_id, call.job.fence, call.job.now, call.output,
                            call.no_output, has_dependents);
    end(op);
    return done;
}

int complete_many(const Access& access, const int64* job_ids, const int64* fences,
                  const Datum* outputs, const bool* no_outputs, int n, TimestampTz now,
                  int* settled, int64* dependents, int* ndependents)
{
    Op op;
    begin(op);
    *settled = 0;
    *ndependents = 0;
    int failed = -1;
    for (int i = 0; i < n && failed < 0; ++i) {
        // A pair listed twice is settled once (the SQL path's UPDATE ... FROM joins it twice
        // and updates the row once).
        bool again = false;
        for (int k = 0; k < i && !again; ++k)
            again = job_ids[k] == job_ids[i] && fences[k] == fences[i];
        if (again)
            continue;
        bool waited_for = false;
        if (complete_in(op, access, job_ids[i], fences[i], now,
                        outputs == nullptr ? (Datum) 0 : outputs[i],
                        outputs == nullptr || no_outputs[i], &waited_for)) {
            ++*settled;
            if (waited_for)
                dependents[(*ndependents)++] = job_ids[i];
        } else {
            failed = i;
        }
    }
    end(op);
    return failed;
}

bool heartbeat(const Access& access, const HeartbeatCall& call, TimestampTz* expires)
{
    int64 job_id = call.job.job_id;
    Op op;
    begin(op);
    bool done = lock_current(op, access, job_id, call.job.fence);
    if (done) {
        // greatest(lease_expires_at, now + coalesce(extend, lease)): NULLs are ignored.
        bool no_lease = false, no_expiry = false;
        Datum lease =
            call.no_extend ? slot_getattr(op.found, shape.job[kLease], &no_lease) : call.extend;
        Datum expiry = slot_getattr(op.found, shape.job[kLeaseExpiresAt], &no_expiry);
        TimestampTz until = no_expiry ? 0 : DatumGetTimestampTz(expiry);
        if (!no_lease) {
            TimestampTz pushed = DatumGetTimestampTz(DirectFunctionCall2(
                timestamptz_pl_interval, TimestampTzGetDatum(call.job.now), lease));
            if (no_expiry || pushed > until)
                until = pushed;
            no_expiry = false;
        }
        // Only a row edited by hand has neither: say so rather than call a current fence stale.
        if (no_expiry)
            ereport(ERROR,
                    (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                     errmsg("job %lld has no lease to extend", static_cast<long long>(job_id)),
                     errhint("Give it one with heartbeat's extend argument.")));
        set(op, kLeaseExpiresAt, TimestampTzGetDatum(until));
        update(op);
        *expires = until;
    }
    end(op);
    return done;
}

bool assert_fence(const Access& access, const FencedCall& call)
{
    Op op;
    begin(op, CMD_SELECT);
    bool done = lock_current(op, access, call.job_id, call.fence);
    end(op);
    return done;
}

namespace {

// jobcap.backoff(attempt, base, max) (functions/backoff.cpp) for a queue's stored spans, which
// it checks as its arguments.
Datum backoff(int32 attempt, Datum base, Datum max)
{
    core::Span b = span_of(DatumGetIntervalP(base)), m = span_of(DatumGetIntervalP(max));
    if (core::Problem p = core::check_span("backoff_base", b, true, false))
        raise_problem(p);
    if (core::Problem p = core::check_span("backoff_max", m, true, false))
        raise_problem(p);
    Interval* delay = static_cast<Interval*>(palloc0(sizeof(Interval)));
    delay->time = core::backoff_delay(attempt, core::span_usec(b), core::span_usec(m),
                                      pg_prng_double(&pg_global_prng_state));
    return IntervalPGetDatum(delay);
}

}  // namespace

bool fail(const Access& access, const FailCall& call, Datum* state, char** wake)
{
    TimestampTz now = call.job.now;
    Op op;
    begin(op);
    // The statement's DELETE from job_errors checks the replica identity when it starts,
    // whether or not it then deletes a row.
    Relation errors = table_open(shape.errors, RowExclusiveLock);
    CheckCmdReplicaIdentity(errors, CMD_DELETE);
    // The statement joins the job's queue: a job whose queue is gone matches no row.
    QueueRow q;
    bool isnull = false;
    bool done = lock_current(op, access, call.job.job_id, call.job.fence, true) &&
                read_queue(op, slot_getattr(op.found, shape.job[kQueue], &isnull), &q);
    if (done) {
        // The attempt the claim counted was the last (core/cap.hpp): a budget without a cap
        // retries.
        int32 attempts = int4_of(op.found, kAttempts);
        bool dead = core::attempts_used_up(attempts, cap_of_job(op.found, q));
        set(op, kState, ObjectIdGetDatum(dead ? shape.dead : shape.pending));
        if (dead) {
            set(op, kFinishedAt, TimestampTzGetDatum(now));
        } else {
            Datum delay =
                call.no_retry_in ? backoff(attempts, q.backoff_base, q.backoff_max) : call.retry_in;
            set(op, kRunAt,
                DirectFunctionCall2(timestamptz_pl_interval, TimestampTzGetDatum(now), delay));
            set(op, kFinishedAt, (Datum) 0, true);
        }
        set(op, kLeaseExpiresAt, (Datum) 0, true);
        update(op);
        add_history(op, errors, access, call.kind, call.error, call.no_error, now);
        *state = ObjectIdGetDatum(dead ? shape.dead : shape.pending);
        *wake = !dead && q.notify
                    ? TextDatumGetCString(slot_getattr(op.next, shape.job[kQueue], &isnull))
                    : nullptr;
    }
    table_close(errors, NoLock);  // as a statement's locks: held to the end of the transaction
    end(op);
    return done;
}

}  // namespace jobcap::direct
