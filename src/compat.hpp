// What differs between the PostgreSQL majors jobcap supports (15, 17 and 18), in one place.
// Included by pg.hpp after PostgreSQL's headers; code elsewhere never tests PG_VERSION_NUM
// (test/unit/source_rules.py checks it): each difference gets a shim here (a macro or an inline
// function named for what it does), not an #if at the call site.
#pragma once

#if PG_VERSION_NUM < 150000
#error "jobcap supports PostgreSQL 15, 17 and 18"
#endif

// PostgreSQL 16 added VACUUM's SKIP_DATABASE_STATS option: the reaper's vacuum then leaves the
// database's frozen-xid horizon to autovacuum (src/background/vacuum.cpp).
constexpr bool jobcap_vacuum_has_skip_database_stats()
{
    return PG_VERSION_NUM >= 160000;
}

// The direct path (src/direct/). Needs executor/executor.h, access/genam.h and
// access/tableam.h included first.
#ifdef JOBCAP_DIRECT_PATH
// How an update's index entries must be inserted: PostgreSQL 16 turned simple_table_tuple_update's
// bool into TU_UpdateIndexes (none, all, or only the summarizing indexes such as BRIN), and gave
// ExecInsertIndexTuples an onlySummarizing argument.
#if PG_VERSION_NUM >= 160000
using JobcapUpdateIndexes = TU_UpdateIndexes;
inline bool jobcap_update_needs_indexes(JobcapUpdateIndexes u)
{
    return u != TU_None;
}
inline bool jobcap_update_needs_all_indexes(JobcapUpdateIndexes u)
{
    return u == TU_All;
}
inline void jobcap_insert_index_tuples(ResultRelInfo* result, TupleTableSlot* slot, EState* estate,
                                       JobcapUpdateIndexes u)
{
    list_free(ExecInsertIndexTuples(result, slot, estate, true, false, nullptr, NIL,
                                    u == TU_Summarizing));
}
// A new row's entries in every index (ExecInsert's call).
inline void jobcap_insert_index_tuples_new(ResultRelInfo* result, TupleTableSlot* slot,
                                           EState* estate)
{
    list_free(ExecInsertIndexTuples(result, slot, estate, false, false, nullptr, NIL, false));
}
#else
using JobcapUpdateIndexes = bool;
inline bool jobcap_update_needs_indexes(JobcapUpdateIndexes u)
{
    return u;
}
inline bool jobcap_update_needs_all_indexes(JobcapUpdateIndexes u)
{
    return u;
}
inline void jobcap_insert_index_tuples(ResultRelInfo* result, TupleTableSlot* slot, EState* estate,
                                       JobcapUpdateIndexes)
{
    list_free(ExecInsertIndexTuples(result, slot, estate, true, false, nullptr, NIL));
}
inline void jobcap_insert_index_tuples_new(ResultRelInfo* result, TupleTableSlot* slot,
                                           EState* estate)
{
    list_free(ExecInsertIndexTuples(result, slot, estate, false, false, nullptr, NIL));
}
#endif

// expression_tree_walker's callback: an unprototyped function pointer before PostgreSQL 16
// (C++ needs the cast), a typed one (tree_walker_callback, cast by the macro) since.
#if PG_VERSION_NUM >= 160000
#define JOBCAP_TREE_WALKER(fn) (fn)
#else
#define JOBCAP_TREE_WALKER(fn) reinterpret_cast<bool (*)()>(reinterpret_cast<void (*)(void)>(fn))
#endif

// PostgreSQL 18 has virtual generated columns (whose NOT NULL the executor checks on write).
inline bool jobcap_has_generated_virtual([[maybe_unused]] const TupleConstr* constr)
{
#if PG_VERSION_NUM >= 180000
    return constr->has_generated_virtual;
#else
    return false;
#endif
}

// PostgreSQL 18 has NOT NULL constraints added NOT VALID: rows may hold NULL in a column whose
// attnotnull is set, and the executor refuses every new version that keeps the NULL (23502).
inline bool jobcap_has_unvalidated_not_null([[maybe_unused]] TupleDesc desc)
{
#if PG_VERSION_NUM >= 180000
    for (int i = 0; i < desc->natts; ++i) {
        Form_pg_attribute a = TupleDescAttr(desc, i);
        if (a->attnotnull && !a->attisdropped &&
            TupleDescCompactAttr(desc, i)->attnullability != ATTNULLABLE_VALID)
            return true;
    }
#endif
    return false;
}

// PostgreSQL 18 gave index_beginscan an instrumentation argument (NULL: none).
inline IndexScanDesc jobcap_index_beginscan(Relation heap, Relation index, Snapshot snapshot,
                                            int nkeys, int norderbys)
{
#if PG_VERSION_NUM >= 180000
    return index_beginscan(heap, index, snapshot, nullptr, nkeys, norderbys);
#else
    return index_beginscan(heap, index, snapshot, nkeys, norderbys);
#endif
}
#endif
