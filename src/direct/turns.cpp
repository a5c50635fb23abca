// A round-robin queue's claim of one job on the direct path (rows.hpp): the SQL path's
// claim_job_turns (functions/claim_keyed.cpp) for a batch of one, without the planner and the
// executor's plan nodes, whose start-up was about half of that statement's time.
//
// It takes the queue's claim turn exclusive and then its row (FOR NO KEY UPDATE), as the SQL
// path's capped_room does, and reads the queue again and its turn (jobcap.queue_turns) in a
// snapshot taken after both. jobs_keys holds a queue's pending jobs with a key by key and, within
// a key, in claim order (priority, run_at, job_id): walked from the first key after the turn's
// (then from the first key up to the turn's own, the wrap), the first claimable job met is the
// first due job of the first key in turn that has one, which is what the statement's walk takes
// for a batch of one. No key has one: the first claimable job without a key, through the claim
// index. The job is locked without waiting (SKIP LOCKED): locked by another (claim_job_by_id, a
// cancel), it is not claimed and neither is any other, as the statement's cohort skips it. The
// turn is written with the claimed job's key (a job without a key leaves it).
#include "direct/rows.hpp"

#include "spi/queue_lock.hpp"

namespace jobcap::direct {
namespace {

// Locks the queue's row read at q.tid FOR NO KEY UPDATE (its latest version, waiting as the SQL
// statement does); false when it is gone.
bool lock_queue_row(Op& op, const QueueRow& q)
{
    Relation queues = table_open(shape.queues, RowShareLock);
    TupleTableSlot* slot = table_slot_create(queues, nullptr);
    ItemPointerData tid = q.tid;
    TM_FailureData failure;
    TM_Result r = table_tuple_lock(queues, &tid, op.snapshot, slot, op.cid, LockTupleNoKeyExclusive,
                                   LockWaitBlock, TUPLE_LOCK_FLAG_FIND_LAST_VERSION, &failure);
    ExecDropSingleTupleTableSlot(slot);
    table_close(queues, NoLock);  // as a statement's locks: held to the end of the transaction
    return r == TM_Ok;
}

// The queue's turn in op's snapshot: true with *last = its last key (copied; (Datum) 0 when the
// queue has no row yet, *found false) and the row's version at *tid. False when the shape was
// forgotten meanwhile (an invalidation read while the table's lock was taken).
bool read_turn(Op& op, Datum queue, Datum* last, bool* found, ItemPointerData* tid)
{
    *last = (Datum) 0;
    *found = false;
    // The write's lock, taken now and held to commit, as direct/rates.cpp's.
    Relation turns = table_open(shape.turns, RowExclusiveLock);
    Relation index = index_open(shape.turns_pkey, RowExclusiveLock);
    if (!shape.known) {
        index_close(index, NoLock);
        table_close(turns, NoLock);
        return false;
    }
    ScanKeyData key;
    ScanKeyEntryInitialize(&key, 0, shape.turn_queue, BTEqualStrategyNumber, InvalidOid,
                           index->rd_indcollation[0], F_TEXTEQ, queue);
    index_close(index, NoLock);
    SysScanDesc scan = systable_beginscan(turns, shape.turns_pkey, true, op.snapshot, 1, &key);
    TupleDesc desc = RelationGetDescr(turns);
    HeapTuple t;
    while (!*found && HeapTupleIsValid(t = systable_getnext(scan))) {
        bool n1 = false, n2 = false;
        Datum name = heap_getattr(t, shape.turn_queue, desc, &n1);
        Datum key_text = heap_getattr(t, shape.turn_last_key, desc, &n2);
        if (n1 || n2 ||
            !DatumGetBool(DirectFunctionCall2Coll(texteq, DEFAULT_COLLATION_OID, name, queue)))
            continue;  // another queue's row under the index's collation
        *found = true;
        *tid = t->t_self;
        *last = datumCopy(key_text, false, -1);
    }
    systable_endscan(scan);
    table_close(turns, NoLock);
    return true;
}

// Writes the queue's turn: last_key = key, over the version read (found, at tid) or as a new row.
void write_turn(Op& op, Datum queue, Datum key, bool found, ItemPointerData tid)
{
    Relation turns = table_open(shape.turns, RowExclusiveLock);
    TupleTableSlot* row = table_slot_create(turns, nullptr);
    ExecClearTuple(row);
    TupleDesc desc = RelationGetDescr(turns);
    for (int a = 0; a < desc->natts; ++a)  // every other column is a dropped one (learn_turns)
        row->tts_isnull[a] = true;
    row->tts_values[shape.turn_queue - 1] = queue;
    row->tts_isnull[shape.turn_queue - 1] = false;
    row->tts_values[shape.turn_last_key - 1] = key;
    row->tts_isnull[shape.turn_last_key - 1] = false;
    ExecStoreVirtualTuple(row);
    Datum pkey[1] = {queue};
    write_plainly(op, turns, shape.turns_pkey, found, tid, row, pkey, 1);
    ExecDropSingleTupleTableSlot(row);
    table_close(turns, NoLock);
}

// The first claimable job met in index (of op.rel) among the queue's entries whose second key
// compares to bound by strategy (bound (Datum) 0: all of them), in index order, into seen;
// keyed: only a job with a key (jobs_keys), else only one without (the claim index).
bool first_claimable(Op& op, Oid index_oid, Datum queue, StrategyNumber strategy, Datum bound,
                     bool keyed, const Claimable& eligible, TupleTableSlot* seen, core::Cap* cap)
{
    Relation index = open_index(op, index_oid);
    ScanKeyData keys[2];
    ScanKeyEntryInitialize(&keys[0], 0, 1, BTEqualStrategyNumber, InvalidOid, InvalidOid, F_INT8EQ,
                           queue_hash(queue));
    int nkeys = 1;
    if (bound != (Datum) 0) {
        ScanKeyEntryInitialize(&keys[1], 0, 2, strategy, InvalidOid, index->rd_indcollation[1],
                               strategy == BTGreaterStrategyNumber ? F_TEXT_GT : F_TEXT_LE, bound);
        nkeys = 2;
    }
    IndexScanDesc scan = jobcap_index_beginscan(op.rel, index, op.snapshot, nkeys, 0);
    index_rescan(scan, keys, nkeys, nullptr, 0);
    bool found = false;
    while (!found && index_getnext_slot(scan, ForwardScanDirection, seen)) {
        bool no_key = false;
        slot_getattr(seen, shape.concurrency_key, &no_key);
        found = no_key != keyed && eligible(seen, cap);
    }
    index_endscan(scan);
    return found;
}

}  // namespace

int claim_in_turn(Op& op, const Access& access, const ClaimCall& call, QueueRow* q, Claimed* out)
{
    Datum queue = call.queue.datum;
    take_exclusive_claim_turn(queue);
    if (!lock_queue_row(op, *q))
        return -1;
    // Everything committed before the turn and the row were taken is seen from here: the claims
    // that went before and their turn, a change of the queue's settings.
    fresh_snapshot(op);
    TimestampTz now = GetCurrentTimestamp();
    Datum last = (Datum) 0;
    bool turn_found = false;
    ItemPointerData turn_tid;
    ItemPointerSetInvalid(&turn_tid);
    if (!read_queue(op, queue, q) || q->paused || !q->turns_only ||
        !may_work(access, queue, op.snapshot) ||
        !read_turn(op, queue, &last, &turn_found, &turn_tid))
        return -1;

    Claimable eligible = claimable(call, *q, now);
    TupleTableSlot* seen = table_slot_create(op.rel, nullptr);
    core::Cap cap = {};
    // The keys after the turn's, then the wrap: from the first key up to the turn's own.
    bool keyed =
        first_claimable(op, shape.jobs_keys, queue, BTGreaterStrategyNumber, last, true, eligible,
                        seen, &cap) ||
        (last != (Datum) 0 && first_claimable(op, shape.jobs_keys, queue, BTLessEqualStrategyNumber,
                                              last, true, eligible, seen, &cap));
    bool found = keyed || first_claimable(op, shape.jobs_claim, queue, InvalidStrategy, (Datum) 0,
                                          false, eligible, seen, &cap);
    int claimed = 0;
    if (found) {
        bool isnull = false;
        Datum key = keyed ? datumCopy(slot_getattr(seen, shape.concurrency_key, &isnull), false, -1)
                          : (Datum) 0;
        ItemPointerData tid = seen->tts_tid;
        TM_FailureData failure;
        TM_Result r =
            table_tuple_lock(op.rel, &tid, op.snapshot, op.found, op.cid, LockTupleNoKeyExclusive,
                             LockWaitSkip, TUPLE_LOCK_FLAG_FIND_LAST_VERSION, &failure);
        if (r == TM_Ok && eligible(op.found, &cap)) {
            Datum lease = call.no_lease ? q->lease : call.lease;
            Datum expires =
                DirectFunctionCall2(timestamptz_pl_interval, TimestampTzGetDatum(now), lease);
            claim_found(op, call, lease, expires, now, cap, out);
            claimed = 1;
            if (keyed)
                write_turn(op, queue, key, turn_found, turn_tid);
        }
    }
    ExecDropSingleTupleTableSlot(seen);
    return claimed;
}

}  // namespace jobcap::direct
