// A round-robin queue's claim of up to kSharedClaimBatch jobs on the direct path (rows.hpp): the
// SQL path's claim_job_turns (functions/claim_keyed.cpp) without the planner and the executor's
// plan nodes, whose start-up was about half of that statement's time.
//
// It takes the queue's claim turn exclusive and then its row (FOR NO KEY UPDATE), as the SQL
// path's capped_room does, and reads the queue again and its turn (jobcap.queue_turns) in a
// snapshot taken after both. jobs_keys holds a queue's pending jobs with a key by key and, within
// a key, in claim order (priority, run_at, job_id), so the first claimable job met from a key on
// is the first due job of the first key from there that has one: the walk is one descent per
// key, from the key after the turn's (then from the first key up to the turn's own, the wrap),
// as the statement's. The picks are the statement's (pick_in_turn), claimed in claim order with
// SKIP LOCKED: a pick locked by another (claim_job_by_id, a cancel) or no longer claimable is
// left, and no other job taken instead, as the statement's cohort leaves it. The turn is written
// with the key of the last pick, in the statement's order, that was claimed.
#include "direct/rows.hpp"

#include "core/order.hpp"
#include "spi/queue_lock.hpp"

namespace jobcap::direct {
namespace {

// Locks the queue's row read at q.tid FOR NO KEY UPDATE (its latest version, waiting as the SQL
// statement does): TM_Ok, TM_Deleted when it is gone (drop_queue committed meanwhile: the SQL
// statement's lock finds no row and claims nothing), or another result for the SQL path to see.
TM_Result lock_queue_row(Op& op, const QueueRow& q)
{
    Relation queues = table_open(shape.queues, RowShareLock);
    TupleTableSlot* slot = table_slot_create(queues, nullptr);
    ItemPointerData tid = q.tid;
    TM_FailureData failure;
    TM_Result r = table_tuple_lock(queues, &tid, op.snapshot, slot, op.cid, LockTupleNoKeyExclusive,
                                   LockWaitBlock, TUPLE_LOCK_FLAG_FIND_LAST_VERSION, &failure);
    ExecDropSingleTupleTableSlot(slot);
    table_close(queues, NoLock);  // as a statement's locks: held to the end of the transaction
    return r;
}

// The queue's turn in op's snapshot: true with *last = its last key (copied; (Datum) 0 when the
// queue has no row yet, *found false) and the row's version at *tid. False when the shape was
// forgotten meanwhile (an invalidation read while the table's lock was taken).
bool read_turn(Op& op, Datum queue, Datum* last, bool* found, ItemPointerData* tid)
{
    *last = (Datum) 0;
    *found = false;
    QueueRows rows;
    if (!rows.begin(op, shape.turns, shape.turns_pkey, shape.turn_queue, queue))
        return false;
    HeapTuple t = rows.next();
    bool isnull = true;
    Datum key_text =
        t == nullptr ? (Datum) 0 : heap_getattr(t, shape.turn_last_key, rows.desc, &isnull);
    if (!isnull) {  // NOT NULL (learn_turns)
        *found = true;
        *tid = t->t_self;
        *last = datumCopy(key_text, false, -1);
    }
    rows.end();
    return true;
}

// Writes the queue's turn: last_key = key, over the version read at tid (a queue with no turn
// row yet leaves its first turn to the SQL path's upsert: claim_in_turn).
void write_turn(Op& op, Datum queue, Datum key, ItemPointerData tid)
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
    write_plainly(op, turns, shape.turns_pkey, true, tid, row, pkey, 1);
    ExecDropSingleTupleTableSlot(row);
    table_close(turns, NoLock);
}

// A scan of the queue's entries in an index of op.rel (jobs_keys: keyed, only jobs with a key;
// the claim index: only jobs without one), restarted from a bound on the second key, yielding
// the claimable jobs it meets in index order. Ended by end(), not a destructor: next() runs
// code that can raise an error, whose longjmp must not pass over a destructor (the abort
// releases the scan's pins and the slot's memory).
struct Scan {
    Scan(Op& op, Oid index_oid, Datum queue, bool keyed, const Claimable& eligible)
        : op(op), keyed(keyed), eligible(eligible), hash(queue_hash(queue))
    {
        index = open_index(op, index_oid);
        seen = table_slot_create(op.rel, nullptr);
    }
    void end()
    {
        if (desc != nullptr)
            index_endscan(desc);
        ExecDropSingleTupleTableSlot(seen);
    }
    // From the entries whose second key compares to bound by strategy (BTGreaterStrategyNumber,
    // BTEqualStrategyNumber; InvalidStrategy: from the first).
    void start(StrategyNumber strategy, Datum bound)
    {
        ScanKeyData keys[2];
        ScanKeyEntryInitialize(&keys[0], 0, 1, BTEqualStrategyNumber, InvalidOid, InvalidOid,
                               F_INT8EQ, hash);
        if (strategy != InvalidStrategy)
            ScanKeyEntryInitialize(&keys[1], 0, 2, strategy, InvalidOid, index->rd_indcollation[1],
                                   strategy == BTGreaterStrategyNumber ? F_TEXT_GT : F_TEXTEQ,
                                   bound);
        // A rescan takes as many keys as the scan began with.
        int nkeys = strategy == InvalidStrategy ? 1 : 2;
        if (desc != nullptr && desc->numberOfKeys != nkeys) {
            index_endscan(desc);
            desc = nullptr;
        }
        if (desc == nullptr)
            desc = jobcap_index_beginscan(op.rel, index, op.snapshot, nkeys, 0);
        index_rescan(desc, keys, nkeys, nullptr, 0);
    }
    // The next claimable job, in seen.
    bool next()
    {
        while (index_getnext_slot(desc, ForwardScanDirection, seen)) {
            bool no_key = false;
            slot_getattr(seen, shape.concurrency_key, &no_key);
            core::Cap cap;
            if (no_key != keyed && eligible(seen, &cap))
                return true;
        }
        return false;
    }
    Op& op;
    bool keyed;
    const Claimable& eligible;
    Datum hash;
    Relation index;
    IndexScanDesc desc = nullptr;
    TupleTableSlot* seen;
};

// A job the claim picked: its version's address, key (copied; (Datum) 0: none) and claim order;
// s: its key's place in the walk (from 1; 0 for a job without a key), rn: its place in its key
// (or among the jobs without a key), from 1.
struct Pick {
    ItemPointerData tid;
    Datum key;
    core::ClaimKey order;
    int s, rn;
};

Pick pick_of(TupleTableSlot* seen, bool keyed, int s, int rn)
{
    bool isnull = false;
    Pick p;
    p.tid = seen->tts_tid;
    p.key = keyed ? datumCopy(slot_getattr(seen, shape.concurrency_key, &isnull), false, -1)
                  : (Datum) 0;
    p.order = {int4_of(seen, kPriority),
               DatumGetTimestampTz(slot_getattr(seen, shape.job[kRunAt], &isnull)),
               int8_of(seen, kJobId), 0};
    p.s = s;
    p.rn = rn;
    return p;
}

bool text_after(Datum a, Datum b)
{
    return DatumGetBool(DirectFunctionCall2Coll(text_gt, DEFAULT_COLLATION_OID, a, b));
}

// The statement's picks for a batch of b, in its order (round, then the key's place in the
// walk; the jobs without a key last), into picks (room for b); returns how many. The walk takes
// the first claimable job of each key in turn, one descent per key: first the keys after last,
// then from the first key up to last (every key when there is no turn), until it has b keys.
// With fewer, each key gives up to b jobs, taken round by round (the statement's rounds), and
// the jobs without a key fill what the keys' jobs leave of the batch.
int pick_in_turn(Op& op, Datum queue, Datum last, int b, const Claimable& eligible, Pick* picks)
{
    Scan keys(op, shape.jobs_keys, queue, true, eligible);
    int k = 0;
    bool wrapped = last == (Datum) 0;
    StrategyNumber strategy = wrapped ? InvalidStrategy : BTGreaterStrategyNumber;
    Datum bound = last;
    while (k < b) {
        keys.start(strategy, bound);
        bool found = keys.next();
        Pick p = found ? pick_of(keys.seen, true, k + 1, 1) : Pick{};
        if (!found || (wrapped && last != (Datum) 0 && text_after(p.key, last))) {
            if (wrapped)
                break;
            wrapped = true;  // the wrap: from the first key
            strategy = InvalidStrategy;
            continue;
        }
        picks[k++] = p;
        strategy = BTGreaterStrategyNumber;
        bound = p.key;
    }
    int n = k;
    if (k > 0 && k < b) {
        // Rounds: up to b jobs of each key, then the first b of them by round and key.
        Pick* all = static_cast<Pick*>(palloc(sizeof(Pick) * k * b));
        n = 0;
        for (int i = 0; i < k; ++i) {
            keys.start(BTEqualStrategyNumber, picks[i].key);
            for (int rn = 1; rn <= b && keys.next(); ++rn)
                all[n++] = pick_of(keys.seen, true, i + 1, rn);
        }
        for (int i = 1; i < n; ++i) {  // by round, stably: within a round, by the key's place
            Pick p = all[i];
            int j = i;
            for (; j > 0 && all[j - 1].rn > p.rn; --j)
                all[j] = all[j - 1];
            all[j] = p;
        }
        for (int i = 0; i < Min(n, b); ++i)
            picks[i] = all[i];
        pfree(all);
    }
    keys.end();
    int taken = Min(n, b);
    if (n < b) {
        // The statement's keyless fill: b less every job its keys gave.
        Scan keyless(op, shape.jobs_claim, queue, false, eligible);
        keyless.start(InvalidStrategy, (Datum) 0);
        for (int rn = 1; taken < b && keyless.next(); ++rn)
            picks[taken++] = pick_of(keyless.seen, false, 0, rn);
        keyless.end();
    }
    return taken;
}

}  // namespace

