// How the reaper runs a step (steps.hpp): the shape of PostgreSQL's worker_spi, one short
// transaction per batch (statement start timestamp, transaction, SPI, snapshot, activity report,
// and the reverse), so no snapshot outlives a batch. SPI in a background worker arms no
// statement_timeout, so each batch arms its own. Plain data only: ereport is a longjmp.
#include "background/steps.hpp"

#include "spi/citus.hpp"

extern "C" {
#include "catalog/pg_extension.h"
#include "commands/extension.h"
#include "pgstat.h"
#include "storage/lmgr.h"
#include "utils/backend_status.h"
#include "utils/timeout.h"
}

#include "background/vacuum.hpp"
#include "jobcap.hpp"

namespace jobcap {
namespace {

constexpr int kStatementTimeoutMs = 10000;  // per batch
// The longest wait the worker sets itself (a back-off, a vacuum's spacing). A wall clock stepped
// back leaves a wait further ahead than this, which then ends it (waiting()).
constexpr TimestampTz kWaitLongestUs =
    Max(kBackoffMaxMs * INT64CONST(1000), kVacuumSpacingLongestUs);

// Whether extension jobcap exists now, read in a transaction of its own.
bool extension_exists_now()
{
    MemoryContext caller = CurrentMemoryContext;
    StartTransactionCommand();
    bool exists = OidIsValid(get_extension_oid("jobcap", true));
    CommitTransactionCommand();
    MemoryContextSwitchTo(caller);  // the commit left TopMemoryContext current
    return exists;
}

}  // namespace

Outcome rolled_back(MemoryContext caller, uint32 holdoff, ErrorData** error)
{
    citus::unroute();  // a step that failed on a shard
    MemoryContextSwitchTo(caller);
    ErrorData* e = CopyErrorData();
    FlushErrorState();
    AbortCurrentTransaction();  // releases the LWLocks the error left held
    InterruptHoldoffCount = holdoff;
    *error = e;
    return (e->sqlerrcode == ERRCODE_QUERY_CANCELED || e->sqlerrcode == ERRCODE_LOCK_NOT_AVAILABLE)
               ? Outcome::timed_out
               : Outcome::failed;
}

Outcome finished(Outcome outcome, ErrorData** error)
{
    if (outcome == Outcome::failed && !extension_exists_now()) {
        FreeErrorData(*error);
        *error = nullptr;
        outcome = Outcome::absent;
    }
    pgstat_report_stat(false);
    pgstat_report_activity(STATE_IDLE, nullptr);
    return outcome;
}

Outcome in_transaction(const char* activity, Step step, int32 batch, uint64* rows,
                       ErrorData** error)
{
    MemoryContext caller = CurrentMemoryContext;
    uint32 holdoff = InterruptHoldoffCount;
    volatile Outcome outcome = Outcome::done;
    volatile uint64 result = 0;

    *error = nullptr;
    // Each batch is a statement of its own: its start time (xact_start in pg_stat_activity,
    // the prune cut-off) is now, not when the worker started.
    SetCurrentStatementStartTimestamp();
    StartTransactionCommand();
    PG_TRY();
    {
        SPI_connect();
        PushActiveSnapshot(GetTransactionSnapshot());
        pgstat_report_activity(STATE_RUNNING, activity);
        // A DROP EXTENSION in progress holds its extension's lock until it commits: take the
        // lock (waiting for such a drop) and look again, so that no step runs into tables
        // dropped under it.
        Oid extension = get_extension_oid("jobcap", true);
        if (OidIsValid(extension)) {
            LockDatabaseObject(ExtensionRelationId, extension, 0, AccessShareLock);
            if (get_extension_oid("jobcap", true) != extension)
                extension = InvalidOid;
        }
        if (!OidIsValid(extension)) {
            outcome = Outcome::absent;
        } else {
            enable_timeout_after(STATEMENT_TIMEOUT, kStatementTimeoutMs);
            result = step(batch);
            disable_timeout(STATEMENT_TIMEOUT, false);
        }
        SPI_finish();
        PopActiveSnapshot();
        CommitTransactionCommand();
    }
    PG_CATCH();
    {
        disable_timeout(STATEMENT_TIMEOUT, false);
        outcome = rolled_back(caller, holdoff, error);
    }
    PG_END_TRY();
    MemoryContextSwitchTo(caller);
    *rows = result;
    return finished(outcome, error);
}

long reap_interval_ms()
{
    return guc_reap_interval_ms;
}

bool waiting(TimestampTz now, TimestampTz until)
{
    return now < until && until - now <= kWaitLongestUs;
}

void back_off(StepState& step, const char* failed, Outcome outcome, ErrorData* error,
              long min_wait_ms)
{
    step.failures++;
    if (outcome == Outcome::timed_out)
        step.batch = Max(step.batch / 2, kBatchMin);
    long wait = reap_interval_ms();
    for (int i = 0; i < step.failures && wait < kBackoffMaxMs; ++i)
        wait *= 2;
    wait = Max(Min(wait, kBackoffMaxMs), min_wait_ms);
    step.resume_at = GetCurrentTimestamp() + (int64) wait * 1000;
    ereport(LOG, (errcode(error->sqlerrcode), errmsg(failed, reaper_database(), wait, step.batch),
                  errdetail("%s", error->message)));
    FreeErrorData(error);
}

}  // namespace jobcap
