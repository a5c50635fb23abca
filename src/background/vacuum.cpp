// The reaper's vacuum step: jobcap.jobs vacuumed between autovacuum's visits.
//
// A claim walks the claim index from its queue's first entry, over the entries of every job
// claimed since the table was last vacuumed: they point to dead rows and stay, marked dead,
// until VACUUM removes them and frees their pages. Autovacuum looks at the table once per
// autovacuum_naptime (a minute by default); at thousands of jobs a second the claims of that
// minute walk hundreds of index pages each, and spend most of the server's CPU doing it
// (docs/worker.md, "Vacuuming jobcap.jobs", has the figures). So the worker applies
// autovacuum's own rule for the table (dead rows above autovacuum_vacuum_threshold +
// autovacuum_vacuum_scale_factor x rows, the table's settings first) every cycle, and runs
// VACUUM (SKIP_LOCKED, PARALLEL 0) jobcap.jobs itself when it holds. Its "rows" leave out the
// finished jobs (jobs_finished's reltuples): no claim walks them, and a history kept would
// otherwise put vacuums ever further apart while the claims between them walk ever more
// entries. A vacuum does cost more with a longer history (it reads every index whole), so none
// starts sooner after the last than kVacuumSpacing times that one's duration. Never with
// autovacuum off, for the server or for the table (autovacuum_enabled), or with jobcap.vacuum
// off.
//
// The vacuum behaves like autovacuum's where it could get in the way: it yields to a lock
// request it blocks (the process is flagged as an autovacuum worker while it vacuums, so the
// waiter cancels it after deadlock_timeout), is cancelled after kVacuumTimeoutMs (the worker
// reaps nothing meanwhile), does not truncate the table (an AccessExclusiveLock replayed on
// standbys) and, from PostgreSQL 16, leaves the database's frozen-xid horizon to autovacuum. A
// table locked by someone else is left for a later cycle without a vacuum, or a word. Rows that
// a snapshot still sees stay dead after a vacuum: while the table's xmin horizon stays where it
// was, the next vacuum waits for a threshold of new dead rows beyond those, and a vacuum that
// freed less than half of what it was started for doubles that wait (kVacuumFactorMax); once
// the horizon moves on, the rule is autovacuum's again.
#include "background/vacuum.hpp"

extern "C" {
#include "access/table.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "commands/vacuum.h"
#include "nodes/makefuncs.h"
#include "parser/parse_node.h"
#include "pgstat.h"
#include "postmaster/autovacuum.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "utils/backend_status.h"
#include "utils/fmgrprotos.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/syscache.h"
#include "utils/timeout.h"
}

#include "background/steps.hpp"
#include "jobcap.hpp"

