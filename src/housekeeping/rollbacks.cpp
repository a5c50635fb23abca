// Claims whose transaction rolled back. A claim counts its attempt inside its own statement, but
// the count is only as durable as the transaction around it: BEGIN; claim; ROLLBACK, or an
// autocommit statement whose outer expression raises, undoes it, and a job that fails that way
// again and again would loop for ever, invisible. With jobcap preloaded, such an attempt is
// counted anyway:
//
//  1. The claiming backend notes (job, fence, worker) of every job it claimed in the current
//     transaction, in backend-local memory reserved before the claim runs (note_claims cannot
//     fail). Claims are refused in subtransactions, so only the top transaction matters.
//  2. A transaction callback forgets the notes when the transaction commits. On abort it copies
//     them into a ring in shared memory (fixed capacity; when full, the oldest entries are
//     overwritten and counted as lost) and sets the latch of the database's reaper. It takes
//     one LWLock and copies plain data: nothing there can raise.
//  3. Until an entry is counted (or given up), claims in its database skip its job when a reaper
//     serves the database (uncounted_rolled_back_jobs): a worker that claims again at once after
//     its rollback would otherwise hold the row through its work while the reaper's count waits
//     for it past lock_timeout, and a committed claim would overtake the count.
//  4. The reaper (background/reaper.cpp) marks its database's entries as its own (they stay in the
//     ring until counted or given up, so their jobs stay skipped) and counts each in a transaction
//     of its own, as a compare-and-swap (count_rolled_back below): attempts + 1 and a history row
//     of kind claim_rolled_back, dead when the cap is reached, but only while the job is still as
//     the claim found it: pending, below its cap, and with a fence lower than the one the claim
//     handed out. The rollback restored the job's old fence, and every later claim gets a higher
//     one from the sequence, so a claim that committed after the rolled-back one is never counted
//     again, and a job that was cancelled or died meanwhile is left alone. A requeue (requeue_job,
//     requeue_dead) also takes a new fence, so an attempt that rolled back before it is not charged
//     to the budget the requeue granted.
//
// A transaction that claimed cannot be prepared (PREPARE TRANSACTION): its fate would be
// decided in another session, where no callback of this one runs. The ring lives in shared
// memory only: a server crash (or immediate shutdown) loses the entries not yet counted.
#include "housekeeping/rollbacks.hpp"

extern "C" {
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "commands/dbcommands.h"
#include "utils/memutils.h"
}

#include "spi/access.hpp"
#include "spi/cap.hpp"
#include "spi/history.hpp"
#include "spi/plans.hpp"
#include "spi/schema.hpp"
#include "housekeeping/workflows.hpp"

