// The arithmetic of jobcap's statistics, without PostgreSQL: the claim-latency histogram kept per
// queue and minute (its bins, and quantiles read from it), and the pieces of the Prometheus text
// exposition format (version 0.0.4) that jobcap.metrics() writes. Everything here is noexcept and
// writes into the caller's buffers, so the frames that call PostgreSQL hold plain data only.
#pragma once

#include <cstddef>
#include <cstdint>

namespace jobcap::core {

// Claim latency bins: bin 0 holds latencies under 1 ms; bin k >= 1 holds [2^((k-1)/4), 2^(k/4))
// ms, four bins per doubling (a bin is 19% wide); the last bin holds everything from
// 2^((kLatencyBins-2)/4) ms (37 hours) on. The SQL that fills the bins (jobcap.refresh_stats)
// uses the same formula: JOBCAP_LATENCY_BIN_SQL in src/housekeeping/stats.cpp.
inline constexpr int kLatencyBinsPerDoubling = 4;
inline constexpr int kLatencyBins = 110;

// The bin of a latency in seconds (negative counts as 0).
int latency_bin(double seconds) noexcept;

// The bounds of bin k in seconds: [lower, upper). The last bin's upper bound is its lower bound
// (it is open-ended, so no value inside it can be told apart).
double latency_bin_lower(int bin) noexcept;
double latency_bin_upper(int bin) noexcept;

// The q-quantile (0 < q <= 1) of a histogram given sparsely: n bins, bins[i] ascending, jobs[i]
// jobs in bins[i] (bins out of range are ignored). Interpolates geometrically inside the bin
// that holds the rank (linearly in bin 0), so the error is at most one bin width (19%).
// Returns false when the histogram is empty.
bool latency_quantile(const std::int16_t* bins, const std::int64_t* jobs, int n, double q,
                      double* seconds) noexcept;

// Prometheus text format. Metric names match [a-zA-Z_:][a-zA-Z0-9_:]*, label names
// [a-zA-Z_][a-zA-Z0-9_]* and must not begin with "__" (reserved).
bool valid_metric_name(const char* name) noexcept;
bool valid_label_name(const char* name) noexcept;

// Escapes a label value (backslash, double quote and line feed become \\, \" and \n) or a HELP
// text (backslash and line feed only). out must have room for 2 * len + 1 bytes; the result is
// NUL-terminated. Returns the escaped length.
std::size_t escape_label_value(const char* in, std::size_t len, char* out) noexcept;
std::size_t escape_help(const char* in, std::size_t len, char* out) noexcept;

// A sample value as the format wants it: integers without exponent or decimals ("42"), other
// finite values with enough digits to round-trip, and "NaN", "+Inf", "-Inf".
void format_sample_value(double value, char* out, std::size_t out_size) noexcept;

}  // namespace jobcap::core
