// Argument rules of the SQL API, decided without PostgreSQL. Every result is plain data, so the
// PostgreSQL-facing files may hold it in frames that an ereport can jump over.
#pragma once

#include <cstddef>
#include <cstdint>

namespace jobcap::core {

// The kinds of bad input, each mapped to one SQLSTATE by the caller (see errors.cpp).
enum class Fault : std::uint8_t {
    none,
    null_value,     // 22004
    invalid_value,  // 22023
    out_of_range,   // 22003
};

struct Problem {
    Fault fault = Fault::none;
    char message[160] = {};
    char hint[160] = {};

    explicit operator bool() const { return fault != Fault::none; }
};

// An interval as PostgreSQL stores it.
struct Span {
    std::int32_t months = 0;
    std::int32_t days = 0;
    std::int64_t usec = 0;
};

// Limits. Names are bytes; intervals are compared as PostgreSQL compares them (a month is
// 30 days, a day 24 hours).
inline constexpr std::size_t kMaxQueueName = 128;
inline constexpr std::size_t kMaxWorkerName = 256;
inline constexpr std::int64_t kMaxBatch = 10000;
inline constexpr std::int64_t kMaxReapBatch = 100000;
inline constexpr std::int64_t kMaxAttempts = 1000000;
inline constexpr std::int32_t kMaxRunning = 1000000;
inline constexpr std::int32_t kMaxSnoozes = 1000000;
inline constexpr std::int64_t kMaxDependsOn = 10000;  // jobs one enqueue may depend on
inline constexpr std::int64_t kMaxSpanUsec = std::int64_t(3650) * 86400 * 1000000;  // 10 years

// Normalised length of an interval in microseconds, saturating at +/- kMaxSpanUsec * 4.
std::int64_t span_usec(const Span& span);

// A name (queue or worker): not null, not empty, at most max_bytes, no control characters.
Problem check_name(const char* what, const char* value, std::size_t length, std::size_t max_bytes,
                   bool is_null);

// An integer that must be positive and at most max.
Problem check_positive(const char* what, std::int64_t value, std::int64_t max, bool is_null);

// An interval that must be positive (allow_zero: at least zero) and at most ten years.
Problem check_span(const char* what, const Span& value, bool allow_zero, bool is_null);

// An interval added to a time (now() + lease, now() + retry_in): PostgreSQL adds months as
// calendar months and days as calendar days in the session's time zone (23 to 25 hours across a
// daylight saving change), so a span is as long as span_usec says, whatever the date and zone,
// only when it has no months and its days and time do not differ in sign. Refuses any other
// span, then applies check_span.
Problem check_added_span(const char* what, const Span& value, bool allow_zero, bool is_null);

// A non-null argument that has no other rule.
Problem check_not_null(const char* what, bool is_null);

// backoff_base <= backoff_max.
Problem check_backoff_order(const Span& base, const Span& max);

}  // namespace jobcap::core
