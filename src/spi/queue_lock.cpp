#include "spi/queue_lock.hpp"

extern "C" {
#include "common/hashfn.h"
#include "miscadmin.h"
#include "storage/lock.h"
}

namespace jobcap {
namespace {

constexpr uint32 kLockKey1 = 1785684593;  // 'jobq'
constexpr uint16 kLockSubId = 4;          // the reaper's lock is 3 (src/background/reaper.cpp)
constexpr uint16 kTurnSubId = 5;
constexpr uint16 kSlotSubId = 6;

uint32 name_hash(Datum queue)
{
    text* name = DatumGetTextPP(queue);
    return DatumGetUInt32(hash_any(reinterpret_cast<const unsigned char*>(VARDATA_ANY(name)),
                                   VARSIZE_ANY_EXHDR(name)));
}

void lock_queue(Datum queue, LOCKMODE mode)
{
    LOCKTAG tag;
    SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, kLockKey1, name_hash(queue), kLockSubId);
    (void) LockAcquire(&tag, mode, false, false);
}

LOCKTAG turn_tag(Datum queue)
{
    LOCKTAG tag;
    SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, kLockKey1, name_hash(queue), kTurnSubId);
    return tag;
}

// Slot s of queue: two names sharing a hash share their slots (then fewer shared claims of each
// run at once, nothing more).
LOCKTAG slot_tag(Datum queue, int slot)
{
    LOCKTAG tag;
    SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, name_hash(queue), static_cast<uint32>(slot),
                         kSlotSubId);
    return tag;
}

}  // namespace

void lock_queue_for_insert(Datum queue)
{
    lock_queue(queue, RowExclusiveLock);
}

void lock_queue_for_create(Datum queue)
{
    lock_queue(queue, ShareUpdateExclusiveLock);
}

void lock_queue_for_drop(Datum queue)
{
    lock_queue(queue, ExclusiveLock);
}

int take_shared_claim_turn(Datum queue)
{
    LOCKTAG turn = turn_tag(queue);
    // Not waited for: while an exclusive claim holds or awaits the turn, this claim joins the
    // exclusive ones in the queue's row lock, so that they keep the order they came in.
    // (Held by this transaction already, from an earlier claim: granted again.)
    if (LockAcquire(&turn, ShareLock, false, true) == LOCKACQUIRE_NOT_AVAIL)
        return -1;
    // Each process starts at a slot of its own, so that claimers seldom try a taken one. A slot
    // this transaction holds already stands for an earlier claim's jobs, still in flight: each
    // claim takes a slot of its own.
    int first = MyProcPid % kClaimSlots;
    for (int i = 0; i < kClaimSlots; ++i) {
        int slot = (first + i) % kClaimSlots;
        LOCKTAG tag = slot_tag(queue, slot);
        LockAcquireResult got = LockAcquire(&tag, ExclusiveLock, false, true);
        if (got == LOCKACQUIRE_OK)
            return slot;
        if (got != LOCKACQUIRE_NOT_AVAIL)
            LockRelease(&tag, ExclusiveLock, false);
    }
    LockRelease(&turn, ShareLock, false);
    return -1;
}

void give_back_shared_claim_turn(Datum queue, int slot)
{
    LOCKTAG tag = slot_tag(queue, slot);
    LockRelease(&tag, ExclusiveLock, false);
    LOCKTAG turn = turn_tag(queue);
    LockRelease(&turn, ShareLock, false);
}

void take_exclusive_claim_turn(Datum queue)
{
    LOCKTAG turn = turn_tag(queue);
    (void) LockAcquire(&turn, ExclusiveLock, false, false);
}

}  // namespace jobcap