namespace jobcap {
namespace statements {

// $1 = job, $2 = the fence the rolled-back claim handed out, $3 = now, $4 = its worker.
JOBCAP_STATEMENT(
    count_rolled_back_claim,
    "WITH counted AS (UPDATE jobcap.jobs j SET attempts = j.attempts + 1,"
    "     state = CASE WHEN j.attempts + 1 >= " JOBCAP_CAP
    "       THEN 'dead' ELSE 'pending' END::jobcap.job_state,"
    "     finished_at = CASE WHEN j.attempts + 1 >= " JOBCAP_CAP
    " THEN $3 END,"
    "     worker = $4"
    "   FROM jobcap.queues q"
    "  WHERE j.job_id = $1 AND q.queue = j.queue AND j.state = 'pending' AND j.fence < $2"
    "    AND j.attempts < " JOBCAP_CAP
    "  RETURNING j.job_id, j.queue, j.attempts, $2 AS fence, j.worker, "
    "j.state)," JOBCAP_HISTORY_CTES("counted", "'claim_rolled_back'", "'claim rolled back'",
                                    "$3") " SELECT state = 'dead' FROM counted",
    {INT8OID, INT8OID, TIMESTAMPTZOID, TEXTOID});

}  // namespace statements

namespace {

constexpr int kRingCapacity = 8192;  // entries (about 90 bytes each)
constexpr int kMaxReapers = 64;      // reapers whose latch the ring knows
constexpr const char* kTranche = "jobcap rolled-back claims";

struct ReaperSlot {
    Oid database;  // InvalidOid: free
    Latch* latch;
};

// The shared ring: entries[0 .. count) in arrival order, guarded by the tranche's one LWLock.
struct Ring {
    int count;
    uint64 lost;      // entries overwritten by a full ring (or beyond it), ever
    uint64 reported;  // ... of which a reaper has logged
    ReaperSlot reapers[kMaxReapers];
    RolledBackClaim entries[kRingCapacity];
};

Ring* ring = nullptr;
LWLock* ring_lock = nullptr;
shmem_request_hook_type previous_request = nullptr;
shmem_startup_hook_type previous_startup = nullptr;

// This backend's claims in the current transaction.
struct Mine {
    RolledBackClaim* items;  // in TopMemoryContext
    int count;
    int capacity;
    uint64 beyond;  // claims that did not fit (more than the ring holds)
    bool claimed;   // any claim at all (also without the ring)
};
Mine mine;

void request_shmem()
{
    if (previous_request != nullptr)
        previous_request();
    RequestAddinShmemSpace(MAXALIGN(sizeof(Ring)));
    RequestNamedLWLockTranche(kTranche, 1);
}

void start_shmem()
{
    if (previous_startup != nullptr)
        previous_startup();
    LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
    bool found = false;
    Ring* r = static_cast<Ring*>(ShmemInitStruct(kTranche, sizeof(Ring), &found));
    if (!found)
        memset(r, 0, sizeof(Ring));
    ring_lock = &(GetNamedLWLockTranche(kTranche))->lock;
    ring = r;
    LWLockRelease(AddinShmemInitLock);
}

void forget()
{
    mine.count = 0;
    mine.beyond = 0;
    mine.claimed = false;
}

// Appends claims to the ring (all of one database), overwriting the oldest entries when full,
// and wakes that database's reapers. Safe during abort: one LWLock, plain copies, SetLatch.
void push(const RolledBackClaim* claims, int n, uint64 beyond, Oid database)
{
    Latch* wake[kMaxReapers];
    int nwake = 0;
    LWLockAcquire(ring_lock, LW_EXCLUSIVE);
    if (n > kRingCapacity) {
        beyond += (uint64) (n - kRingCapacity);
        claims += n - kRingCapacity;
        n = kRingCapacity;
    }
    int overflow = ring->count + n - kRingCapacity;
    if (overflow > 0) {
        memmove(&ring->entries[0], &ring->entries[overflow],
                sizeof(RolledBackClaim) * (ring->count - overflow));
        ring->count -= overflow;
        ring->lost += (uint64) overflow;
    }
    ring->lost += beyond;
    memcpy(&ring->entries[ring->count], claims, sizeof(RolledBackClaim) * n);
    ring->count += n;
    for (int i = 0; i < kMaxReapers; ++i)
        if (ring->reapers[i].database == database && ring->reapers[i].latch != nullptr)
            wake[nwake++] = ring->reapers[i].latch;
    LWLockRelease(ring_lock);
    for (int i = 0; i < nwake; ++i)
        SetLatch(wake[i]);
}

// The transaction callback. Abort processing must not raise: on abort it only copies.
void on_transaction_end(XactEvent event, void*)
{
    switch (event) {
    case XACT_EVENT_PRE_PREPARE:
        if (mine.claimed)
            ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
                            errmsg("cannot prepare a transaction that claimed jobcap jobs"),
                            errdetail("A claim must commit before its work starts; a prepared "
                                      "transaction that rolled back would leave its attempt "
                                      "uncounted."),
                            errhint("Claim in a transaction of its own and commit it.")));
        break;
    case XACT_EVENT_ABORT:
    case XACT_EVENT_PARALLEL_ABORT:
        if (ring != nullptr && (mine.count > 0 || mine.beyond > 0))
            push(mine.items, mine.count, mine.beyond, MyDatabaseId);
        forget();
        break;
    case XACT_EVENT_COMMIT:
    case XACT_EVENT_PARALLEL_COMMIT:
    case XACT_EVENT_PREPARE:
        forget();
        break;
    default:
        break;
    }
}