namespace jobcap {
namespace {

constexpr int kVacuumFactorMax = 64;  // vacuums that free little wait for this many times
                                      // autovacuum's threshold of new dead rows, at most

// What the vacuum step remembers between cycles: plain data, one per process.
struct Vacuuming {
    StepState step;
    int64 left;             // dead rows of jobcap.jobs that the worker's last vacuum left
    int factor;             // how many thresholds of new dead rows start the next vacuum
    TransactionId horizon;  // the table's xmin horizon after that vacuum
};
Vacuuming v = {{kBatchMax, 0, 0}, 0, 1, InvalidTransactionId};

struct JobsStats {
    bool enabled;           // autovacuum_enabled for the table
    bool lockable;          // a VACUUM's lock on it is free now
    int64 dead;             // pg_stat_get_dead_tuples
    int64 vacuums;          // pg_stat_get_vacuum_count: manual vacuums of the table so far
    int64 threshold;        // autovacuum's vacuum threshold for the table
    TransactionId horizon;  // GetOldestNonRemovableTransactionId
};
JobsStats jobs_stats;

const StepMessages kVacuuming = {
    "jobcap: vacuuming jobcap.jobs",
    "jobcap reaper could not vacuum jobcap.jobs in database \"%s\", trying again in %ld ms",
    nullptr};

uint64 read_jobs_stats_step(int32)
{
    Oid relid = get_relname_relid("jobs", get_namespace_oid("jobcap", false));
    if (!OidIsValid(relid))
        ereport(ERROR, (errcode(ERRCODE_UNDEFINED_TABLE),
                        errmsg("relation \"jobcap.jobs\" does not exist")));
    Relation rel = table_open(relid, AccessShareLock);
    const auto* options = reinterpret_cast<const StdRdOptions*>(rel->rd_options);
    int base = autovacuum_vac_thresh;
    double scale = autovacuum_vac_scale;
    jobs_stats.enabled = true;
    if (options != nullptr) {
        jobs_stats.enabled = options->autovacuum.enabled;
        if (options->autovacuum.vacuum_threshold >= 0)
            base = options->autovacuum.vacuum_threshold;
        if (options->autovacuum.vacuum_scale_factor >= 0)
            scale = options->autovacuum.vacuum_scale_factor;
    }
    double rows = Max((double) rel->rd_rel->reltuples, 0.0);
    Oid finished = get_relname_relid("jobs_finished", RelationGetNamespace(rel));
    if (OidIsValid(finished)) {
        HeapTuple tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(finished));
        if (HeapTupleIsValid(tuple)) {
            auto index = (Form_pg_class) GETSTRUCT(tuple);
            if (index->relkind == RELKIND_INDEX)
                rows -= Max((double) index->reltuples, 0.0);
            ReleaseSysCache(tuple);
        }
    }
    rows = Max(rows, 0.0);
    jobs_stats.horizon = GetOldestNonRemovableTransactionId(rel);
    table_close(rel, AccessShareLock);
    // VACUUM (SKIP_LOCKED) would skip a locked table with a WARNING; look first.
    jobs_stats.lockable = ConditionalLockRelationOid(relid, ShareUpdateExclusiveLock);
    if (jobs_stats.lockable)
        UnlockRelationOid(relid, ShareUpdateExclusiveLock);
    jobs_stats.threshold = (int64) (base + scale * rows);
    jobs_stats.dead =
        DatumGetInt64(DirectFunctionCall1(pg_stat_get_dead_tuples, ObjectIdGetDatum(relid)));
    jobs_stats.vacuums =
        DatumGetInt64(DirectFunctionCall1(pg_stat_get_vacuum_count, ObjectIdGetDatum(relid)));
    return 1;
}

// Flags this process as an autovacuum worker, or not: a backend that waits for a lock this
// process holds then cancels it after deadlock_timeout (ProcSleep), as it would autovacuum.
void as_autovacuum(bool on)
{
    LWLockAcquire(ProcArrayLock, LW_EXCLUSIVE);
    if (on)
        MyProc->statusFlags |= PROC_IS_AUTOVACUUM;
    else
        MyProc->statusFlags &= ~PROC_IS_AUTOVACUUM;
    ProcGlobal->statusFlags[MyProc->pgxactoff] = MyProc->statusFlags;
    LWLockRelease(ProcArrayLock);
}

DefElem* option(const char* name, Node* value)
{
    return makeDefElem(pstrdup(name), value, -1);
}

// VACUUM (SKIP_LOCKED, PARALLEL 0, TRUNCATE false[, SKIP_DATABASE_STATS]) jobcap.jobs, as a
// top-level statement of this process: VACUUM runs its own transactions. Its memory lives in a
// context of its own under PortalContext, as in an autovacuum worker. Never raises ERROR (see
// in_transaction).
Outcome vacuum_jobs(ErrorData** error)
{
    MemoryContext caller = CurrentMemoryContext;
    MemoryContext portal =
        AllocSetContextCreate(TopMemoryContext, "jobcap vacuum", ALLOCSET_DEFAULT_SIZES);
    MemoryContext saved_portal = PortalContext;
    uint32 holdoff = InterruptHoldoffCount;
    volatile Outcome outcome = Outcome::done;

    *error = nullptr;
    SetCurrentStatementStartTimestamp();
    StartTransactionCommand();
    PG_TRY();
    {
        pgstat_report_activity(STATE_RUNNING, kVacuuming.activity);
        PortalContext = portal;
        MemoryContextSwitchTo(portal);
        VacuumStmt* stmt = makeNode(VacuumStmt);
        stmt->options =
            list_make3(option("skip_locked", nullptr), option("parallel", (Node*) makeInteger(0)),
                       option("truncate", (Node*) makeInteger(0)));
        if (jobcap_vacuum_has_skip_database_stats())
            stmt->options = lappend(stmt->options, option("skip_database_stats", nullptr));
        stmt->rels = list_make1(makeVacuumRelation(
            makeRangeVar(pstrdup("jobcap"), pstrdup("jobs"), -1), InvalidOid, NIL));
        stmt->is_vacuumcmd = true;
        as_autovacuum(true);
        enable_timeout_after(STATEMENT_TIMEOUT, kVacuumTimeoutMs);
        ExecVacuum(make_parsestate(nullptr), stmt, true);
        disable_timeout(STATEMENT_TIMEOUT, false);
        as_autovacuum(false);
        QueryCancelPending = false;  // a waiter's cancel that came as the vacuum ended
        CommitTransactionCommand();
    }
    PG_CATCH();
    {
        disable_timeout(STATEMENT_TIMEOUT, false);
        outcome = rolled_back(caller, holdoff, error);
        as_autovacuum(false);  // after the rollback released the LWLocks
    }
    PG_END_TRY();
    PortalContext = saved_portal;
    MemoryContextSwitchTo(caller);
    MemoryContextDelete(portal);
    return finished(outcome, error);
}

void say_left_locked()
{
    ereport(DEBUG1, (errmsg("jobcap reaper leaves jobcap.jobs in database \"%s\" for a later "
                            "cycle: another session holds a lock that VACUUM needs",
                            reaper_database())));
}

}  // namespace

