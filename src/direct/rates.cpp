// A rate-limited queue's window on the direct path (rows.hpp): a shared claim reads every row of
// the queue's window in jobcap.queue_rates and charges its slot's own row, which no other claim
// writes while it holds the slot (spi/queue_lock.hpp). The charge is the SQL path's upsert
// (spi/rates.cpp) without the executor: the version read updated, HOT when it fits, or a new
// row inserted with its primary key entry.
//
// A backend that keeps claiming the queue charges its row ahead (core::RateAllowance) and
// makes the claims that follow in the same slot under that charge, with no row read or
// written. What makes the charge usable: it committed (a rolled-back charge is undone, so what
// it allowed is given up with it), and the queue's row is the version it was charged under
// (alter_queue folds the window and may lower the limit; drop_queue deletes the window; both
// write the row). The charge is a shared claim's, at most kSharedClaimBatch, so the shared
// turn's room (spi/queue_lock.hpp) bounds it as before.
#include "direct/rows.hpp"

#include "spi/queue_lock.hpp"

namespace jobcap::direct {
namespace {

core::RateAllowance allowance;
text* allowance_queue = nullptr;  // in TopMemoryContext
ItemPointerData allowance_row;    // the queue's row's version charged under
TransactionId allowance_xmin = InvalidTransactionId;
bool allowance_pending = false;  // charged by the transaction in progress

// No subtransaction callback is needed: every claim refuses to run inside a savepoint or an
// exception block (refuse_claim_in_subtransaction, functions/claim.cpp), so a charge is written
// by the top transaction and undone only with it.
void at_transaction_end(XactEvent event, void*)
{
    if (!allowance_pending)
        return;
    if (event == XACT_EVENT_COMMIT) {
        allowance.usable = allowance.left > 0;
        allowance_pending = false;
    } else if (event == XACT_EVENT_ABORT || event == XACT_EVENT_PREPARE) {
        // Prepared: it commits only with COMMIT PREPARED, perhaps in another session.
        allowance = core::RateAllowance{};
        allowance_pending = false;
    }
}

bool is_allowance_of(Datum queue, const QueueRow& q)
{
    return allowance_queue != nullptr &&
           ItemPointerEquals(&allowance_row, const_cast<ItemPointer>(&q.tid)) &&
           allowance_xmin == q.xmin &&
           DatumGetBool(DirectFunctionCall2Coll(texteq, DEFAULT_COLLATION_OID, queue,
                                                PointerGetDatum(allowance_queue)));
}

// This backend's allowance for queue's row q: a new one (nothing charged, no claims noted) for
// another queue or another version of its row.
core::RateAllowance& allowance_of(Datum queue, const QueueRow& q)
{
    static bool registered = false;
    if (!registered) {
        RegisterXactCallback(at_transaction_end, nullptr);
        registered = true;
    }
    if (is_allowance_of(queue, q))
        return allowance;
    // Nothing kept until the copy is made: an allocation that fails leaves no name freed.
    allowance = core::RateAllowance{};
    if (allowance_queue != nullptr)
        pfree(allowance_queue);
    allowance_queue = nullptr;
    Size size = VARSIZE_ANY(DatumGetPointer(queue));
    allowance_queue = static_cast<text*>(MemoryContextAlloc(TopMemoryContext, size));
    memcpy(allowance_queue, DatumGetPointer(queue), size);
    allowance_row = q.tid;
    allowance_xmin = q.xmin;
    return allowance;
}

// Writes charge's own row of queue's window charged with n claims.
void write_rate_row(Op& op, Datum queue, RateCharge& charge, int n);

}  // namespace

bool rate_allowance_covers(Datum queue, const QueueRow& q, TimestampTz now, int batch)
{
    return is_allowance_of(queue, q) &&
           core::rate_allowance_covers(allowance, q.rate_slot_us, now, batch);
}

void settle_rate_charge(Op& op, Datum queue, const QueueRow& q, TimestampTz now, RateCharge& charge,
                        int claimed, int batch)
{
    core::RateAllowance& a = allowance_of(queue, q);
    if (charge.covered) {
        core::rate_note_claims(a, q.rate_slot_us, now, claimed, true);
        return;
    }
    // Ahead only of a claim that found all it asked for: one that found fewer ran the queue dry.
    int32 charged = claimed == batch ? core::rate_charge_ahead(a, q.rate_slot_us, now, claimed,
                                                               kSharedClaimBatch)
                                     : claimed;
    if (charged > 0 || charge.window.moved)
        write_rate_row(op, queue, charge, charged);
    core::rate_note_claims(a, q.rate_slot_us, now, claimed, false, charged,
                           charge.window.rows[charge.window.own].newest);
    allowance_pending = a.left > 0;
}

int32 read_rate_rows(Op& op, Datum queue, const QueueRow& q, int slot, TimestampTz now,
                     RateCharge* charge)
{
    charge->window = rate_rows(kClaimSlots + 1);
    charge->found = false;
    QueueRows rows;  // the write's lock, held to commit (rows.hpp)
    if (!rows.begin(op, shape.rates, shape.rates_pkey, shape.rate_queue, queue))
        return 0;
    TupleDesc desc = rows.desc;
    HeapTuple t;
    while ((t = rows.next()) != nullptr) {
        bool n1 = false, n2 = false, n3 = false, n4 = false;
        Datum row_slot = heap_getattr(t, shape.rate_slot, desc, &n1);
        Datum slot_us = heap_getattr(t, shape.rate_slot_us, desc, &n2);
        Datum newest = heap_getattr(t, shape.rate_newest, desc, &n3);
        Datum counts = heap_getattr(t, shape.rate_counts, desc, &n4);
        if (n1 || n2 || n3 || n4)
            continue;  // NOT NULL columns (learn_rates)
        bool own = DatumGetInt32(row_slot) == slot;
        if (own) {
            charge->found = true;
            charge->tid = t->t_self;
        }
        add_rate_row(charge->window, own, slot_us, newest, counts, q.rate_slot_us, now);
    }
    rows.end();
    return rate_rows_room(charge->window, q.rate_slot_us, now, q.rate_limit);
}

namespace {

void write_rate_row(Op& op, Datum queue, RateCharge& charge, int n)
{
    core::RateWindow& own = charge.window.rows[charge.window.own];
    core::rate_charge(own, n);
    Datum counts[core::kRateRing];
    for (int s = 0; s < core::kRateRing; ++s)
        counts[s] = Int32GetDatum(own.counts[s]);

    Relation rates = table_open(shape.rates, RowExclusiveLock);
    TupleDesc desc = RelationGetDescr(rates);
    TupleTableSlot* row = table_slot_create(rates, nullptr);
    ExecClearTuple(row);
    for (int a = 0; a < desc->natts; ++a)  // every other column is a dropped one (learn_rates)
        row->tts_isnull[a] = true;
    auto set = [&](AttrNumber a, Datum v) {
        row->tts_values[a - 1] = v;
        row->tts_isnull[a - 1] = false;
    };
    set(shape.rate_queue, queue);
    set(shape.rate_slot, Int32GetDatum(charge.slot));
    set(shape.rate_slot_us, Int64GetDatum(own.slot_us));
    set(shape.rate_newest, Int64GetDatum(own.newest));
    set(shape.rate_counts,
        PointerGetDatum(construct_array(counts, core::kRateRing, INT4OID, 4, true, TYPALIGN_INT)));
    ExecStoreVirtualTuple(row);
    // Only the holder of the slot writes its row (and alter_queue and drop_queue, which take the
    // turn exclusive): the version read is the latest, or the update raises.
    Datum key[2] = {queue, Int32GetDatum(charge.slot)};
    write_plainly(op, rates, shape.rates_pkey, charge.found, charge.tid, row, key, 2);
    ExecDropSingleTupleTableSlot(row);
    table_close(rates, NoLock);
}

}  // namespace

}  // namespace jobcap::direct