void unregister_reaper_latch(int, Datum slot)
{
    int i = DatumGetInt32(slot);
    LWLockAcquire(ring_lock, LW_EXCLUSIVE);
    ring->reapers[i].database = InvalidOid;
    ring->reapers[i].latch = nullptr;
    LWLockRelease(ring_lock);
}

}  // namespace

void install_rollback_tracking()
{
    RegisterXactCallback(on_transaction_end, nullptr);
    if (process_shared_preload_libraries_in_progress) {
        previous_request = shmem_request_hook;
        shmem_request_hook = request_shmem;
        previous_startup = shmem_startup_hook;
        shmem_startup_hook = start_shmem;
    }
}

void reserve_claims(int64 n)
{
    if (ring == nullptr)
        return;
    int64 want = Min((int64) mine.count + n, (int64) kRingCapacity);
    if (want <= mine.capacity)
        return;
    int capacity = (int) Min(Max(want, (int64) Max(2 * mine.capacity, 16)), (int64) kRingCapacity);
    void* items = MemoryContextAlloc(TopMemoryContext, sizeof(RolledBackClaim) * capacity);
    if (mine.items != nullptr) {
        memcpy(items, mine.items, sizeof(RolledBackClaim) * mine.count);
        pfree(mine.items);
    }
    mine.items = static_cast<RolledBackClaim*>(items);
    mine.capacity = capacity;
}

void note_claim(int64 job_id, int64 fence, const char* worker)
{
    mine.claimed = true;
    if (ring == nullptr)
        return;
    if (mine.count >= mine.capacity) {
        mine.beyond += 1;
        return;
    }
    int len = pg_mbcliplen(worker, (int) strlen(worker), kRolledBackWorkerBytes - 1);
    RolledBackClaim& c = mine.items[mine.count++];
    c.database = MyDatabaseId;
    c.tries = 0;
    c.taken_by = 0;
    c.job_id = job_id;
    c.fence = fence;
    memcpy(c.worker, worker, len);
    c.worker[len] = '\0';
}

void note_claims(uint64 rows, const char* worker)
{
    for (uint64 r = 0; r < rows; ++r)
        note_claim(DatumGetInt64(result_column(r, 1)), DatumGetInt64(result_column(r, 2)), worker);
}

bool rollback_tracking_active()
{
    return ring != nullptr;
}

void register_reaper_latch()
{
    if (ring == nullptr)
        return;
    int slot = -1;
    LWLockAcquire(ring_lock, LW_EXCLUSIVE);
    for (int i = 0; i < kMaxReapers && slot < 0; ++i)
        if (ring->reapers[i].latch == nullptr) {
            ring->reapers[i].database = MyDatabaseId;
            ring->reapers[i].latch = MyLatch;
            slot = i;
        }
    LWLockRelease(ring_lock);
    if (slot >= 0)
        before_shmem_exit(unregister_reaper_latch, Int32GetDatum(slot));
    else
        ereport(LOG, (errmsg("jobcap reaper counts rolled-back claims only once per "
                             "jobcap.reap_interval"),
                      errdetail("More than %d jobcap reapers are running.", kMaxReapers)));
}

