// The direct path's row primitives (rows.hpp): one call's table, snapshot and indexes (Op); a
// job's row found, locked and re-checked as the statement's EvalPlanQual would; its new version
// written with its index entries; a queue's row and the caller's grant read as the statements
// read them.
#include "direct/rows.hpp"

#include "direct/vet.hpp"

namespace jobcap::direct {
namespace {

// The indexes of jobcap.jobs, each IndexInfo built once (with its predicate's and expressions'
// evaluation states) in a context of its own instead of once per statement, as
// ExecOpenIndices does. Used when every index is a btree with immediate uniqueness and no
// exclusion constraint (jobcap's own are): the direct path then evaluates each predicate first
// and opens and inserts into only the indexes the new version belongs in. Otherwise (an index a
// DBA added of another kind) ExecOpenIndices and ExecInsertIndexTuples do it all, per call.
struct Indexes {
    bool valid;
    bool cached;
    int count;
    Oid oids[kMaxCachedIndexes];
    IndexInfo* infos[kMaxCachedIndexes];
    // The columns each predicate reads (pull_varattnos' numbering; nullptr: no predicate).
    Bitmapset* predicate_reads[kMaxCachedIndexes];
};
Indexes indexes;
MemoryContext index_context = nullptr;

// Learns the indexes of jobs (locked by the caller: the set cannot change before the end of
// the transaction).
void learn_indexes(Relation jobs)
{
    if (index_context == nullptr)
        index_context = AllocSetContextCreate(CacheMemoryContext, "jobcap direct path indexes",
                                              ALLOCSET_SMALL_SIZES);
    else
        MemoryContextReset(index_context);
    indexes.valid = false;
    indexes.count = 0;
    uint64 seen = invalidations;
    List* oids = RelationGetIndexList(jobs);
    bool cached = list_length(oids) <= kMaxCachedIndexes;
    ListCell* lc;
    foreach (lc, oids) {
        if (!cached)
            break;
        Relation index = index_open(lfirst_oid(lc), AccessShareLock);
        MemoryContext caller = MemoryContextSwitchTo(index_context);
        IndexInfo* info = BuildIndexInfo(index);
        // Compiled as the tables' owner, whom the SQL path's statements run as: compiling checks
        // EXECUTE on each function for the current user, and what is compiled here serves every
        // later caller of this backend.
        bool hashed = exprs_are_queue_hash(info->ii_Expressions, shape.job[kQueue]);
        as_owner(jobs->rd_rel->relowner, [&] {
            // Only plain predicates of built-in operators get here (plain_index in learn_shape):
            // compiled as the relcache keeps them (constants folded, operator functions set),
            // with nothing that caches per query (no hashed ScalarArrayOpExpr: the planner's).
            if (info->ii_Predicate != NIL)
                info->ii_PredicateState = ExecInitQual(info->ii_Predicate, nullptr);
            // The claim index's hashtextextended(queue, 0), compiled once as its predicate
            // (FormIndexDatum evaluates it in the call's per-tuple context). Any other
            // expression: see below.
            if (hashed)
                info->ii_ExpressionsState = ExecInitExprList(info->ii_Expressions, nullptr);
        });
        MemoryContextSwitchTo(caller);
        cached = index->rd_rel->relam == BTREE_AM_OID && index->rd_index->indimmediate &&
                 info->ii_ExclusionOps == nullptr && (info->ii_Expressions == NIL || hashed);
        Bitmapset* reads = nullptr;
        if (info->ii_Predicate != NIL) {
            MemoryContext c = MemoryContextSwitchTo(index_context);
            pull_varattnos(reinterpret_cast<Node*>(info->ii_Predicate), 1, &reads);
            MemoryContextSwitchTo(c);
        }
        indexes.predicate_reads[indexes.count] = reads;
        indexes.oids[indexes.count] = RelationGetRelid(index);
        indexes.infos[indexes.count++] = info;
        index_close(index, AccessShareLock);
    }
    list_free(oids);
    indexes.cached = cached;
    // An invalidation that arrived meanwhile: use what was learned now (the table's lock keeps
    // the set of indexes), learn again next time.
    indexes.valid = invalidations == seen;
}

// An equality key on a text column, compared under the index's collation (a btree is ordered
// by it: a key under another collation could descend to the wrong leaf).
void text_key(ScanKey key, Relation index, AttrNumber index_column, Datum value)
{
    ScanKeyEntryInitialize(key, 0, index_column, BTEqualStrategyNumber, InvalidOid,
                           index->rd_indcollation[index_column - 1], F_TEXTEQ, value);
}

// Index i of indexes (cached), opened on first use in this call.
Relation cached_index(Op& op, int i)
{
    if (op.opened[i] == nullptr)
        op.opened[i] = index_open(indexes.oids[i], RowExclusiveLock);
    return op.opened[i];
}

}  // namespace

bool indexes_include(Oid relid)
{
    for (int i = 0; i < indexes.count; ++i)
        if (relid == indexes.oids[i])
            return true;
    return false;
}

void forget_indexes()
{
    indexes.valid = false;
}

Datum queue_hash(Datum queue)
{
    return DirectFunctionCall2Coll(hashtextextended, DEFAULT_COLLATION_OID, queue,
                                   Int64GetDatum(0));
}

void begin(Op& op, CmdType cmd)
{
    CommandCounterIncrement();
    op.snapshot = RegisterSnapshot(GetTransactionSnapshot());
    PushActiveSnapshot(op.snapshot);
    op.cid = GetCurrentCommandId(true);
    op.rel = table_open(shape.jobs, RowExclusiveLock);
    if (cmd != CMD_SELECT)
        CheckCmdReplicaIdentity(op.rel, cmd);
    op.estate = CreateExecutorState();
    op.result = makeNode(ResultRelInfo);
    // No range table entry (index 0): nothing here needs one (no triggers, no permissions
    // checked by the executor, no generated columns).
    InitResultRelInfo(op.result, op.rel, 0, nullptr, 0);
    if (!indexes.valid)
        learn_indexes(op.rel);
    op.opened = nullptr;
    if (indexes.cached)
        op.opened = static_cast<Relation*>(palloc0(sizeof(Relation) * indexes.count));
    else
        ExecOpenIndices(op.result, false);
    op.found = table_slot_create(op.rel, nullptr);
    op.next = MakeSingleTupleTableSlot(RelationGetDescr(op.rel), &TTSOpsHeapTuple);
    int natts = RelationGetDescr(op.rel)->natts;
    op.values = static_cast<Datum*>(palloc0(sizeof(Datum) * natts));
    op.nulls = static_cast<bool*>(palloc0(sizeof(bool) * natts));
    op.replace = static_cast<bool*>(palloc0(sizeof(bool) * natts));
}

void end(Op& op)
{
    pfree(op.values);
    pfree(op.nulls);
    pfree(op.replace);
    ExecDropSingleTupleTableSlot(op.found);
    ExecDropSingleTupleTableSlot(op.next);
    if (op.opened == nullptr) {
        ExecCloseIndices(op.result);
    } else {
        // As ExecCloseIndices: the index locks go, the table's stays.
        for (int i = 0; i < indexes.count; ++i)
            if (op.opened[i] != nullptr)
                index_close(op.opened[i], RowExclusiveLock);
        pfree(op.opened);
    }
    FreeExecutorState(op.estate);
    table_close(op.rel, NoLock);  // the lock is held to the end of the transaction, as UPDATE's
    PopActiveSnapshot();
    UnregisterSnapshot(op.snapshot);
}

void fresh_snapshot(Op& op)
{
    PopActiveSnapshot();
    UnregisterSnapshot(op.snapshot);
    op.snapshot = RegisterSnapshot(GetTransactionSnapshot());
    PushActiveSnapshot(op.snapshot);
}

Relation open_index(Op& op, Oid index)
{
    if (op.opened != nullptr) {
        for (int i = 0; i < indexes.count; ++i)
            if (indexes.oids[i] == index)
                return cached_index(op, i);
    } else {
        for (int i = 0; i < op.result->ri_NumIndices; ++i)
            if (RelationGetRelid(op.result->ri_IndexRelationDescs[i]) == index)
                return op.result->ri_IndexRelationDescs[i];
    }
    elog(ERROR, "jobcap: index %u of jobcap.jobs is not open", index);
}

NewRow new_row(int natts, const Datum* defaults, const bool* default_nulls)
{
    NewRow row = {static_cast<Datum*>(palloc(sizeof(Datum) * natts)),
                  static_cast<bool*>(palloc(sizeof(bool) * natts))};
    memcpy(row.values, defaults, sizeof(Datum) * natts);
    memcpy(row.nulls, default_nulls, sizeof(bool) * natts);
    return row;
}

PredicateMemo predicate_memo(const AttrNumber* varying, int n)
{
    PredicateMemo memo;
    memo.varying = nullptr;
    // A whole-row reference reads every column.
    memo.varying = bms_add_member(memo.varying, 0 - FirstLowInvalidHeapAttributeNumber);
    for (int i = 0; i < n; ++i)
        if (varying[i] != InvalidAttrNumber)
            memo.varying =
                bms_add_member(memo.varying, varying[i] - FirstLowInvalidHeapAttributeNumber);
    for (int i = 0; i < kMaxCachedIndexes; ++i)
        memo.passes[i] = -1;
    return memo;
}

void insert_index_entries(Op& op, TupleTableSlot* slot, bool update, PredicateMemo* memo)
{
    ExprContext* econtext = GetPerTupleExprContext(op.estate);
    econtext->ecxt_scantuple = slot;
    for (int i = 0; i < indexes.count; ++i) {
        IndexInfo* info = indexes.infos[i];
        if (!info->ii_ReadyForInserts)
            continue;
        if (info->ii_Predicate != NIL) {
            bool passes = memo != nullptr && memo->passes[i] >= 0
                              ? memo->passes[i] == 1
                              : ExecQual(info->ii_PredicateState, econtext);
            // Immutable, and reading none of the columns in which the rows differ: the same
            // for every row of the run.
            if (memo != nullptr && memo->passes[i] < 0 &&
                !bms_overlap(indexes.predicate_reads[i], memo->varying))
                memo->passes[i] = passes ? 1 : 0;
            if (!passes)
                continue;
        }
        bool unchanged = update && info->ii_Expressions == NIL;
        for (int k = 0; unchanged && k < info->ii_NumIndexAttrs; ++k) {
            AttrNumber a = info->ii_IndexAttrNumbers[k];
            unchanged = a > 0 && !op.replace[a - 1];
        }
        Datum values[INDEX_MAX_KEYS];
        bool isnull[INDEX_MAX_KEYS];
        FormIndexDatum(info, slot, op.estate, values, isnull);
        index_insert(cached_index(op, i), values, isnull, &slot->tts_tid, op.rel,
                     info->ii_Unique ? UNIQUE_CHECK_YES : UNIQUE_CHECK_NO, unchanged, info);
    }
    ResetExprContext(econtext);
}

bool may_work(const Access& access, Datum queue, Snapshot snapshot)
{
    if (access.privileged)
        return true;
    Relation grants = table_open(shape.grants, AccessShareLock);
    Relation index = index_open(shape.grants_pkey, AccessShareLock);
    ScanKeyData key;
    text_key(&key, index, 1, queue);
    index_close(index, NoLock);
    key.sk_attno = shape.grant_queue;  // systable_beginscan maps table columns to the index's
    SysScanDesc scan = systable_beginscan(grants, shape.grants_pkey, true, snapshot, 1, &key);
    bool may = false;
    for (HeapTuple t; !may && HeapTupleIsValid(t = systable_getnext(scan));) {
        bool isnull = false;
        Datum granted = heap_getattr(t, shape.grant_queue, RelationGetDescr(grants), &isnull);
        if (isnull ||
            !DatumGetBool(DirectFunctionCall2Coll(texteq, DEFAULT_COLLATION_OID, granted, queue)))
            continue;  // as the statements compare it
        Datum grantee = heap_getattr(t, shape.grant_grantee, RelationGetDescr(grants), &isnull);
        if (isnull)
            continue;
        Oid role = get_role_oid(TextDatumGetCString(grantee), true);
        may = OidIsValid(role) && has_privs_of_role(access.caller, role);
    }
    systable_endscan(scan);
    table_close(grants, NoLock);  // as a statement's locks: held to the end of the transaction
    return may;
}

bool read_queue(Op& op, Datum queue, QueueRow* row)
{
    Relation queues = table_open(shape.queues, AccessShareLock);
    Relation index = index_open(shape.queues_pkey, AccessShareLock);
    ScanKeyData key;
    text_key(&key, index, 1, queue);
    index_close(index, NoLock);
    key.sk_attno = shape.queue[kQQueue];
    SysScanDesc scan = systable_beginscan(queues, shape.queues_pkey, true, op.snapshot, 1, &key);
    HeapTuple q = systable_getnext(scan);
    bool found = HeapTupleIsValid(q);
    if (found) {  // the row's own queue, as the statements compare it
        bool isnull = false;
        Datum name = heap_getattr(q, shape.queue[kQQueue], RelationGetDescr(queues), &isnull);
        found = !isnull &&
                DatumGetBool(DirectFunctionCall2Coll(texteq, DEFAULT_COLLATION_OID, name, queue));
    }
    *row = QueueRow{};
    if (found) {
        // Deformed once: the row has nullable columns (max_running, rate_limit, ...), so every
        // attribute after the first NULL would be a walk from the start with heap_getattr.
        TupleDesc desc = RelationGetDescr(queues);
        constexpr int kOnStack = 32;
        Datum stack_values[kOnStack];
        bool stack_nulls[kOnStack];
        bool on_heap = desc->natts > kOnStack;
        Datum* v =
            on_heap ? static_cast<Datum*>(palloc(sizeof(Datum) * desc->natts)) : stack_values;
        bool* n = on_heap ? static_cast<bool*>(palloc(sizeof(bool) * desc->natts)) : stack_nulls;
        heap_deform_tuple(q, desc, v, n);
        auto at = [&](AttrNumber a) {
            return v[a - 1];
        };
        auto null = [&](AttrNumber a) {
            return n[a - 1];
        };
        row->paused = DatumGetBool(at(shape.queue[kQPaused]));
        bool max_running = !null(shape.queue[kQMaxRunning]);
        // compat(0.2.0): no rate_limit, max_running_per_key or fairness on the 0.2.0 schema.
        bool rated = shape.queue_rate_limit != InvalidAttrNumber && !null(shape.queue_rate_limit);
        bool keyed = shape.queue_per_key != InvalidAttrNumber && !null(shape.queue_per_key);
        bool fair = false, round_robin = false;
        if (shape.queue_fairness != InvalidAttrNumber && !null(shape.queue_fairness)) {
            text* t = reinterpret_cast<text*>(pg_detoast_datum_packed(
                reinterpret_cast<varlena*>(DatumGetPointer(at(shape.queue_fairness)))));
            fair = !(VARSIZE_ANY_EXHDR(t) == 4 && memcmp(VARDATA_ANY(t), "fifo", 4) == 0);
            round_robin =
                VARSIZE_ANY_EXHDR(t) == 11 && memcmp(VARDATA_ANY(t), "round_robin", 11) == 0;
        }
        row->tid = q->t_self;
        row->xmin = HeapTupleHeaderGetRawXmin(q->t_data);
        row->limited = max_running || rated || keyed || fair;
        // A per-key limit of 0 is none (as the SQL path reads it); the queue's running jobs
        // bound each key's.
        int32 run_cap = max_running ? DatumGetInt32(at(shape.queue[kQMaxRunning])) : PG_INT32_MAX;
        int32 key_cap = keyed ? DatumGetInt32(at(shape.queue_per_key)) : 0;
        if (key_cap > 0)
            run_cap = Min(run_cap, key_cap);
        row->run_capped = max_running || key_cap > 0;
        row->turns_only = round_robin && !max_running && !rated && key_cap == 0;
        row->run_cap = row->run_capped ? run_cap : 0;
        row->rate_limit = rated ? DatumGetInt32(at(shape.queue_rate_limit)) : 0;
        // A rate limit needs its period, and its window's table as the claims read it.
        bool rate_known = !rated || (row->rate_limit > 0 && OidIsValid(shape.rates) &&
                                     shape.queue_rate_period != InvalidAttrNumber &&
                                     !null(shape.queue_rate_period));
        if (rated && rate_known)
            row->rate_slot_us = core::rate_slot_us(rate_period_usec(at(shape.queue_rate_period)));
        row->shareable = (row->run_capped || rated) && rate_known && !fair;
        row->cap = DatumGetInt32(at(shape.queue[kQMaxAttempts]));
        row->epoch = DatumGetInt64(at(shape.queue[kQCapEpoch]));
        bool nl = null(shape.queue[kQLease]);
        row->lease = nl ? (Datum) 0 : datumCopy(at(shape.queue[kQLease]), false, 16);
        row->notify = DatumGetBool(at(shape.queue[kQNotify]));
        bool nb = null(shape.queue[kQBackoffBase]), nm = null(shape.queue[kQBackoffMax]);
        row->backoff_base = nb ? (Datum) 0 : datumCopy(at(shape.queue[kQBackoffBase]), false, 16);
        row->backoff_max = nm ? (Datum) 0 : datumCopy(at(shape.queue[kQBackoffMax]), false, 16);
        found = !null(shape.queue[kQPaused]) && !null(shape.queue[kQMaxAttempts]) &&
                !null(shape.queue[kQCapEpoch]) && !nl && !null(shape.queue[kQNotify]) && !nb && !nm;
        if (on_heap) {
            pfree(v);
            pfree(n);
        }
    }
    systable_endscan(scan);
    table_close(queues, NoLock);  // as a statement's locks: held to the end of the transaction
    return found;
}

bool lock_current(Op& op, const Access& access, int64 job_id, int64 fence, bool same_queue)
{
    Relation index = open_index(op, shape.jobs_pkey);
    ScanKeyData key;
    ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_INT8EQ, Int64GetDatum(job_id));
    IndexScanDesc scan = jobcap_index_beginscan(op.rel, index, op.snapshot, 1, 0);
    index_rescan(scan, &key, 1, nullptr, 0);
    bool seen = index_getnext_slot(scan, ForwardScanDirection, op.found);
    index_endscan(scan);
    if (!seen || int8_of(op.found, kFence) != fence || state_of(op.found) != shape.running)
        return false;
    bool isnull = false;
    Datum queue = slot_getattr(op.found, shape.job[kQueue], &isnull);
    if (isnull || !may_work(access, queue, op.snapshot))
        return false;
    queue = datumCopy(queue, false, -1);  // the slot's buffer tuple is replaced by the lock

