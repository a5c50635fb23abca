#include "cpp_only.hpp"

#include "report.hpp"

#include <cstdarg>
#include <cstdio>

namespace jobcap::core {
namespace {

const char* jobs(std::int64_t n)
{
    return n == 1 ? "job" : "jobs";
}
const char* attempts(std::int64_t n)
{
    return n == 1 ? "attempt" : "attempts";
}

// Appends to out at *used, never past size; keeps *used at most size - 1.
__attribute__((format(printf, 4, 5))) void append(char* out, std::size_t size, std::size_t* used,
                                                  const char* format, ...)
{
    if (*used + 1 >= size)
        return;
    va_list args;
    va_start(args, format);
    int n = std::vsnprintf(out + *used, size - *used, format, args);
    va_end(args);
    if (n < 0)
        return;
    *used += static_cast<std::size_t>(n);
    if (*used >= size)
        *used = size - 1;
}

}  // namespace

bool backlog_growing(const QueueWindow& w) noexcept
{
    return w.due_before >= 0 && w.due > w.due_before && w.oldest_due_sec > w.window_sec;
}

bool got_worse(const QueueWindow& w) noexcept
{
    return w.new_dead > 0 || w.lease_jobs > 0 || backlog_growing(w);
}

void format_age(std::int64_t seconds, char* out, std::size_t out_size) noexcept
{
    if (seconds < 0)
        seconds = 0;
    if (seconds < 120)
        std::snprintf(out, out_size, "%lld s", static_cast<long long>(seconds));
    else if (seconds < 2 * 3600)
        std::snprintf(out, out_size, "%lld min", static_cast<long long>(seconds / 60));
    else if (seconds < 2 * 86400)
        std::snprintf(out, out_size, "%lld h", static_cast<long long>(seconds / 3600));
    else
        std::snprintf(out, out_size, "%lld d", static_cast<long long>(seconds / 86400));
}

bool report_line(const QueueWindow& w, char* out, std::size_t out_size) noexcept
{
    if (out_size == 0)
        return false;
    out[0] = '\0';
    if (!got_worse(w))
        return false;

    std::size_t used = 0;
    const char* sep = "";
    if (w.new_dead > 0) {
        append(out, out_size, &used, "%lld %s went dead (%lld dead in all)",
               static_cast<long long>(w.new_dead), jobs(w.new_dead),
               static_cast<long long>(w.dead));
        sep = "; ";
    }
    if (w.failed_attempts > 0) {
        append(out, out_size, &used, "%s%lld %s failed %lld %s", sep,
               static_cast<long long>(w.failing_jobs), jobs(w.failing_jobs),
               static_cast<long long>(w.failed_attempts), attempts(w.failed_attempts));
        sep = "; ";
    }
    if (w.lease_jobs > 0) {
        append(out, out_size, &used,
               "%s%lld %s lost %lld %s to expired leases or rolled-back claims", sep,
               static_cast<long long>(w.lease_jobs), jobs(w.lease_jobs),
               static_cast<long long>(w.lease_attempts), attempts(w.lease_attempts));
        sep = "; ";
    }
    if (backlog_growing(w)) {
        char age[32];
        format_age(w.oldest_due_sec, age, sizeof age);
        append(out, out_size, &used, "%sbacklog %lld due (was %lld), oldest waiting %s", sep,
               static_cast<long long>(w.due), static_cast<long long>(w.due_before), age);
    }
    return true;
}

}  // namespace jobcap::core
