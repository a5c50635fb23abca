// The reaper, shared by reap_jobs() and the background worker.
#pragma once

#include "pg.hpp"

#include "housekeeping/workflows.hpp"

namespace jobcap {

// Reaps up to max_jobs jobs, inside an open SPI connection: expired leases and pending jobs over
// their cap in one statement, then (0.3.0) running jobs past their max_run_time and unclaimed
// jobs past their start_by (housekeeping/workflows.hpp), each cancelling the jobs that depended
// on those that ended. Each reaped job (job_id bigint, queue text, outcome job_state) goes to row
// (when not nullptr). Returns how many.
uint64 reap(int32 max_jobs, ReapedRow row, void* arg);

}  // namespace jobcap
