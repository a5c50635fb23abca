#include "cpp_only.hpp"

#include "backoff.hpp"

#include <algorithm>

namespace jobcap::core {

std::int64_t backoff_ceiling(std::int64_t attempt, std::int64_t base_usec, std::int64_t max_usec)
{
    if (max_usec <= 0 || base_usec <= 0)
        return 0;
    std::int64_t ceiling = std::min(base_usec, max_usec);
    for (std::int64_t doubling = 1; doubling < attempt && ceiling < max_usec; ++doubling)
        ceiling = ceiling > max_usec / 2 ? max_usec : ceiling * 2;
    return ceiling;
}

std::int64_t backoff_delay(std::int64_t attempt, std::int64_t base_usec, std::int64_t max_usec,
                           double u)
{
    std::int64_t ceiling = backoff_ceiling(attempt, base_usec, max_usec);
    u = std::clamp(u, 0.0, 1.0);
    std::int64_t half = ceiling / 2;
    return half + static_cast<std::int64_t>(u * static_cast<double>(ceiling - half));
}

}  // namespace jobcap::core