    ItemPointerData tid = op.found->tts_tid;
    TM_FailureData failure;
    TM_Result r =
        table_tuple_lock(op.rel, &tid, op.snapshot, op.found, op.cid, LockTupleNoKeyExclusive,
                         LockWaitBlock, TUPLE_LOCK_FLAG_FIND_LAST_VERSION, &failure);
    if (r != TM_Ok)
        return false;  // deleted meanwhile, or changed by this very command
    if (int8_of(op.found, kFence) != fence || state_of(op.found) != shape.running)
        return false;
    // The statement's grant check is part of its WHERE clause: EvalPlanQual evaluates it on the
    // latest version too, whose queue a DBA may have changed meanwhile. fail_job's statement
    // also joins the queue's row as its scan read it: a job moved to another queue matches none.
    Datum latest = slot_getattr(op.found, shape.job[kQueue], &isnull);
    bool same = !isnull &&
                DatumGetBool(DirectFunctionCall2Coll(texteq, DEFAULT_COLLATION_OID, latest, queue));
    if (same_queue)
        return same;
    return !isnull && (access.privileged || same || may_work(access, latest, op.snapshot));
}

void update(Op& op)
{
    TupleDesc desc = RelationGetDescr(op.rel);
    bool should_free = false;
    HeapTuple old = ExecFetchSlotHeapTuple(op.found, false, &should_free);
    HeapTuple fresh = heap_modify_tuple(old, desc, op.values, op.nulls, op.replace);
    if (should_free)
        heap_freetuple(old);
    ItemPointerData tid = op.found->tts_tid;
    ExecStoreHeapTuple(fresh, op.next, true);
    JobcapUpdateIndexes how;
    simple_table_tuple_update(op.rel, &tid, op.next, op.snapshot, &how);
    // Not HOT: entries for the new version. (With only btrees cached there is no summarizing
    // index: "summarizing only" would insert nothing.)
    if (op.opened != nullptr && jobcap_update_needs_all_indexes(how))
        insert_index_entries(op, op.next, true);
    else if (op.opened == nullptr && jobcap_update_needs_indexes(how) &&
             op.result->ri_NumIndices > 0)
        jobcap_insert_index_tuples(op.result, op.next, op.estate, how);
    memset(op.replace, 0, sizeof(bool) * desc->natts);
}

}  // namespace jobcap::direct