Datum uncounted_rolled_back_jobs()
{
    // An unlocked look first: the ring is empty nearly always. An entry pushed just after it is
    // missed; that claim is then counted as before, once the new claim's transaction ends.
    if (ring == nullptr || ring->count == 0)
        return PointerGetDatum(construct_empty_array(INT8OID));
    static Datum jobs[kRingCapacity];  // plain data, one per backend: no allocation per claim
    int n = 0;
    LWLockAcquire(ring_lock, LW_SHARED);
    bool served = false;
    for (int i = 0; i < kMaxReapers && !served; ++i)
        served = ring->reapers[i].database == MyDatabaseId && ring->reapers[i].latch != nullptr;
    for (int i = 0; served && i < ring->count; ++i)
        if (ring->entries[i].database == MyDatabaseId)
            jobs[n++] = Int64GetDatum(ring->entries[i].job_id);
    LWLockRelease(ring_lock);
    return PointerGetDatum(
        construct_array(jobs, n, INT8OID, sizeof(int64), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
}

bool rolled_back_waiting()
{
    if (ring == nullptr || ring->count == 0)
        return false;
    bool any = false;
    LWLockAcquire(ring_lock, LW_SHARED);
    for (int i = 0; i < ring->count && !any; ++i)
        any = ring->entries[i].database == MyDatabaseId && ring->entries[i].taken_by == 0;
    LWLockRelease(ring_lock);
    return any;
}

int take_rolled_back(RolledBackClaim* out, int max)
{
    if (ring == nullptr)
        return 0;
    int taken = 0;
    LWLockAcquire(ring_lock, LW_EXCLUSIVE);
    for (int i = 0; i < ring->count && taken < max; ++i) {
        RolledBackClaim& c = ring->entries[i];
        if (c.database == MyDatabaseId && c.taken_by == 0) {
            c.taken_by = MyProcPid;
            out[taken++] = c;
        }
    }
    LWLockRelease(ring_lock);
    return taken;
}

namespace {

// The ring's index of our entry for claim (the same job and fence, taken by us), or -1 when a
// full ring overwrote it.
int find_taken(const RolledBackClaim& claim)
{
    for (int i = 0; i < ring->count; ++i) {
        const RolledBackClaim& c = ring->entries[i];
        if (c.taken_by == MyProcPid && c.database == claim.database && c.job_id == claim.job_id &&
            c.fence == claim.fence)
            return i;
    }
    return -1;
}

}  // namespace

void give_back_rolled_back(const RolledBackClaim* claims, int n)
{
    if (ring == nullptr || n <= 0)
        return;
    LWLockAcquire(ring_lock, LW_EXCLUSIVE);
    for (int k = 0; k < n; ++k) {
        int i = find_taken(claims[k]);
        if (i >= 0) {
            ring->entries[i].taken_by = 0;
            ring->entries[i].tries = claims[k].tries;
        }
    }
    LWLockRelease(ring_lock);
}

void finish_rolled_back(const RolledBackClaim* claims, int n)
{
    if (ring == nullptr || n <= 0)
        return;
    LWLockAcquire(ring_lock, LW_EXCLUSIVE);
    for (int k = 0; k < n; ++k) {
        int i = find_taken(claims[k]);
        if (i >= 0) {
            memmove(&ring->entries[i], &ring->entries[i + 1],
                    sizeof(RolledBackClaim) * (ring->count - i - 1));
            ring->count--;
        }
    }
    LWLockRelease(ring_lock);
}

uint64 rolled_back_lost_unreported()
{
    if (ring == nullptr)
        return 0;
    LWLockAcquire(ring_lock, LW_EXCLUSIVE);
    uint64 lost = ring->lost - ring->reported;
    ring->reported = ring->lost;
    LWLockRelease(ring_lock);
    return lost;
}

// compat(0.1.0): the 0.1.0 schema has no history kind claim_rolled_back (its CHECK refuses it) and
// 0.1.0 never counted rolled-back claims: between installing this library and ALTER EXTENSION
// jobcap UPDATE they go uncounted, as under 0.1.0, and the reaper says so once per process.
bool count_rolled_back(const RolledBackClaim& claim, bool* went_dead)
{
    static bool said_schema_0_1 = false;
    *went_dead = false;
    if (!queues_paused_column_exists()) {  // compat(0.1.0)
        if (!said_schema_0_1)
            ereport(LOG, (errmsg("jobcap reaper does not count rolled-back claims in database "
                                 "\"%s\" until ALTER EXTENSION jobcap UPDATE",
                                 get_database_name(MyDatabaseId)),
                          errdetail("The database still has the schema of jobcap 0.1.0.")));
        said_schema_0_1 = true;
        return false;
    }
    Params p;
    p.add(Int64GetDatum(claim.job_id)).add(Int64GetDatum(claim.fence));
    p.add(TimestampTzGetDatum(GetCurrentTimestamp())).add(CStringGetTextDatum(claim.worker));
    uint64 rows = execute(statements::count_rolled_back_claim, p, SPI_OK_SELECT);
    *went_dead = rows > 0 && DatumGetBool(result_column(0, 1));
    if (*went_dead)  // the jobs waiting for it go with it
        cancel_dependents(&claim.job_id, 1, GetCurrentTimestamp());
    return rows > 0;
}

}  // namespace jobcap
