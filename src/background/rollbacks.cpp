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
//  3. The reaper (reaper.cpp) takes its database's entries and counts each in a transaction of
//     its own, as a compare-and-swap (count_rolled_back below): attempts + 1 and a history row
//     of kind claim_rolled_back, dead when the cap is reached, but only while the job is still
//     as the claim found it: pending, below its cap, and with a fence lower than the one the
//     claim handed out. The rollback restored the job's old fence, and every later claim gets a
//     higher one from the sequence, so a claim that committed after the rolled-back one is
//     never counted again, and a job that was cancelled or died meanwhile is left alone.
//
// A transaction that claimed cannot be prepared (PREPARE TRANSACTION): its fate would be
// decided in another session, where no callback of this one runs. The ring lives in shared
// memory only: a server crash (or immediate shutdown) loses the entries not yet counted.
#include "background/rollbacks.hpp"

extern "C" {
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/memutils.h"
}

#include "spi/cap.hpp"
#include "spi/history.hpp"
#include "spi/plans.hpp"

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

void note_claims(uint64 rows, const char* worker)
{
    if (rows == 0)
        return;
    mine.claimed = true;
    if (ring == nullptr)
        return;
    int len = pg_mbcliplen(worker, (int) strlen(worker), kRolledBackWorkerBytes - 1);
    for (uint64 r = 0; r < rows; ++r) {
        if (mine.count >= mine.capacity) {
            mine.beyond += rows - r;
            break;
        }
        RolledBackClaim& c = mine.items[mine.count++];
        c.database = MyDatabaseId;
        c.tries = 0;
        c.job_id = DatumGetInt64(result_column(r, 1));
        c.fence = DatumGetInt64(result_column(r, 2));
        memcpy(c.worker, worker, len);
        c.worker[len] = '\0';
    }
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

bool rolled_back_waiting()
{
    if (ring == nullptr || ring->count == 0)
        return false;
    bool any = false;
    LWLockAcquire(ring_lock, LW_SHARED);
    for (int i = 0; i < ring->count && !any; ++i)
        any = ring->entries[i].database == MyDatabaseId;
    LWLockRelease(ring_lock);
    return any;
}

int take_rolled_back(RolledBackClaim* out, int max)
{
    if (ring == nullptr)
        return 0;
    int taken = 0;
    int kept = 0;
    LWLockAcquire(ring_lock, LW_EXCLUSIVE);
    for (int i = 0; i < ring->count; ++i) {
        const RolledBackClaim& c = ring->entries[i];
        if (taken < max && c.database == MyDatabaseId)
            out[taken++] = c;
        else
            ring->entries[kept++] = c;
    }
    ring->count = kept;
    LWLockRelease(ring_lock);
    return taken;
}

void give_back_rolled_back(const RolledBackClaim* claims, int n)
{
    if (ring != nullptr && n > 0)
        push(claims, n, 0, InvalidOid);
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

bool count_rolled_back(const RolledBackClaim& claim, bool* went_dead)
{
    Params p;
    p.add(Int64GetDatum(claim.job_id)).add(Int64GetDatum(claim.fence));
    p.add(TimestampTzGetDatum(GetCurrentTimestamp())).add(CStringGetTextDatum(claim.worker));
    uint64 rows = execute(statements::count_rolled_back_claim, p, SPI_OK_SELECT);
    *went_dead = rows > 0 && DatumGetBool(result_column(0, 1));
    return rows > 0;
}

}  // namespace jobcap
