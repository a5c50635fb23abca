// A failed attempt's history on the direct path (history.hpp).
#include "direct/history.hpp"

#include "jobcap.hpp"

namespace jobcap::direct {

void add_history(Op& op, Relation errors, const Access& access, const char* kind, Datum error,
                 bool no_error, TimestampTz at)
{
    TupleDesc desc = RelationGetDescr(errors);
    ResultRelInfo* result = makeNode(ResultRelInfo);
    InitResultRelInfo(result, errors, 0, nullptr, 0);
    ExecOpenIndices(result, false);
    int64 job_id = int8_of(op.next, kJobId);
    // DELETE ... WHERE job_id = $job AND seq <= (the seq of the job's row at OFFSET
    // greatest(error_history - 1, 0), newest first): the rows from that position on, newest first.
    int keep = Max(guc_error_history - 1, 0);
    Relation index = index_open(shape.errors_by_job, RowExclusiveLock);
    ScanKeyData key;
    ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_INT8EQ, Int64GetDatum(job_id));
    IndexScanDesc scan = jobcap_index_beginscan(errors, index, op.snapshot, 1, 0);
    index_rescan(scan, &key, 1, nullptr, 0);
    TupleTableSlot* seen = table_slot_create(errors, nullptr);
    int64 bound = 0;  // the subquery's seq: rows of the job up to it go
    for (int position = 0; index_getnext_slot(scan, BackwardScanDirection, seen); ++position) {
        if (position < keep)
            continue;
        bool isnull = false;
        Datum seq = slot_getattr(seen, shape.error[kESeq], &isnull);
        if (position == keep)
            bound = isnull ? 0 : DatumGetInt64(seq);
        ItemPointerData tid = seen->tts_tid;
        TM_FailureData failure;
        TM_Result r = table_tuple_delete(errors, &tid, op.cid, op.snapshot, InvalidSnapshot, true,
                                         &failure, false);
        if (r == TM_Updated) {
            // Changed by another transaction that committed (a DBA editing a row): as the
            // statement's EvalPlanQual, its latest version, locked, goes if it still matches.
            r = table_tuple_lock(errors, &tid, op.snapshot, seen, op.cid, LockTupleExclusive,
                                 LockWaitBlock, TUPLE_LOCK_FLAG_FIND_LAST_VERSION, &failure);
            if (r == TM_Ok) {
                bool n1 = false, n2 = false;
                Datum job = slot_getattr(seen, shape.error[kEJobId], &n1);
                Datum latest = slot_getattr(seen, shape.error[kESeq], &n2);
                if (!n1 && !n2 && DatumGetInt64(job) == job_id && DatumGetInt64(latest) <= bound) {
                    tid = seen->tts_tid;
                    r = table_tuple_delete(errors, &tid, op.cid, op.snapshot, InvalidSnapshot, true,
                                           &failure, false);
                }
            }
        }
        // Anything else: deleted meanwhile (retention, a requeue's cleanup), which the
        // statement's DELETE skips too, or the latest version no longer the job's.
        if (r != TM_Ok && r != TM_Deleted && r != TM_Updated)
            elog(ERROR, "jobcap: history row of job %lld could not be pruned (%d)",
                 static_cast<long long>(job_id), static_cast<int>(r));
    }
    index_endscan(scan);
    ExecDropSingleTupleTableSlot(seen);
    index_close(index, NoLock);

    if (guc_error_history > 0) {
        NewRow row = new_row(desc->natts, shape.error_defaults, shape.error_default_nulls);
        auto put = [&](ErrorColumn c, Datum value, bool isnull) {
            row.set(shape.error[c], value, isnull);
        };
        auto copy = [&](ErrorColumn c, JobColumn from) {
            bool isnull = false;
            put(c, slot_getattr(op.next, shape.job[from], &isnull), isnull);
        };
        put(kESeq, Int64GetDatum(nextval_internal(shape.errors_identity, false)), false);
        copy(kEJobId, kJobId);
        copy(kEQueue, kQueue);
        copy(kEAttempt, kAttempts);
        copy(kEFence, kFence);
        put(kEKind, CStringGetTextDatum(kind), false);
        copy(kEWorker, kWorker);
        put(kEError, error, no_error);
        put(kEAt, TimestampTzGetDatum(at), false);
        TupleTableSlot* slot = MakeSingleTupleTableSlot(desc, &TTSOpsHeapTuple);
        ExecStoreHeapTuple(heap_form_tuple(desc, row.values, row.nulls), slot, true);
        if (desc->constr != nullptr) {
            // NOT NULL and CHECK, as ExecInsert checks them, as the tables' owner (whom the
            // SQL path runs as: a violation's detail shows the row to whoever may read it).
            as_owner(access.owner, [&] { ExecConstraints(result, slot, op.estate); });
        }
        CheckCmdReplicaIdentity(errors, CMD_INSERT);
        simple_table_tuple_insert(errors, slot);
        if (result->ri_NumIndices > 0)
            jobcap_insert_index_tuples_new(result, slot, op.estate);
        ExecDropSingleTupleTableSlot(slot);
    }
    ExecCloseIndices(result);
}

}  // namespace jobcap::direct
