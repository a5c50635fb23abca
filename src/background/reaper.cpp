// The reaper ("jobcap reaper"): one background worker per database that jobcap.database selects,
// started by the launcher (launcher.cpp). Every jobcap.reap_interval it runs the same reaper as
// reap_jobs() (housekeeping/reap.hpp) in bounded batches, counts the jobs that finished (the
// call of refresh_stats, housekeeping/stats.hpp; at most once a second), counts the attempts of
// rolled-back claims (housekeeping/rollbacks.hpp), enqueues the due slots of periodic jobs
// (housekeeping/schedules.hpp), prunes finished jobs past their retention once they are
// counted, vacuums jobcap.jobs when autovacuum's threshold for it is crossed (vacuum.cpp), and
// every jobcap.report_interval logs one line per queue that got worse, from the same figures as
// jobcap.queue_stats (collect_stats).
//
// Shaped like PostgreSQL's src/test/modules/worker_spi: signal handlers only set flags and the
// latch; each batch is its own short transaction (steps.hpp), so no snapshot outlives a batch;
// lock_timeout is set for the session. A batch that times out is rolled back, the batch shrinks
// and the step backs off; any other error is logged and retried the same way, never
// crash-looped.
//
// Like every frame that calls PostgreSQL, this file holds plain data only (src/boundary.hpp):
// ereport is a longjmp. Nothing here can throw a C++ exception: the one pure-C++ call, the report
// wording (src/core/report.cpp), only formats into a caller's buffer.
#include "pg.hpp"

extern "C" {
#include "access/xlog.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lock.h"
#include "executor/spi.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
}

#include "background/shards.hpp"
#include "background/steps.hpp"
#include "background/vacuum.hpp"
#include "background/worker.hpp"
#include "core/report.hpp"
#include "core/rules.hpp"
#include "housekeeping/reap.hpp"
#include "housekeeping/rollbacks.hpp"
#include "housekeeping/schedules.hpp"
#include "housekeeping/stats.hpp"
#include "jobcap.hpp"
#include "spi/history.hpp"
#include "spi/citus.hpp"
#include "spi/plans.hpp"
#include "spi/schema.hpp"

extern "C" PGDLLEXPORT void jobcap_reaper_main(Datum main_arg);

