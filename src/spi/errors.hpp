// The errors every family of functions shares: bad arguments, unknown objects, stale fences.
#pragma once

#include "pg.hpp"

#include "core/rules.hpp"

namespace jobcap {

// The stale-fence SQLSTATE: the caller's lease on the job is no longer current.
constexpr int kStaleFence = MAKE_SQLSTATE('J', 'C', '0', '0', '1');

// Reports a rule broken by an argument, as decided by the pure core.
[[noreturn]] void raise_problem(const core::Problem& problem);

struct Access;

// Raises the stale-fence error for job_id, explaining from the job's current row why the
// given fence is no longer current; raises "does not exist" when there is no such job, and
// 42501 when the caller may not work the job's queue (or, unprivileged, when there is no job).
[[noreturn]] void raise_not_current(const Access& access, const char* function, int64 job_id,
                                    int64 fence);

// Raises 42704 for a job that does not exist.
[[noreturn]] void raise_unknown_job(int64 job_id);

// Raises 42704 for a queue that does not exist.
[[noreturn]] void raise_unknown_queue(const char* queue);

}  // namespace jobcap
