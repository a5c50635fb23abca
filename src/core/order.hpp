// Claim order (priority, then run_at, then job id), applied to the few rows one claim returns:
// cheaper in C++ than a Sort node in every claim's plan.
#pragma once

#include <cstddef>
#include <cstdint>

namespace jobcap::core {

struct ClaimKey {
    std::int32_t priority;
    std::int64_t run_at;  // microseconds, as PostgreSQL stores a timestamptz
    std::int64_t job_id;
    std::uint32_t row;  // the row of the statement's result this key came from
};

// Sorts keys into claim order. Plain data in, plain data out; no allocation, no exceptions.
void sort_claim_order(ClaimKey* keys, std::size_t count) noexcept;

}  // namespace jobcap::core