int claim_in_turn(Op& op, const Access& access, const ClaimCall& call, QueueRow* q, Claimed* out)
{
    Datum queue = call.queue.datum;
    // As the SQL path: the turn, then the queue's row read in a snapshot taken after it (a queue
    // dropped and created again while the claim waited is the new one) and locked, then a
    // snapshot taken after both, in which everything before them is seen: the claims that went
    // before and their turn, a change of the queue's settings or grants. Whatever the SQL
    // statement would find no row for from here (no queue, a paused one, a caller who may no
    // longer work it) claims nothing, as it does; a queue whose settings changed goes to the
    // SQL path, which decides anew.
    take_exclusive_claim_turn(queue);
    fresh_snapshot(op);
    if (!read_queue(op, queue, q))
        return 0;
    TM_Result locked = lock_queue_row(op, *q);
    if (locked == TM_Deleted)
        return 0;
    if (locked != TM_Ok)
        return -1;
    fresh_snapshot(op);
    TimestampTz now = GetCurrentTimestamp();
    if (!read_queue(op, queue, q) || q->paused || !may_work(access, queue, op.snapshot))
        return 0;
    Datum last = (Datum) 0;
    bool turn_found = false;
    ItemPointerData turn_tid;
    ItemPointerSetInvalid(&turn_tid);
    if (!q->turns_only || !read_turn(op, queue, &last, &turn_found, &turn_tid))
        return -1;
    // The statement's plan holds the turn's upsert, which a publication on queue_turns that does
    // not cover its replica identity refuses (42P10) whatever the claim takes: so does this. Not
    // before the queue is known to be round-robin only: a queue changed meanwhile may take
    // another statement, without the upsert.
    Relation turns = table_open(shape.turns, RowExclusiveLock);
    CheckCmdReplicaIdentity(turns, CMD_UPDATE);
    table_close(turns, NoLock);

    Claimable eligible = claimable(call, *q, now);
    Pick* picks = static_cast<Pick*>(palloc(sizeof(Pick) * call.batch));
    int n = pick_in_turn(op, queue, last, call.batch, eligible, picks);
    // A queue with no turn row yet whose claim would write its first turn goes to the SQL path
    // before anything is claimed: the statement's upsert waits for a turn row inserted by hand
    // meanwhile and writes over it, where an insert of ours would raise 23505. A claim of
    // keyless jobs writes no turn and stays here (a queue without keys never has a turn row).
    for (int i = 0; !turn_found && i < n; ++i)
        if (picks[i].key != (Datum) 0)
            return -1;
    // Claimed in claim order (the order claim_job returns them in); the turn is the key of the
    // last pick in the statement's order that was claimed. A pick locked by another (SKIP
    // LOCKED) or no longer claimable is left, as the statement's cohort leaves it.
    core::ClaimKey* order = static_cast<core::ClaimKey*>(palloc(sizeof(core::ClaimKey) * (n + 1)));
    for (int i = 0; i < n; ++i) {
        order[i] = picks[i].order;
        order[i].row = static_cast<uint32>(i);
    }
    core::sort_claim_order(order, n);
    Datum lease = call.no_lease ? q->lease : call.lease;
    Datum expires = DirectFunctionCall2(timestamptz_pl_interval, TimestampTzGetDatum(now), lease);
    int claimed = 0, turn = -1;
    for (int i = 0; i < n; ++i) {
        const Pick& p = picks[order[i].row];
        ItemPointerData tid = p.tid;
        TM_FailureData failure;
        core::Cap cap = {};
        TM_Result r =
            table_tuple_lock(op.rel, &tid, op.snapshot, op.found, op.cid, LockTupleNoKeyExclusive,
                             LockWaitSkip, TUPLE_LOCK_FLAG_FIND_LAST_VERSION, &failure);
        if (r != TM_Ok || !eligible(op.found, &cap))
            continue;
        claim_found(op, call, lease, expires, now, cap, &out[claimed++]);
        if (p.key != (Datum) 0)
            turn = Max(turn, static_cast<int>(order[i].row));
    }
    if (turn >= 0)
        write_turn(op, queue, picks[turn].key, turn_tid);
    pfree(order);
    pfree(picks);
    return claimed;
}

}  // namespace jobcap::direct
