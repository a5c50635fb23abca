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

void lock_queue(Datum queue, LOCKMODE mode)
{
    text* name = DatumGetTextPP(queue);
    uint32 hash = DatumGetUInt32(hash_any(reinterpret_cast<const unsigned char*>(VARDATA_ANY(name)),
                                          VARSIZE_ANY_EXHDR(name)));
    LOCKTAG tag;
    SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, kLockKey1, hash, kLockSubId);
    (void) LockAcquire(&tag, mode, false, false);
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

}  // namespace jobcap
