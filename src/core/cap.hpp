// The cap rule in C++, for the direct path (src/direct/claim.cpp and settle.cpp). Its SQL
// spelling, JOBCAP_CAP_OF, is in src/spi/cap.hpp, which says what the rule means; one table of
// cases (test/unit/cap_cases.txt) is checked against this function by test/unit/cap_test.cpp and
// against the SQL statements and the direct path by test/t/180_cap_rule.pl.
#pragma once

#include <cstdint>

namespace jobcap::core {

// What the rule reads: a job's own max_attempts and cap_epoch (each may be NULL) and its queue's
// max_attempts and cap_epoch (never NULL).
struct CapInputs {
    std::int32_t job_max_attempts;
    bool job_max_attempts_null;
    std::int64_t job_cap_epoch;
    bool job_cap_epoch_null;
    std::int32_t queue_max_attempts;
    std::int64_t queue_cap_epoch;
};

// A job's cap. none: no cap at all (SQL's NULL: a budget whose max_attempts is NULL), which no
// comparison passes.
struct Cap {
    bool none;
    std::int32_t value;
};

// The job's own max_attempts while its cap_epoch is its queue's (a budget requeue_job granted),
// else the lower of its own and its queue's (no own max_attempts: the queue's).
Cap cap_of(const CapInputs& in) noexcept;

// Whether a job with `attempts` counted may be claimed again: attempts < cap.
bool may_claim(std::int32_t attempts, Cap cap) noexcept;

// Whether the attempt that brought the count to `attempts` was the last (fail_job, the reaper:
// the job dies): attempts >= cap.
bool attempts_used_up(std::int32_t attempts, Cap cap) noexcept;

}  // namespace jobcap::core
