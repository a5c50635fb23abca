// A rate-limited queue's window on the direct path (rows.hpp): a shared claim reads every row of
// the queue's window in jobcap.queue_rates and charges its slot's own row, which no other claim
// writes while it holds the slot (spi/queue_lock.hpp). The charge is the SQL path's upsert
// (spi/rates.cpp) without the executor: the version read updated, HOT when it fits, or a new
// row inserted with its primary key entry.
#include "direct/rows.hpp"

#include "spi/queue_lock.hpp"

namespace jobcap::direct {

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

}  // namespace jobcap::direct