namespace jobcap {
namespace {

// Fixed limits (documented in docs/worker.md); the batch sizes and the longest back-off are in
// steps.hpp, the vacuum's in vacuum.hpp.
constexpr int kBatchesPerCycle = 50;        // a cycle stops after this many full batches
constexpr const char* kLockTimeout = "1s";  // per lock wait, for the whole session
constexpr int64 kAbsentGraceMs = 1000;      // with '*', how long a new reaper looks for the
                                            // extension (a CREATE EXTENSION that woke the
                                            // launcher may not have committed yet)
constexpr long kAbsentPollMs = 100;
constexpr int64 kCountEveryUs = 1000000;  // counts of finished jobs: at most once a second
constexpr int kRolledBackPerTake = 64;    // rolled-back claims taken from the ring at a time
constexpr int kRolledBackTries = 3;       // failed transactions before one is given up
// The session lock a reaper holds on its database: an advisory lock tag ('jobc', 'reap') with
// objsubid 3. SQL's advisory-lock functions only make tags with objsubid 1 or 2, so no session
// can take this one and silently stop the reaper; pg_locks shows it as an advisory lock.
constexpr uint32 kLockKey1 = 1785684579;  // 'jobc'
constexpr uint32 kLockKey2 = 1919246704;  // 'reap'
constexpr uint16 kLockSubId = 3;

// Retention: finished jobs older than $1 (a timestamptz cut) go, oldest first, at most $2 per
// transaction, with their error history, but never one that refresh_stats has not counted yet.
// Locked rows are skipped (a requeue in flight wins); the DELETE repeats the guard.
// The ORDER BY is jobs_finished's key, so walking that index is the only cheap plan: without
// it the planner, not knowing the cut (LEAST of $1 and the InitPlan), guesses a third of the
// finished jobs due and picks a sequential scan that would meet $2 of them early; in the usual
// cycle none is due, so that scan reads the whole table every cycle and holds back the xmin
// horizon meanwhile (claims cannot mark claimed entries dead, nor vacuum remove them).
// The DELETE's guard sits inside IS TRUE (as in the reaper's UPDATE), so that it reaches the
// doomed rows by primary key only: as an index condition on jobs_finished, with statistics that
// saw none due (retention lowered, a worker that was down), every batch would read the whole
// due range of that index.
// DELETE_DOOMED: JOBCAP_DELETE_DOOMED_WITH_EDGES (0.3.0: a job's edges go with it), or
// JOBCAP_DELETE_DOOMED (compat(0.2.0)).
#define PRUNE(STATES, DELETE_DOOMED)                                                               \
    "WITH doomed AS MATERIALIZED ("                                                                \
    "  SELECT j.job_id FROM jobcap.jobs j"                                                         \
    "   WHERE j.state IN (" STATES                                                                 \
    ")"                                                                                            \
    "     AND j.finished_at < least($1, (SELECT s.counted_until FROM jobcap.stats_progress s))"    \
    "   ORDER BY j.state, j.finished_at LIMIT $2 FOR UPDATE OF j SKIP "                            \
    "LOCKED)," DELETE_DOOMED("     AND (j.state IN (" STATES                                       \
                             ") AND j.finished_at < $1) IS TRUE") " SELECT count(*) FROM gone"

JOBCAP_STATEMENT(prune_succeeded, PRUNE("'succeeded'", JOBCAP_DELETE_DOOMED_WITH_EDGES),
                 {TIMESTAMPTZOID, INT4OID});
JOBCAP_STATEMENT(prune_dead, PRUNE("'dead', 'cancelled'", JOBCAP_DELETE_DOOMED_WITH_EDGES),
                 {TIMESTAMPTZOID, INT4OID});
// compat(0.2.0): the two on the 0.2.0 schema, which has no edges.
JOBCAP_STATEMENT(prune_succeeded_0_2, PRUNE("'succeeded'", JOBCAP_DELETE_DOOMED),
                 {TIMESTAMPTZOID, INT4OID});
JOBCAP_STATEMENT(prune_dead_0_2, PRUNE("'dead', 'cancelled'", JOBCAP_DELETE_DOOMED),
                 {TIMESTAMPTZOID, INT4OID});

// What the worker remembers of a queue between reports: its due backlog.
struct QueueMemory {
    char queue[core::kMaxQueueName + 1];
    int64 due;
};

// The worker's state: plain data, one per process (the vacuum step's is in vacuum.cpp).
struct Worker {
    char database[NAMEDATALEN];
    StepState reaping, counting, pruning_succeeded, pruning_dead, counting_rollbacks, scheduling;
    bool extension_known;  // has the worker looked yet?
    bool extension_present;
    TimestampTz window_start;  // where the next report window starts
    TimestampTz next_report;
    TimestampTz next_count;  // when finished jobs may be counted again
    QueueMemory* queues;     // in TopMemoryContext
    int nqueues;
    bool locked;        // holds the reaper lock: the one reaper of this database
    bool said_waiting;  // logged, once, that another reaper holds it
    TimestampTz started_at;
};
Worker w;

uint64 reap_on_tables(int32 batch)
{
    return reap(batch, nullptr, nullptr);
}

uint64 reap_step(int32 batch)
{
    return on_local_shards(reap_on_tables, batch);
}

// Enqueues due slots of periodic jobs (housekeeping/schedules.hpp); a batch counts the schedules
// handled, so a short batch ends the step.
uint64 schedule_step(int32 batch)
{
    uint64 handled = 0;
    run_due_schedules(GetCurrentStatementStartTimestamp(), batch, &handled);
    return handled;
}

uint64 prune_step(Statement& statement, int retention_s, int32 batch)
{
    TimestampTz cut = GetCurrentStatementStartTimestamp() - (int64) retention_s * USECS_PER_SEC;
    Params p;
    p.add(TimestampTzGetDatum(cut)).add(Int32GetDatum(batch));
    execute(statement, p, SPI_OK_SELECT);
    return (uint64) DatumGetInt64(result_column(0, 1));
}

// compat(0.2.0): the 0.2.0 schema's prunes, without edges.
uint64 prune_succeeded_on_tables(int32 batch)
{
    return prune_step(workflows_schema_exists() ? prune_succeeded : prune_succeeded_0_2,
                      guc_succeeded_retention_s, batch);
}

uint64 prune_succeeded_step(int32 batch)
{
    return on_local_shards(prune_succeeded_on_tables, batch);
}

uint64 prune_dead_on_tables(int32 batch)
{
    // compat(0.2.0): as above.
    return prune_step(workflows_schema_exists() ? prune_dead : prune_dead_0_2, guc_dead_retention_s,
                      batch);
}

uint64 prune_dead_step(int32 batch)
{
    return on_local_shards(prune_dead_on_tables, batch);
}

int64 due_before(const char* queue)
{
    for (int i = 0; i < w.nqueues; ++i)
        if (strcmp(w.queues[i].queue, queue) == 0)
            return w.queues[i].due;
    return -1;
}

// Counts finished jobs: the same call as jobcap.refresh_stats(). Another counter at work
// (a scheduled refresh_stats) makes it a short batch: nothing to do now.
uint64 count_step(int32 batch)
{
    int64 counted = refresh_counts(batch);
    return counted < 0 ? 0 : (uint64) counted;
}

// One report: a line per queue that got worse over (window_start, horizon]. The window ends
// where no transaction still running can write into it (settled_horizon), so a slow
// transaction's deaths are counted by the next report, never lost or counted twice.
uint64 report_step(int32)
{
    StatsWindow sw = {};
    sw.now = GetCurrentStatementStartTimestamp();
    sw.since = w.window_start;
    sw.until = settled_horizon(sw.now, w.window_start);
    QueueStats* stats = nullptr;
    uint64 rows = collect_stats(sw, &stats);

    QueueMemory* seen = static_cast<QueueMemory*>(palloc0(sizeof(QueueMemory) * (rows + 1)));
    for (uint64 r = 0; r < rows; ++r) {
        const QueueStats& s = stats[r];
        core::QueueWindow qw;
        qw.new_dead = s.new_dead;
        qw.dead = s.dead;
        qw.lease_jobs = s.crashed_jobs;
        qw.lease_attempts = s.lost_leases;
        qw.failing_jobs = s.failing_jobs;
        qw.failed_attempts = s.failed_attempts;
        qw.due = s.pending;
        qw.due_before = due_before(s.queue);
        qw.oldest_due_sec = s.has_oldest ? (int64) s.oldest_pending_sec : 0;
        qw.window_sec = guc_report_interval_s;

        char line[512];
        if (core::report_line(qw, line, sizeof line))
            ereport(LOG, (errmsg("jobcap queue \"%s\" in database \"%s\": %s", s.queue, w.database,
                                 line)));
        strlcpy(seen[r].queue, s.queue, sizeof seen[r].queue);
        seen[r].due = qw.due;
    }

    // Nothing below can fail: swap in what this report saw.
    QueueMemory* kept = static_cast<QueueMemory*>(
        MemoryContextAlloc(TopMemoryContext, sizeof(QueueMemory) * (rows + 1)));
    memcpy(kept, seen, sizeof(QueueMemory) * (rows + 1));
    if (w.queues != nullptr)
        pfree(w.queues);
    w.queues = kept;
    w.nqueues = (int) rows;
    w.window_start = sw.until;
    return rows;
}

const StepMessages kReaping = {
    "jobcap: reaping expired leases",
    "jobcap reaper could not reap jobs in database \"%s\", retrying in %ld ms with batches of %d",
    "jobcap reaper reaped %llu jobs in database \"%s\" (batch of %d)"};
const StepMessages kCounting = {
    "jobcap: counting finished jobs",
    "jobcap reaper could not count finished jobs in database \"%s\", retrying in %ld ms with "
    "batches of %d",
    "jobcap reaper counted %llu finished jobs in database \"%s\" (batch of %d)"};
const StepMessages kPruningSucceeded = {
    "jobcap: pruning succeeded jobs",
    "jobcap reaper could not prune succeeded jobs in database \"%s\", retrying in %ld ms with "
    "batches of %d",
    "jobcap reaper pruned %llu succeeded jobs in database \"%s\" (batch of %d)"};
const StepMessages kCountingRollbacks = {
    "jobcap: counting rolled-back claims",
    "jobcap reaper could not count a rolled-back claim in database \"%s\", retrying in %ld ms",
    "jobcap reaper counted %llu rolled-back claims in database \"%s\""};
const StepMessages kPruningDead = {
    "jobcap: pruning dead and cancelled jobs",
    "jobcap reaper could not prune dead jobs in database \"%s\", retrying in %ld ms with "
    "batches of %d",
    "jobcap reaper pruned %llu dead or cancelled jobs in database \"%s\" (batch of %d)"};
const StepMessages kScheduling = {
    "jobcap: enqueueing scheduled jobs",
    "jobcap reaper could not enqueue scheduled jobs in database \"%s\", retrying in %ld ms with "
    "batches of %d",
    "jobcap reaper handled %llu schedule slots in database \"%s\" (batch of %d)"};

// Rolled-back claims (housekeeping/rollbacks.hpp) taken from the shared ring (marked as ours, still
// in it, so claims keep skipping their jobs) and not counted yet: given back to the ring if the
// reaper exits before counting them.
struct TakenClaims {
    RolledBackClaim items[kRolledBackPerTake];
    int next;  // the one being counted
    int count;
};
TakenClaims taken;

void give_back_taken(int, Datum)
{
    give_back_rolled_back(&taken.items[taken.next], taken.count - taken.next);
    taken.count = taken.next = 0;
}

// A rolled-back claim whose shard moved to another node after the rollback (a shard move waits
// for the claim's transaction, and this count for the move): counted there, by a call of
// jobcap.count_rolled_back_claim that Citus delegates to the node holding the fence's shard. A
// statement of its own with constant arguments, as Citus's delegation needs.
bool count_elsewhere(const RolledBackClaim& claim)
{
    char* sql = psprintf("SELECT jobcap.count_rolled_back_claim(%lld, %lld, %s)",
                         static_cast<long long>(claim.job_id), static_cast<long long>(claim.fence),
                         quote_literal_cstr(claim.worker));
    int rc = SPI_execute(sql, false, 1);
    if (rc != SPI_OK_SELECT || SPI_processed != 1)
        elog(ERROR, "jobcap: counting a rolled-back claim on its shard's node failed: %s",
             SPI_result_code_string(rc));
    bool null = false;
    Datum counted = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &null);
    return !null && DatumGetBool(counted);
}

uint64 rolled_back_step(int32)
{
    const RolledBackClaim& claim = taken.items[taken.next];
    bool dead = false;
    bool counted;
    if (!citus::loaded() || !citus::distributed())
        counted = count_rolled_back(claim, &dead);
    else if (citus::route_fence_local(claim.fence))  // in the shard of its fence, on this node
        counted = count_rolled_back(claim, &dead);
    else
        counted = count_elsewhere(claim);
    citus::unroute();
    if (!counted) {
        // compat(0.1.0): a database at 0.1.0 does not count them.
        ereport(DEBUG1,
                (errmsg("jobcap reaper did not count the rolled-back claim of job %lld "
                        "(fence %lld): the job has moved on, or the database is at jobcap 0.1.0",
                        (long long) claim.job_id, (long long) claim.fence)));
        return 0;
    }
    return 1;
}

// Counts this database's rolled-back claims, each in a transaction of its own. A claim whose
// transaction fails is given back to the ring and tried again after a back-off, at most
// kRolledBackTries times. Nothing between a count's commit and its removal from the ring
// processes interrupts, so an exit never counts one twice; one that interrupts a count rolls
// it back and gives the claim back (give_back_taken).
void count_rollbacks()
{
    if (waiting(GetCurrentTimestamp(), w.counting_rollbacks.resume_at))
        return;
    for (int turn = 0; turn < kBatchesPerCycle; ++turn) {
        taken.next = 0;
        taken.count = take_rolled_back(taken.items, kRolledBackPerTake);
        if (taken.count == 0)
            break;
        uint64 counted = 0;
        while (taken.next < taken.count) {
            uint64 rows = 0;
            ErrorData* error = nullptr;
            Outcome outcome =
                in_transaction(kCountingRollbacks.activity, rolled_back_step, 0, &rows, &error);
            if (outcome == Outcome::absent) {
                // No extension, no job to count: the claims go with it.
                finish_rolled_back(taken.items, taken.count);
                taken.count = taken.next = 0;
                return;
            }
            if (outcome != Outcome::done) {
                RolledBackClaim& claim = taken.items[taken.next];
                if (++claim.tries >= kRolledBackTries) {
                    ereport(LOG, (errmsg("jobcap reaper gives up counting the rolled-back claim "
                                         "of job %lld in database \"%s\"",
                                         (long long) claim.job_id, w.database),
                                  errdetail("It failed %d times.", kRolledBackTries)));
                    finish_rolled_back(&claim, 1);
                    taken.next++;
                }
                give_back_taken(0, 0);
                back_off(w.counting_rollbacks, kCountingRollbacks.failed, outcome, error);
                return;
            }
            // Counted (or moved on): out of the ring, so claims no longer skip the job.
            finish_rolled_back(&taken.items[taken.next], 1);
            counted += rows;
            taken.next++;
        }
        taken.count = taken.next = 0;
        if (counted > 0)
            ereport(DEBUG1,
                    (errmsg(kCountingRollbacks.done, (unsigned long long) counted, w.database)));
        CHECK_FOR_INTERRUPTS();
    }
    w.counting_rollbacks.failures = 0;
}

// Rolled-back claims the ring could not keep; whichever reaper sees them first says so.
void report_lost_rollbacks()
{
    uint64 lost = rolled_back_lost_unreported();
    if (lost > 0)
        ereport(LOG, (errmsg("jobcap lost %llu rolled-back claims without counting their attempts",
                             (unsigned long long) lost),
                      errdetail("The shared queue of rolled-back claims was full: claims roll "
                                "back faster than the reapers count them."),
                      errhint("Make sure a jobcap reaper serves every database where claims "
                              "roll back, and commit claims before the work starts.")));
}

long extension_absent()
{
    // With '*' a database without jobcap keeps no process: the launcher looks again later. (The
    // launcher takes a reaper that stops this soon for one that found nothing to do.)
    if (all_databases()) {
        if (!w.extension_known && GetCurrentTimestamp() - w.started_at < kAbsentGraceMs * 1000)
            return kAbsentPollMs;
        ereport(DEBUG1, (errmsg("jobcap reaper leaves database \"%s\": no extension \"jobcap\"",
                                w.database)));
        proc_exit(0);
    }
    if (!w.extension_known || w.extension_present)
        ereport(LOG, (errmsg("jobcap reaper is waiting for extension \"jobcap\" in database \"%s\"",
                             w.database),
                      errhint("Run CREATE EXTENSION jobcap in database \"%s\"; the worker checks "
                              "again every jobcap.reap_interval.",
                              w.database)));
    w.extension_known = true;
    w.extension_present = false;
    return reap_interval_ms();
}

void extension_found()
{
    if (w.extension_known && w.extension_present)
        return;
    ereport(LOG, (errmsg("jobcap reaper is serving database \"%s\"", w.database)));
    w.extension_known = true;
    w.extension_present = true;
    w.window_start = GetCurrentTimestamp();
    w.next_report = w.window_start + (int64) guc_report_interval_s * USECS_PER_SEC;
}

// Runs step in batches until a batch comes back short or the cycle's budget is spent, unless
// the step is backing off; `verb` and `noun` say what a batch did, in a DEBUG1 line per batch.
// Returns false when the extension is not installed (the caller stops the cycle).
bool in_batches(StepState& state, const StepMessages& says, Step step)
{
    if (waiting(GetCurrentTimestamp(), state.resume_at))
        return true;
    for (int i = 0; i < kBatchesPerCycle; ++i) {
        uint64 rows = 0;
        ErrorData* error = nullptr;
        Outcome outcome = in_transaction(says.activity, step, state.batch, &rows, &error);
        if (outcome == Outcome::absent)
            return false;
        if (outcome != Outcome::done) {
            back_off(state, says.failed, outcome, error);
            return true;
        }
        extension_found();
        if (rows > 0)
            ereport(DEBUG1,
                    (errmsg(says.done, (unsigned long long) rows, w.database, state.batch)));
        if (rows < (uint64) state.batch)
            break;
        CHECK_FOR_INTERRUPTS();
    }
    state.failures = 0;
    state.batch = Min(state.batch * 2, kBatchMax);
    return true;
}

// One cycle: reap, schedule, count, prune, vacuum, maybe report, each step backing off on its
// own. Returns how long to wait before the next.
long cycle()
{
    if (RecoveryInProgress())
        return reap_interval_ms();

    report_lost_rollbacks();
    count_rollbacks();
    if (!in_batches(w.reaping, kReaping, reap_step))
        return extension_absent();
    if (!in_batches(w.scheduling, kScheduling, schedule_step))
        return extension_absent();
    // Counting comes before pruning: retention deletes only jobs already counted.
    TimestampTz started = GetCurrentTimestamp();
    if (started >= w.next_count) {
        if (!in_batches(w.counting, kCounting, count_step))
            return extension_absent();
        w.next_count = started + kCountEveryUs;
    }
    if (guc_succeeded_retention_s > 0 &&
        !in_batches(w.pruning_succeeded, kPruningSucceeded, prune_succeeded_step))
        return extension_absent();
    if (guc_dead_retention_s > 0 && !in_batches(w.pruning_dead, kPruningDead, prune_dead_step))
        return extension_absent();
    // After the prunes, whose deletes count as dead rows too.
    if (!vacuum_if_due())
        return extension_absent();

    TimestampTz now = GetCurrentTimestamp();
    TimestampTz interval = (int64) guc_report_interval_s * USECS_PER_SEC;
    if (w.next_report > now + interval)  // report_interval was lowered
        w.next_report = now + interval;
    if (now >= w.next_report) {
        uint64 rows = 0;
        ErrorData* error = nullptr;
        Outcome outcome = in_transaction("jobcap: reporting", report_step, 0, &rows, &error);
        if (outcome == Outcome::absent)
            return extension_absent();
        // A report that fails waits for the next report_interval (its window then covers both);
        // reaping, counting and pruning do not wait for it.
        if (outcome != Outcome::done) {
            ereport(LOG, (errcode(error->sqlerrcode),
                          errmsg("jobcap reaper could not report in database \"%s\"; the next "
                                 "report, in %d s, covers this window too",
                                 w.database, guc_report_interval_s),
                          errdetail("%s", error->message)));
            FreeErrorData(error);
        }
        w.next_report = now + interval;
    }
    return reap_interval_ms();
}

// Takes the database's reaper lock (a session lock, kept until the reaper exits) without
// waiting; false when another reaper holds it (one left behind by a launcher that restarted,
// leaving at its next cycle).
bool take_lock()
{
    LOCKTAG tag;
    SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, kLockKey1, kLockKey2, kLockSubId);
    return LockAcquire(&tag, ExclusiveLock, true, true) != LOCKACQUIRE_NOT_AVAIL;
}

