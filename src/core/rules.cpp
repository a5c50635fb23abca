#include "cpp_only.hpp"

#include "rules.hpp"

#include <cstdio>

namespace jobcap::core {
namespace {

constexpr std::int64_t kUsecPerDay = std::int64_t(86400) * 1000000;
constexpr std::int64_t kSaturate = kMaxSpanUsec * 4;

Problem problem(Fault fault, const char* hint, const char* format, const char* what,
                long long a = 0, long long b = 0)
{
    Problem p;
    p.fault = fault;
    std::snprintf(p.message, sizeof p.message, format, what, a, b);
    if (hint)
        std::snprintf(p.hint, sizeof p.hint, "%s", hint);
    return p;
}

std::int64_t clamp(long double v)
{
    if (v > kSaturate)
        return kSaturate;
    if (v < -kSaturate)
        return -kSaturate;
    return static_cast<std::int64_t>(v);
}

}  // namespace

std::int64_t span_usec(const Span& span)
{
    long double total = static_cast<long double>(span.months) * 30 * kUsecPerDay +
                        static_cast<long double>(span.days) * kUsecPerDay +
                        static_cast<long double>(span.usec);
    return clamp(total);
}

Problem check_not_null(const char* what, bool is_null)
{
    if (is_null)
        return problem(Fault::null_value, nullptr, "%s must not be null", what);
    return {};
}

Problem check_name(const char* what, const char* value, std::size_t length, std::size_t max_bytes,
                   bool is_null)
{
    if (is_null)
        return problem(Fault::null_value, nullptr, "%s must not be null", what);
    if (length == 0)
        return problem(Fault::invalid_value, nullptr, "%s must not be empty", what);
    if (length > max_bytes)
        return problem(Fault::invalid_value, nullptr, "%s is too long (%lld bytes, at most %lld)",
                       what, static_cast<long long>(length), static_cast<long long>(max_bytes));
    for (std::size_t i = 0; i < length; ++i) {
        unsigned char c = static_cast<unsigned char>(value[i]);
        if (c < 0x20 || c == 0x7f)
            return problem(Fault::invalid_value, "Names are printable text.",
                           "%s must not contain control characters", what);
    }
    return {};
}

Problem check_positive(const char* what, std::int64_t value, std::int64_t max, bool is_null)
{
    if (is_null)
        return problem(Fault::null_value, nullptr, "%s must not be null", what);
    if (value <= 0)
        return problem(Fault::invalid_value, nullptr, "%s must be positive, not %lld", what,
                       static_cast<long long>(value));
    if (value > max)
        return problem(Fault::out_of_range, nullptr, "%s must be at most %lld, not %lld", what,
                       static_cast<long long>(max), static_cast<long long>(value));
    return {};
}

Problem check_span(const char* what, const Span& value, bool allow_zero, bool is_null)
{
    if (is_null)
        return problem(Fault::null_value, nullptr, "%s must not be null", what);
    std::int64_t usec = span_usec(value);
    if (usec < 0 || (usec == 0 && !allow_zero))
        return problem(Fault::invalid_value, nullptr,
                       allow_zero ? "%s must not be negative" : "%s must be positive", what);
    if (usec > kMaxSpanUsec)
        return problem(Fault::out_of_range, nullptr, "%s must be at most 10 years", what);
    return {};
}

Problem check_added_span(const char* what, const Span& value, bool allow_zero, bool is_null)
{
    if (is_null)
        return problem(Fault::null_value, nullptr, "%s must not be null", what);
    if (value.months != 0)
        return problem(Fault::invalid_value,
                       "A month added to a time lasts 28 to 31 days; write the span in days, "
                       "hours or seconds, e.g. '30 days'.",
                       "%s must not have a month component", what);
    if ((value.days > 0 && value.usec < 0) || (value.days < 0 && value.usec > 0))
        return problem(Fault::invalid_value,
                       "A day added to a time lasts 23 to 25 hours; write the span with one sign, "
                       "e.g. '23:59:59' rather than '1 day -00:00:01'.",
                       "%s must not mix days and time of opposite signs", what);
    return check_span(what, value, allow_zero, false);
}

Problem check_backoff_order(const Span& base, const Span& max)
{
    if (span_usec(base) > span_usec(max))
        return problem(Fault::invalid_value, "Raise backoff_max or lower backoff_base.",
                       "%s must not exceed backoff_max", "backoff_base");
    return {};
}

}  // namespace jobcap::core
