// Claims whose transaction rolled back (src/background/rollbacks.cpp): with jobcap preloaded,
// their attempts are still counted, by the database's reaper, in a transaction of its own.
#pragma once

#include "pg.hpp"

namespace jobcap {

// One claim that rolled back, as the shared ring keeps it. Plain C: it lives in shared memory.
constexpr int kRolledBackWorkerBytes = 64;
struct RolledBackClaim {
    Oid database;
    int32 tries;  // failed attempts of the reaper to count it
    int64 job_id;
    int64 fence;  // the fence the claim handed out (never stored: the claim rolled back)
    char worker[kRolledBackWorkerBytes];  // the claiming worker's name, cut to fit
};

// From _PG_init: the transaction callback in every backend; the shared ring's hooks when
// shared_preload_libraries is being processed.
void install_rollback_tracking();

// Before a claim statement runs: room to note up to n claimed jobs, so that noting them after
// the statement cannot fail. May raise (out of memory) before anything is claimed.
void reserve_claims(int64 n);

// Right after a claim statement: notes the claimed jobs of SPI_tuptable (columns 1-3: job_id,
// fence, attempt), so that they are counted if this transaction rolls back.
void note_claims(uint64 rows, const char* worker);

// The reaper's side. All of these are no-ops without the shared ring (jobcap not preloaded).
bool rollback_tracking_active();
void register_reaper_latch();                         // the reaper of MyDatabaseId; until it exits
bool rolled_back_waiting();                           // any entry for MyDatabaseId
int take_rolled_back(RolledBackClaim* out, int max);  // removes up to max of MyDatabaseId's
void give_back_rolled_back(const RolledBackClaim* claims, int n);  // to be tried again
uint64 rolled_back_lost_unreported();  // entries lost to a full ring since the last call

// Counts one rolled-back claim inside an open SPI connection (a compare-and-swap: only while
// the job is still as the rolled-back claim found it). Returns false when the job has moved on.
bool count_rolled_back(const RolledBackClaim& claim, bool* went_dead);

}  // namespace jobcap