// The launcher that started this reaper has exited (a new one starts its own reapers).
bool launcher_gone()
{
    pid_t launcher = MyBgworkerEntry->bgw_notify_pid;
    return launcher != 0 && kill(launcher, 0) != 0 && errno == ESRCH;
}

}  // namespace

const char* reaper_database()
{
    return w.database;
}

}  // namespace jobcap

using namespace jobcap;

extern "C" void jobcap_reaper_main(Datum main_arg)
{
    pqsignal(SIGHUP, SignalHandlerForConfigReload);
    pqsignal(SIGTERM, die);
    BackgroundWorkerUnblockSignals();

    strlcpy(w.database, MyBgworkerEntry->bgw_extra, sizeof w.database);
    w.reaping = w.counting = w.pruning_succeeded = w.pruning_dead = w.counting_rollbacks =
        w.scheduling = StepState{kBatchMax, 0, 0};
    w.started_at = GetCurrentTimestamp();
    BackgroundWorkerInitializeConnectionByOid(DatumGetObjectId(main_arg), InvalidOid, 0);

    // The same search path as every jobcap SQL function; waits for locks are bounded; the
    // reaper's SKIP LOCKED statements are written for READ COMMITTED, whatever the server's
    // default, and they write.
    SetConfigOption("search_path", "pg_catalog, jobcap, pg_temp", PGC_SUSET, PGC_S_OVERRIDE);
    SetConfigOption("lock_timeout", kLockTimeout, PGC_SUSET, PGC_S_OVERRIDE);
    SetConfigOption("default_transaction_isolation", "read committed", PGC_SUSET, PGC_S_OVERRIDE);
    SetConfigOption("default_transaction_read_only", "off", PGC_SUSET, PGC_S_OVERRIDE);
    SetConfigOption("application_name", "jobcap reaper", PGC_USERSET, PGC_S_OVERRIDE);
    ereport(DEBUG1, (errmsg("jobcap reaper started for database \"%s\"", w.database)));
    // Backends that roll back a claim in this database set our latch; claims taken from the
    // ring and not counted yet go back to it if we exit.
    register_reaper_latch();
    before_shmem_exit(give_back_taken, 0);

    MemoryContext cycle_context =
        AllocSetContextCreate(TopMemoryContext, "jobcap reaper cycle", ALLOCSET_DEFAULT_SIZES);
    // The latch is also set by things that are not a reason to reap (sinval catch-up, the
    // launcher's notices): cycles follow the clock, not the wake-ups.
    TimestampTz last_cycle = 0;
    TimestampTz next_cycle = 0;
    for (;;) {
        // A cancel that arrives between batches has nothing to cancel.
        QueryCancelPending = false;
        CHECK_FOR_INTERRUPTS();
        if (ConfigReloadPending) {
            ConfigReloadPending = false;
            ProcessConfigFile(PGC_SIGHUP);
            if (!database_wanted(w.database)) {
                ereport(LOG, (errmsg("jobcap reaper leaves database \"%s\": jobcap.database no "
                                     "longer selects it",
                                     w.database)));
                proc_exit(0);
            }
            // A shorter reap_interval applies from the last cycle on.
            next_cycle = Min(next_cycle, last_cycle + (int64) reap_interval_ms() * 1000);
        }
        if (launcher_gone()) {
            ereport(LOG, (errmsg("jobcap reaper leaves database \"%s\": its launcher is gone",
                                 w.database),
                          errdetail("The new launcher starts a reaper of its own.")));
            proc_exit(0);
        }

        // Rolled-back claims are counted as soon as they arrive, not at the next cycle.
        if (w.locked && !RecoveryInProgress() && rolled_back_waiting())
            count_rollbacks();

        TimestampTz now = GetCurrentTimestamp();
        if (now >= next_cycle) {
            MemoryContextSwitchTo(cycle_context);
            MemoryContextReset(cycle_context);
            if (!w.locked) {
                w.locked = take_lock();
                if (!w.locked && !w.said_waiting) {
                    ereport(LOG, (errmsg("jobcap reaper is waiting for another jobcap reaper to "
                                         "leave database \"%s\"",
                                         w.database)));
                    w.said_waiting = true;
                }
            }
            long wait = w.locked ? cycle() : reap_interval_ms();
            last_cycle = now;
            next_cycle = now + (int64) wait * 1000;
            now = GetCurrentTimestamp();
        }

        long timeout = (long) ((next_cycle - now + 999) / 1000);
        (void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, Max(timeout, 1L),
                         PG_WAIT_EXTENSION);
        ResetLatch(MyLatch);
    }
}
