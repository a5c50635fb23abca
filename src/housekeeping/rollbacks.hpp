// Claims whose transaction rolled back (src/housekeeping/rollbacks.cpp): with jobcap preloaded,
// their attempts are still counted, by the database's reaper, in a transaction of its own.
#pragma once

#include "pg.hpp"

namespace jobcap {

// One claim that rolled back, as the shared ring keeps it. Plain C: it lives in shared memory.
constexpr int kRolledBackWorkerBytes = 64;
struct RolledBackClaim {
    Oid database;
    int32 tries;     // failed attempts of the reaper to count it
    int32 taken_by;  // the pid of the reaper counting it; 0: waiting
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
// The same for one claimed job (the direct path's claims).
void note_claim(int64 job_id, int64 fence, const char* worker);

// For a claim statement: an int8[] of this database's jobs whose rolled-back claims wait to be
// counted (or are being counted), when a reaper serves the database; empty otherwise. A claim
// skips them, so the job is not handed out again (and its row held by the new claim's work) until
// the rolled-back attempt is counted. Without a reaper nothing would count them: not skipped.
Datum uncounted_rolled_back_jobs();

// The reaper's side. All of these are no-ops without the shared ring (jobcap not preloaded).
// An entry stays in the ring until it is counted or given up, so claims keep skipping its job.
bool rollback_tracking_active();
void register_reaper_latch();  // the reaper of MyDatabaseId; until it exits
bool rolled_back_waiting();    // any entry for MyDatabaseId not being counted
int take_rolled_back(RolledBackClaim* out, int max);  // marks up to max of MyDatabaseId's as ours
void give_back_rolled_back(const RolledBackClaim* claims, int n);  // to be tried again
void finish_rolled_back(const RolledBackClaim* claims, int n);     // counted or given up: removed
uint64 rolled_back_lost_unreported();  // entries lost to a full ring since the last call

// Counts one rolled-back claim inside an open SPI connection (a compare-and-swap: only while
// the job is still as the rolled-back claim found it). Returns false when the job has moved on,
// and (compat(0.1.0)) on a database still at jobcap 0.1.0, which has no place for the count
// (logged once).
bool count_rolled_back(const RolledBackClaim& claim, bool* went_dead);

}  // namespace jobcap
