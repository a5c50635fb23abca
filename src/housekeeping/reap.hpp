// The reaper, shared by reap_jobs() and the background worker.
#pragma once

#include "pg.hpp"

namespace jobcap {

// Reaps up to max_jobs jobs in one statement, inside an open SPI connection, and leaves the
// reaped rows (job_id bigint, queue text, outcome job_state) in SPI_tuptable. Returns how many.
uint64 reap(int32 max_jobs);

}  // namespace jobcap
