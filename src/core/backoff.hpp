// Retry delay after a failed attempt. The formula, the one users are told:
//
//   ceiling = min(backoff_max, backoff_base * 2^(attempt - 1))
//   delay   = ceiling / 2 + u * ceiling / 2,   u uniform in [0, 1)
//
// "Equal jitter": a retry never comes sooner than half its ceiling, and retries of jobs that
// failed together spread over the other half.
#pragma once

#include <cstdint>

namespace jobcap::core {

// The ceiling for attempt (1 = the first attempt failed), in microseconds. Never negative,
// never above max_usec, no overflow for any attempt.
std::int64_t backoff_ceiling(std::int64_t attempt, std::int64_t base_usec, std::int64_t max_usec);

// The jittered delay; u must be in [0, 1).
std::int64_t backoff_delay(std::int64_t attempt, std::int64_t base_usec, std::int64_t max_usec,
                           double u);

}  // namespace jobcap::core