bool vacuum_if_due()
{
    TimestampTz now = GetCurrentTimestamp();
    if (!guc_vacuum || !AutoVacuumingActive() || waiting(now, v.step.resume_at))
        return true;
    uint64 rows = 0;
    ErrorData* error = nullptr;
    Outcome outcome = in_transaction(kVacuuming.activity, read_jobs_stats_step, 0, &rows, &error);
    if (outcome == Outcome::absent)
        return false;
    if (outcome != Outcome::done) {
        back_off(v.step, kVacuuming.failed, outcome, error);
        return true;
    }
    JobsStats before = jobs_stats;
    // The snapshots that kept rows from the last vacuum may be gone; another vacuum
    // (autovacuum's, a DBA's) may have removed what ours left.
    if (TransactionIdIsValid(v.horizon) && TransactionIdPrecedes(v.horizon, before.horizon)) {
        v.left = 0;
        v.factor = 1;
        v.horizon = InvalidTransactionId;
    }
    v.left = Min(v.left, before.dead);
    int64 wanted = before.dead - v.left;
    if (!before.enabled || wanted <= before.threshold * v.factor)
        return true;
    if (!before.lockable) {
        say_left_locked();
        return true;
    }

    TimestampTz started = GetCurrentTimestamp();
    outcome = vacuum_jobs(&error);
    TimestampTz ended = GetCurrentTimestamp();
    // The wall clock may have stepped during the vacuum; no vacuum lasts longer than its
    // timeout, so neither does the duration that spaces the next one. A cancelled vacuum (its
    // timeout, a lock request it blocked) worked too, and spaces the next one the same way: the
    // step's resume_at holds the spacing as it holds a back-off.
    long spacing_ms =
        kVacuumSpacing * (long) (Min(Max(ended - started, 0), kVacuumTimeoutUs) / 1000);
    if (outcome == Outcome::absent)
        return false;
    if (outcome != Outcome::done) {
        back_off(v.step, kVacuuming.failed, outcome, error, spacing_ms);
        return true;
    }
    long ms = (long) ((ended - started) / 1000);
    v.step.resume_at = ended + (TimestampTz) spacing_ms * 1000;
    outcome = in_transaction(kVacuuming.activity, read_jobs_stats_step, 0, &rows, &error);
    if (outcome == Outcome::absent)
        return false;
    if (outcome != Outcome::done) {
        back_off(v.step, kVacuuming.failed, outcome, error, spacing_ms);
        return true;
    }
    if (jobs_stats.vacuums == before.vacuums) {
        // Skipped after all: the table was locked between the look and the vacuum.
        say_left_locked();
        return true;
    }
    int64 left = jobs_stats.dead;
    bool freed_enough = before.dead - left >= wanted / 2;
    v.factor = freed_enough ? 1 : Min(v.factor * 2, kVacuumFactorMax);
    v.left = left;
    v.horizon = jobs_stats.horizon;
    v.step.failures = 0;
    ereport(DEBUG1,
            (errmsg("jobcap reaper vacuumed jobcap.jobs in database \"%s\" in %ld ms: %lld dead "
                    "rows before, %lld after",
                    reaper_database(), ms, (long long) before.dead, (long long) left),
             freed_enough ? 0
                          : errdetail("Most dead rows are still visible to some snapshot: the "
                                      "next vacuum waits for %lld new dead rows.",
                                      (long long) (before.threshold * v.factor))));
    return true;
}

}  // namespace jobcap
