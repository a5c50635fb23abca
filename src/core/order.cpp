#include "cpp_only.hpp"

#include "order.hpp"

#include <algorithm>
#include <tuple>

namespace jobcap::core {

void sort_claim_order(ClaimKey* keys, std::size_t count) noexcept
{
    std::sort(keys, keys + count, [](const ClaimKey& a, const ClaimKey& b) {
        return std::tie(a.priority, a.run_at, a.job_id) < std::tie(b.priority, b.run_at, b.job_id);
    });
}

}  // namespace jobcap::core
