#include "cpp_only.hpp"

#include "stats.hpp"

#include <cmath>
#include <cstdio>

namespace jobcap::core {

int latency_bin(double seconds) noexcept
{
    double ms = seconds * 1000.0;
    if (!(ms >= 1.0))  // also NaN
        return 0;
    double k = 1.0 + std::floor(kLatencyBinsPerDoubling * std::log2(ms));
    return k >= kLatencyBins - 1 ? kLatencyBins - 1 : static_cast<int>(k);
}

double latency_bin_lower(int bin) noexcept
{
    if (bin <= 0)
        return 0.0;
    return std::exp2(static_cast<double>(bin - 1) / kLatencyBinsPerDoubling) / 1000.0;
}

double latency_bin_upper(int bin) noexcept
{
    if (bin >= kLatencyBins - 1)
        return latency_bin_lower(kLatencyBins - 1);
    if (bin < 0)
        bin = 0;
    return std::exp2(static_cast<double>(bin) / kLatencyBinsPerDoubling) / 1000.0;
}

bool latency_quantile(const std::int16_t* bins, const std::int64_t* jobs, int n, double q,
                      double* seconds) noexcept
{
    std::int64_t total = 0;
    for (int i = 0; i < n; ++i)
        if (bins[i] >= 0 && bins[i] < kLatencyBins && jobs[i] > 0)
            total += jobs[i];
    if (total == 0 || !(q > 0.0))
        return false;
    if (q > 1.0)
        q = 1.0;
    int last = n - 1;
    while (bins[last] < 0 || bins[last] >= kLatencyBins || jobs[last] <= 0)
        --last;
    double rank = q * static_cast<double>(total);
    double below = 0.0;
    for (int i = 0; i <= last; ++i) {
        if (bins[i] < 0 || bins[i] >= kLatencyBins || jobs[i] <= 0)
            continue;
        double here = static_cast<double>(jobs[i]);
        if (below + here < rank && i != last) {
            below += here;
            continue;
        }
        double f = (rank - below) / here;
        if (f < 0.0)
            f = 0.0;
        if (f > 1.0)
            f = 1.0;
        double lo = latency_bin_lower(bins[i]);
        double hi = latency_bin_upper(bins[i]);
        if (bins[i] == 0)
            *seconds = hi * f;
        else
            *seconds = lo * std::pow(hi / lo, f);
        return true;
    }
    return false;  // cannot happen: the last counted bin always takes the rank
}

namespace {

bool name_char(char c, bool first, bool colon) noexcept
{
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_')
        return true;
    if (colon && c == ':')
        return true;
    return !first && c >= '0' && c <= '9';
}

bool valid_name(const char* name, bool colon) noexcept
{
    if (name == nullptr || name[0] == '\0')
        return false;
    for (const char* p = name; *p != '\0'; ++p)
        if (!name_char(*p, p == name, colon))
            return false;
    return true;
}

std::size_t escape(const char* in, std::size_t len, char* out, bool quote) noexcept
{
    std::size_t o = 0;
    for (std::size_t i = 0; i < len; ++i) {
        char c = in[i];
        if (c == '\\') {
            out[o++] = '\\';
            out[o++] = '\\';
        } else if (c == '\n') {
            out[o++] = '\\';
            out[o++] = 'n';
        } else if (quote && c == '"') {
            out[o++] = '\\';
            out[o++] = '"';
        } else {
            out[o++] = c;
        }
    }
    out[o] = '\0';
    return o;
}

}  // namespace

bool valid_metric_name(const char* name) noexcept
{
    return valid_name(name, true);
}

bool valid_label_name(const char* name) noexcept
{
    return valid_name(name, false) && !(name[0] == '_' && name[1] == '_');
}

std::size_t escape_label_value(const char* in, std::size_t len, char* out) noexcept
{
    return escape(in, len, out, true);
}

std::size_t escape_help(const char* in, std::size_t len, char* out) noexcept
{
    return escape(in, len, out, false);
}

void format_sample_value(double value, char* out, std::size_t out_size) noexcept
{
    if (out_size == 0)
        return;
    if (std::isnan(value))
        std::snprintf(out, out_size, "NaN");
    else if (std::isinf(value))
        std::snprintf(out, out_size, value > 0 ? "+Inf" : "-Inf");
    else if (value == std::floor(value) && std::fabs(value) < 9.007199254740992e15)
        std::snprintf(out, out_size, "%lld", static_cast<long long>(value));
    else
        std::snprintf(out, out_size, "%.17g", value);
}

}  // namespace jobcap::core
