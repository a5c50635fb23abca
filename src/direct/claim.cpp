// claim on the direct path (direct.hpp): the claim statement's cohort found through the claim
// index, locked with SKIP LOCKED, re-checked, and updated row by row.
#include "direct/rows.hpp"

#include "spi/queue_lock.hpp"

namespace jobcap::direct {
namespace {

// How many of jobs_running's entries a capped claim counts without reading their rows before
// it reads them: past it, the entries left by completed jobs that no scan has marked dead yet
// (bench/results/2026-12-06-running-entries-first.md) cost more to step over than the rows cost
// to read, which marks them.
constexpr int64 kEntriesFirst = 64;

// Whether queue has at most limit running jobs in op's snapshot (counted through jobs_running
// until there are more): the queue's entries, found by its hash (compat(0.2.0): every running
// job's, the index on job_id alone). The entries are counted first without their rows: every
// row version the snapshot sees running has one (inserted with it; marked dead or vacuumed only
// once no snapshot can see it), so when the entries are at most limit, so are the running jobs.
// Then, when there were more (or more than kEntriesFirst), each entry's row is read and counted
// if the snapshot sees it running in this queue, which also marks the dead ones.
bool running_at_most(Op& op, Datum queue, int64 limit)
{
    if (limit < 0)
        return false;
    Relation index = open_index(op, shape.jobs_running);
    ScanKeyData key;
    int nkeys = 0;
    if (shape.running_by_queue) {
        ScanKeyEntryInitialize(&key, 0, 1, BTEqualStrategyNumber, InvalidOid, InvalidOid, F_INT8EQ,
                               queue_hash(queue));
        nkeys = 1;
    }
    IndexScanDesc scan = jobcap_index_beginscan(op.rel, index, op.snapshot, nkeys, 0);
    index_rescan(scan, &key, nkeys, nullptr, 0);
    int64 entries = 0, enough = Min(limit, kEntriesFirst);
    while (entries <= enough && index_getnext_tid(scan, ForwardScanDirection) != nullptr)
        ++entries;
    if (entries <= enough) {
        index_endscan(scan);
        return true;
    }
    index_rescan(scan, &key, nkeys, nullptr, 0);
    TupleTableSlot* seen = table_slot_create(op.rel, nullptr);
    int64 running = 0;
    while (running <= limit && index_getnext_slot(scan, ForwardScanDirection, seen)) {
        bool isnull = false;
        Datum q = slot_getattr(seen, shape.job[kQueue], &isnull);
        if (state_of(seen) == shape.running && !isnull &&
            DatumGetBool(DirectFunctionCall2Coll(texteq, DEFAULT_COLLATION_OID, q, queue)))
            ++running;
    }
    index_endscan(scan);
    ExecDropSingleTupleTableSlot(seen);
    return running <= limit;
}

// Whether the queue whose row is q may be claimed batch jobs at a time under the shared turn
// when far enough below its limits: its limits are max_running, max_running_per_key and
// rate_limit alone, each at least kSharedClaimRoom (the room the shared turn needs).
bool may_share(const QueueRow& q, int batch)
{
    return q.shareable && batch <= kSharedClaimBatch &&
           (!q.run_capped || (q.run_cap >= kSharedClaimRoom && OidIsValid(shape.jobs_running))) &&
           (q.rate_limit == 0 || q.rate_limit >= kSharedClaimRoom);
}

// Whether a claim of batch jobs of the queue whose row is q, read in op's snapshot taken after
// the shared turn's slot, may run under it: at least kSharedClaimRoom more jobs may run than
// run now under the smaller of max_running and max_running_per_key (a key's running jobs are
// some of the queue's, so a per-key limit that far above the queue's running jobs is one no
// key can reach either), and the rate window's rows leave at least kSharedClaimRoom claims of
// room (every claim in flight under another slot has at most kSharedClaimBatch jobs to charge,
// which this snapshot may not see), unless this backend's charge ahead covers the claim (it was
// counted when charged: rates.cpp). *charge: the slot's own row of the window, for a
// rate-limited queue, to be charged with what the claim takes, or covered.
bool room_for_shared(Op& op, Datum queue, int batch, const QueueRow& q, int slot, TimestampTz now,
                     RateCharge* charge)
{
    if (q.paused || !may_share(q, batch))
        return false;
    if (q.run_capped &&
        !running_at_most(op, queue, static_cast<int64>(q.run_cap) - kSharedClaimRoom))
        return false;
    if (q.rate_limit > 0) {
        if (rate_allowance_covers(queue, q, now, batch)) {
            charge->covered = true;
            return true;
        }
        if (read_rate_rows(op, queue, q, slot, now, charge) < kSharedClaimRoom)
            return false;
        charge->slot = slot;
    }
    return true;
}

// The claim's time once it holds a turn, read after the snapshot: every charge of a rate window
// that snapshot sees was made by a claim whose clock was read before it committed, so before
// this reading, and the window's rows, moved to their newest slot, are never charged later than
// the claimed_at of the jobs they count (with a clock that does not go back). A time read
// before a wait for the turn would be: its jobs counted in a later slot than their claimed_at.
TimestampTz clock_after_snapshot()
{
    return GetCurrentTimestamp();
}

// A capped queue's claim: the slot of the shared turn it took (spi/queue_lock.hpp), with *q
// read again in a snapshot taken after it, or -1 (holding nothing) when the SQL path must
// decide: the queue is near a limit or has another limit, every slot is taken, or the batch
// is too large for a slot.
int take_shared_turn(Op& op, Datum queue, int batch, TimestampTz* now, QueueRow* q,
                     RateCharge* charge)
{
    if (!may_share(*q, batch))
        return -1;
    int slot = take_shared_claim_turn(queue);
    if (slot < 0)
        return -1;
    fresh_snapshot(op);
    TimestampTz before = *now;
    *now = clock_after_snapshot();
    if (read_queue(op, queue, q) && room_for_shared(op, queue, batch, *q, slot, *now, charge))
        return slot;
    *now = before;
    charge->clear();
    give_back_shared_claim_turn(queue, slot);
    return -1;
}

// The queue this process last claimed from under a shared turn (in TopMemoryContext; nullptr:
// none). Its next claim takes the turn before its snapshot, so one reading of the queue's row
// serves, instead of a reading, the turn and a second reading.
text* shared_last = nullptr;

bool is_shared_last(Datum queue)
{
    return shared_last != nullptr &&
           DatumGetBool(DirectFunctionCall2Coll(texteq, DEFAULT_COLLATION_OID, queue,
                                                PointerGetDatum(shared_last)));
}

void remember_shared(Datum queue, bool shared)
{
    if (shared == is_shared_last(queue))
        return;
    if (shared_last != nullptr)
        pfree(shared_last);
    shared_last = nullptr;
    if (shared) {
        Size size = VARSIZE_ANY(DatumGetPointer(queue));
        shared_last = static_cast<text*>(MemoryContextAlloc(TopMemoryContext, size));
        memcpy(shared_last, DatumGetPointer(queue), size);
    }
}

}  // namespace

Claimable claimable(const ClaimCall& call, const QueueRow& q, TimestampTz now)
{
    ArrayType* skip = DatumGetArrayTypeP(call.uncounted);
    return Claimable{call.queue.datum, now, &q, reinterpret_cast<const int64*>(ARR_DATA_PTR(skip)),
                     ArrayGetNItems(ARR_NDIM(skip), ARR_DIMS(skip))};
}

bool Claimable::operator()(TupleTableSlot* slot, core::Cap* cap) const
{
    if (state_of(slot) != shape.pending)
        return false;
    bool isnull = false;
    Datum q2 = slot_getattr(slot, shape.job[kQueue], &isnull);
    if (isnull || !DatumGetBool(DirectFunctionCall2Coll(texteq, DEFAULT_COLLATION_OID, q2, queue)))
        return false;
    Datum run_at = slot_getattr(slot, shape.job[kRunAt], &isnull);
    if (isnull || DatumGetTimestampTz(run_at) > now)
        return false;
    *cap = cap_of_job(slot, *q);
    if (!core::may_claim(int4_of(slot, kAttempts), *cap))
        return false;
    // The statement's start_by guard: a job never claimed is not claimed past its start_by
    // (compat(0.2.0): no such column on the 0.2.0 schema).
    if (shape.start_by != InvalidAttrNumber) {
        Datum start_by = slot_getattr(slot, shape.start_by, &isnull);
        if (!isnull && DatumGetTimestampTz(start_by) < now) {
            slot_getattr(slot, shape.job[kFirstClaimedAt], &isnull);
            if (isnull)
                return false;
        }
    }
    int64 id = int8_of(slot, kJobId);
    for (int i = 0; i < nskip; ++i)
        if (skipped[i] == id)
            return false;
    return true;
}

void claim_found(Op& op, const ClaimCall& call, Datum lease, Datum expires, TimestampTz now,
                 const core::Cap& cap, Claimed* out)
{
    bool first_null = false;
    slot_getattr(op.found, shape.job[kFirstClaimedAt], &first_null);
    int32 attempts = int4_of(op.found, kAttempts) + 1;
    int64 fence = nextval_internal(shape.fences, false);
    set(op, kState, ObjectIdGetDatum(shape.running));
    set(op, kAttempts, Int32GetDatum(attempts));
    set(op, kFence, Int64GetDatum(fence));
    set(op, kLease, lease);
    set(op, kLeaseExpiresAt, expires);
    set(op, kWorker, call.worker.datum);
    set(op, kClaimedAt, TimestampTzGetDatum(now));
    if (first_null)
        set(op, kFirstClaimedAt, TimestampTzGetDatum(now));
    update(op);

    out->job_id = int8_of(op.next, kJobId);
    out->fence = fence;
    out->attempts = attempts;
    out->cap = cap.value;
    out->no_cap = cap.none;
    out->lease_expires_at = DatumGetTimestampTz(expires);
    bool isnull = false;
    Datum payload = slot_getattr(op.next, shape.job[kPayload], &isnull);
    out->payload = isnull ? (Datum) 0 : datumCopy(payload, false, -1);
}

int claim(const Access& access, const ClaimCall& call, Claimed* out, RateCharge* charge)
{
    Datum queue = call.queue.datum;
    TimestampTz now = call.now;
    charge->clear();
    Op op;
    begin(op);
    // A queue claimed under a shared turn before: the turn, then a snapshot to read its row in.
    int turn = -1;
    if (call.batch <= kSharedClaimBatch && is_shared_last(queue)) {
        turn = take_shared_claim_turn(queue);
        if (turn >= 0) {
            fresh_snapshot(op);
            now = clock_after_snapshot();
        }
    }

    // The queue's settings, as the statement's one-time filter and InitPlans read them.
    QueueRow q;
    bool open = read_queue(op, queue, &q) && !q.paused && may_work(access, queue, op.snapshot);
    if (turn >= 0 && !(open && room_for_shared(op, queue, call.batch, q, turn, now, charge))) {
        charge->clear();
        give_back_shared_claim_turn(queue, turn);
        turn = -1;
        now = call.now;  // an open queue's claim: the call's time, as the SQL path's
        open = open && !q.limited;
    } else if (turn < 0 && open && q.turns_only && call.batch <= kSharedClaimBatch &&
               OidIsValid(shape.turns)) {
        remember_shared(queue, false);
        int n = claim_in_turn(op, access, call, &q, out);
        end(op);
        if (n < 0)
            elog(DEBUG2,
                 "jobcap: the claim goes to the SQL path: the round-robin queue's "
                 "settings changed, or its first turn is to be written");
        return n;
    } else if (turn < 0 && open && q.limited) {
        turn = take_shared_turn(op, queue, call.batch, &now, &q, charge);
        open = turn >= 0;
    }
    remember_shared(queue, turn >= 0);
    if (!open) {
        end(op);
        elog(DEBUG2,
             "jobcap: the claim goes to the SQL path: the queue is missing, paused, "
             "capped or not the caller's");
        return -1;
    }
    Datum granted_lease = call.no_lease ? q.lease : call.lease;
    Datum expires =
        DirectFunctionCall2(timestamptz_pl_interval, TimestampTzGetDatum(now), granted_lease);

    Claimable eligible = claimable(call, q, now);

    // The claim index's first key is the queue's hash: queues whose names share it share a run
    // of the index, and eligible() compares the name.
    Relation index = open_index(op, shape.jobs_claim);
    ScanKeyData key;
    ScanKeyEntryInitialize(&key, 0, 1, BTEqualStrategyNumber, InvalidOid, InvalidOid, F_INT8EQ,
                           queue_hash(queue));
    IndexScanDesc scan = jobcap_index_beginscan(op.rel, index, op.snapshot, 1, 0);
    index_rescan(scan, &key, 1, nullptr, 0);
    TupleTableSlot* seen = table_slot_create(op.rel, nullptr);
    int claimed = 0;
    while (claimed < call.batch && index_getnext_slot(scan, ForwardScanDirection, seen)) {
        core::Cap cap = {};
        if (!eligible(seen, &cap))
            continue;
        ItemPointerData tid = seen->tts_tid;
        TM_FailureData failure;
        TM_Result r =
            table_tuple_lock(op.rel, &tid, op.snapshot, op.found, op.cid, LockTupleNoKeyExclusive,
                             LockWaitSkip, TUPLE_LOCK_FLAG_FIND_LAST_VERSION, &failure);
        if (r != TM_Ok || !eligible(op.found, &cap))
            continue;  // locked by another (SKIP LOCKED), gone, or no longer claimable

        claim_found(op, call, granted_lease, expires, now, cap, &out[claimed++]);
    }
    index_endscan(scan);
    ExecDropSingleTupleTableSlot(seen);
    if (charge->slot >= 0 || charge->covered)
        settle_rate_charge(op, queue, q, now, *charge, claimed, call.batch);
    end(op);
    return claimed;
}

}  // namespace jobcap::direct
