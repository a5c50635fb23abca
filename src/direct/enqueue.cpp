// enqueue on the direct path (direct.hpp): rows built as the SQL path's INSERT builds them and
// inserted as COPY FROM inserts them.
#include "direct/rows.hpp"

namespace jobcap::direct {

int enqueue(const Access& access, Datum queue, const Datum* payloads, int n, const EnqueueValues& v,
            int64* ids, bool* notify)
{
    Op op;
    begin(op, CMD_INSERT);
    QueueRow q;
    if (!read_queue(op, queue, &q) || !may_work(access, queue, op.snapshot)) {
        end(op);
        elog(DEBUG2,
             "jobcap: the enqueue goes to the SQL path: the queue is missing or not the "
             "caller's");
        return -1;
    }
    *notify = q.notify;

    // Every column as the SQL path's INSERT sets it: listed ones from the call, the rest their
    // (constant) defaults.
    TupleDesc desc = RelationGetDescr(op.rel);
    NewRow row = new_row(desc->natts, shape.defaults, shape.default_nulls);
    auto put = [&](JobColumn c, Datum value, bool isnull) {
        row.set(shape.job[c], value, isnull);
    };
    put(kQueue, queue, false);
    put(kRunAt, TimestampTzGetDatum(v.run_at), false);
    put(kPriority, Int32GetDatum(v.priority), false);
    put(kMaxAttempts, Int32GetDatum(v.max_attempts), v.no_max_attempts);
    put(kEnqueuedAt, TimestampTzGetDatum(v.now), false);
    if (v.lists_dedupe_key)
        put(kDedupeKey, (Datum) 0, true);
    // compat(0.2.0): the 0.2.0 schema has neither column (nor a declaration that passes them).
    if (shape.start_by != InvalidAttrNumber)
        row.set(shape.start_by, TimestampTzGetDatum(v.start_by), v.no_start_by);
    if (shape.max_run_time != InvalidAttrNumber)
        row.set(shape.max_run_time, v.max_run_time, v.no_max_run_time);

    // In chunks, as COPY FROM buffers its rows: one heap_multi_insert per chunk (one WAL record
    // per page instead of one per row), then each row's index entries, in payload order.
    constexpr int kChunk = 1000;
    int chunk = Min(n, kChunk);
    TupleTableSlot** slots =
        static_cast<TupleTableSlot**>(palloc(sizeof(TupleTableSlot*) * Max(chunk, 1)));
    for (int i = 0; i < chunk; ++i)
        slots[i] = MakeSingleTupleTableSlot(desc, &TTSOpsHeapTuple);
    MemoryContext rows =
        AllocSetContextCreate(CurrentMemoryContext, "jobcap enqueue rows", ALLOCSET_DEFAULT_SIZES);
    // The rows differ in these columns only (the ones the loop below sets; every other column is
    // set once above or is a constant default): a partial index's predicate that reads none of
    // them (jobs_waiting's, jobs_start_by's, ...) is evaluated for the first row alone. A column
    // set per row below must be listed here; concurrency_key only when the call gives keys (else
    // NULL in every row: jobs_keys' predicate, which fails on it, is evaluated once per call).
    AttrNumber varying[3] = {
        shape.job[kJobId], shape.job[kPayload],
        v.keys == nullptr ? AttrNumber{InvalidAttrNumber} : shape.concurrency_key};
    PredicateMemo memo = predicate_memo(varying, 3);
    for (int first = 0; first < n; first += chunk) {
        int count = Min(chunk, n - first);
        MemoryContext caller = MemoryContextSwitchTo(rows);
        for (int i = 0; i < count; ++i) {
            int64 id = nextval_internal(shape.identity, false);
            ids[first + i] = id;
            put(kJobId, Int64GetDatum(id), false);
            put(kPayload, payloads[first + i], false);
            // compat(0.2.0): no concurrency_key on the 0.2.0 schema (nor a declaration that
            // passes one).
            if (shape.concurrency_key != InvalidAttrNumber)
                row.set(shape.concurrency_key, v.keys == nullptr ? (Datum) 0 : v.keys[first + i],
                        v.keys == nullptr || v.key_nulls[first + i]);
            ExecStoreHeapTuple(heap_form_tuple(desc, row.values, row.nulls), slots[i], true);
        }
        table_multi_insert(op.rel, slots, count, op.cid, 0, nullptr);
        MemoryContextSwitchTo(caller);
        for (int i = 0; i < count; ++i) {
            if (op.opened != nullptr)
                insert_index_entries(op, slots[i], false, &memo);
            else if (op.result->ri_NumIndices > 0)
                jobcap_insert_index_tuples_new(op.result, slots[i], op.estate);
            ResetExprContext(GetPerTupleExprContext(op.estate));
            ExecClearTuple(slots[i]);
        }
        MemoryContextReset(rows);
    }
    MemoryContextDelete(rows);
    bms_free(memo.varying);
    for (int i = 0; i < chunk; ++i)
        ExecDropSingleTupleTableSlot(slots[i]);
    pfree(slots);
    pfree(row.values);
    pfree(row.nulls);
    end(op);
    return n;
}

}  // namespace jobcap::direct
