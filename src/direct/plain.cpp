// The tables the claim writes besides jobs (queue_rates, queue_turns), read and written without
// the executor as their statements would (rows.hpp: QueueRows, write_plainly); shape.cpp's
// written_plainly vets that nothing else (a trigger, an index, a rule) would act on a write.
#include "direct/rows.hpp"

namespace jobcap::direct {

bool QueueRows::begin(Op& op, Oid table, Oid pkey, AttrNumber queue_column, Datum queue_name)
{
    rel = table_open(table, RowExclusiveLock);
    Relation index = index_open(pkey, RowExclusiveLock);
    if (!shape.known) {
        index_close(index, NoLock);
        table_close(rel, NoLock);
        return false;
    }
    column = queue_column;
    queue = queue_name;
    ScanKeyData key;  // by the table's column: systable_beginscan maps it to the index's
    ScanKeyEntryInitialize(&key, 0, column, BTEqualStrategyNumber, InvalidOid,
                           index->rd_indcollation[0], F_TEXTEQ, queue);
    index_close(index, NoLock);
    desc = RelationGetDescr(rel);
    scan = systable_beginscan(rel, pkey, true, op.snapshot, 1, &key);
    return true;
}

HeapTuple QueueRows::next()
{
    HeapTuple t;
    while (HeapTupleIsValid(t = systable_getnext(scan))) {
        bool isnull = false;
        Datum name = heap_getattr(t, column, desc, &isnull);
        if (!isnull &&
            DatumGetBool(DirectFunctionCall2Coll(texteq, DEFAULT_COLLATION_OID, name, queue)))
            return t;
    }
    return nullptr;
}

void QueueRows::end()
{
    systable_endscan(scan);
    table_close(rel, NoLock);  // as a statement's locks: held to the end of the transaction
}

void write_plainly(Op& op, Relation rel, Oid pkey, bool found, ItemPointerData tid,
                   TupleTableSlot* row, Datum* key, int nkeys)
{
    // As the SQL path's upsert, INSERT ... ON CONFLICT DO UPDATE, which is checked as an UPDATE
    // even when it inserts: a publication whose column list or row filter does not cover the
    // replica identity refuses it.
    CheckCmdReplicaIdentity(rel, CMD_UPDATE);
    bool indexed = true, insert = !found;
    ItemPointerData at = tid;
    while (!insert) {
        TM_FailureData failure;
        LockTupleMode mode;
        JobcapUpdateIndexes how;
        TM_Result r = table_tuple_update(rel, &at, row, GetCurrentCommandId(true), op.snapshot,
                                         InvalidSnapshot, true, &failure, &mode, &how);
        if (r == TM_Ok) {
            indexed = jobcap_update_needs_indexes(how);
            break;
        }
        if (r == TM_Updated) {
            // Changed by another writer meanwhile (by hand: the caller's turn or slot keeps
            // the claims out): written over its latest version, as the upsert's DO UPDATE would.
            TupleTableSlot* latest = table_slot_create(rel, nullptr);
            r = table_tuple_lock(rel, &at, op.snapshot, latest, GetCurrentCommandId(true),
                                 LockTupleExclusive, LockWaitBlock,
                                 TUPLE_LOCK_FLAG_FIND_LAST_VERSION, &failure);
            at = latest->tts_tid;
            ExecDropSingleTupleTableSlot(latest);
            if (r == TM_Ok)
                continue;
        }
        if (r != TM_Deleted)
            elog(ERROR, "jobcap: could not write a row of %s (%d)", RelationGetRelationName(rel),
                 static_cast<int>(r));
        insert = true;  // deleted meanwhile: inserted anew, as the upsert would
    }
    if (insert)
        simple_table_tuple_insert(rel, row);
    if (indexed) {
        // The primary key, the table's one index (written_plainly): checked as an INSERT's (a
        // row of the same key committed meanwhile, by hand, raises 23505).
        Relation index = index_open(pkey, RowExclusiveLock);
        bool nulls[INDEX_MAX_KEYS];
        for (int i = 0; i < nkeys; ++i)
            nulls[i] = false;  // key columns are NOT NULL (written_plainly)
        IndexInfo* info = BuildIndexInfo(index);
        index_insert(index, key, nulls, &row->tts_tid, rel, UNIQUE_CHECK_YES, !insert, info);
        index_close(index, NoLock);
    }
}

}  // namespace jobcap::direct
