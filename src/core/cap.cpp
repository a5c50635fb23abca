#include "cpp_only.hpp"

#include "cap.hpp"

namespace jobcap::core {

Cap cap_of(const CapInputs& in) noexcept
{
    if (!in.job_cap_epoch_null && in.job_cap_epoch == in.queue_cap_epoch)
        return Cap{in.job_max_attempts_null, in.job_max_attempts_null ? 0 : in.job_max_attempts};
    if (in.job_max_attempts_null || in.queue_max_attempts < in.job_max_attempts)
        return Cap{false, in.queue_max_attempts};
    return Cap{false, in.job_max_attempts};
}

bool may_claim(std::int32_t attempts, Cap cap) noexcept
{
    return !cap.none && attempts < cap.value;
}

bool attempts_used_up(std::int32_t attempts, Cap cap) noexcept
{
    return !cap.none && attempts >= cap.value;
}

}  // namespace jobcap::core
