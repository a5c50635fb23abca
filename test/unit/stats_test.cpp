#include "core/stats.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

using namespace jobcap::core;

namespace {

std::string label(const std::string& in)
{
    std::vector<char> out(2 * in.size() + 1);
    std::size_t n = escape_label_value(in.data(), in.size(), out.data());
    EXPECT_EQ(n, std::strlen(out.data()));
    return out.data();
}

std::string help(const std::string& in)
{
    std::vector<char> out(2 * in.size() + 1);
    escape_help(in.data(), in.size(), out.data());
    return out.data();
}

std::string value(double v)
{
    char out[64];
    format_sample_value(v, out, sizeof out);
    return out;
}

// A histogram of the given latencies (seconds), as the refresh would bin them.
struct Histogram {
    std::vector<std::int16_t> bins;
    std::vector<std::int64_t> jobs;
    explicit Histogram(const std::vector<double>& latencies)
    {
        std::vector<std::int64_t> dense(kLatencyBins, 0);
        for (double s : latencies)
            dense[latency_bin(s)]++;
        for (int b = 0; b < kLatencyBins; ++b)
            if (dense[b] > 0) {
                bins.push_back(static_cast<std::int16_t>(b));
                jobs.push_back(dense[b]);
            }
    }
    double quantile(double q) const
    {
        double s = -1;
        int n = static_cast<int>(bins.size());
        EXPECT_TRUE(latency_quantile(bins.data(), jobs.data(), n, q, &s));
        return s;
    }
};

}  // namespace

TEST(LatencyBins, FourPerDoublingFromOneMillisecond)
{
    EXPECT_EQ(latency_bin(0.0), 0);
    EXPECT_EQ(latency_bin(-5.0), 0);
    EXPECT_EQ(latency_bin(NAN), 0);
    EXPECT_EQ(latency_bin(0.0009), 0);
    EXPECT_EQ(latency_bin(0.001), 1);
    EXPECT_EQ(latency_bin(0.0011), 1);
    EXPECT_EQ(latency_bin(0.0012), 2);  // 2^(1/4) ms = 1.189 ms
    EXPECT_EQ(latency_bin(0.0021), 5);  // past 2 ms
    EXPECT_EQ(latency_bin(1.0), 40);    // 1000 ms: 4 * log2(1000) = 39.86
    EXPECT_EQ(latency_bin(1e9), kLatencyBins - 1);
    for (int b = 1; b < kLatencyBins - 1; ++b) {
        double mid = std::sqrt(latency_bin_lower(b) * latency_bin_upper(b));
        EXPECT_EQ(latency_bin(mid), b) << "bin " << b;
        EXPECT_NEAR(latency_bin_upper(b) / latency_bin_lower(b), std::exp2(0.25), 1e-12);
    }
    EXPECT_EQ(latency_bin_upper(kLatencyBins - 1), latency_bin_lower(kLatencyBins - 1));
    EXPECT_GT(latency_bin_lower(kLatencyBins - 1), 36 * 3600.0);
}

TEST(LatencyQuantile, WithinOneBinOfTheTruth)
{
    // 100 jobs claimed after 10 ms ... 1000 ms, evenly: p50 ~ 505 ms, p95 ~ 955 ms.
    std::vector<double> l;
    for (int i = 1; i <= 100; ++i)
        l.push_back(i * 0.010);
    Histogram h(l);
    EXPECT_NEAR(h.quantile(0.5), 0.505, 0.505 * 0.19);
    EXPECT_NEAR(h.quantile(0.95), 0.955, 0.955 * 0.19);
    EXPECT_LE(h.quantile(1.0), latency_bin_upper(latency_bin(1.0)));
}

TEST(LatencyQuantile, OneValueStaysInItsBin)
{
    Histogram h({2.0, 2.0, 2.0});
    double p50 = h.quantile(0.5);
    EXPECT_GE(p50, latency_bin_lower(latency_bin(2.0)));
    EXPECT_LT(p50, latency_bin_upper(latency_bin(2.0)));
}

TEST(LatencyQuantile, FewSlowJobsShowAtP95NotP50)
{
    std::vector<double> l(95, 0.002);
    l.insert(l.end(), 5, 120.0);
    Histogram h(l);
    EXPECT_LT(h.quantile(0.5), 0.003);
    EXPECT_LT(h.quantile(0.95), 0.003);
    EXPECT_GT(h.quantile(0.96), 100.0);
}

TEST(LatencyQuantile, EmptyAndOutOfRange)
{
    double s = 7;
    EXPECT_FALSE(latency_quantile(nullptr, nullptr, 0, 0.5, &s));
    std::int16_t bins[] = {-1, 500, 3};
    std::int64_t jobs[] = {10, 10, 0};
    EXPECT_FALSE(latency_quantile(bins, jobs, 3, 0.5, &s));
    EXPECT_EQ(s, 7);
    std::int16_t bins2[] = {0, 5, 500};
    std::int64_t jobs2[] = {0, 4, 9};
    ASSERT_TRUE(latency_quantile(bins2, jobs2, 3, 0.5, &s));  // the bad last bin is ignored
    EXPECT_GE(s, latency_bin_lower(5));
    EXPECT_LE(s, latency_bin_upper(5));
}

TEST(Prometheus, Names)
{
    EXPECT_TRUE(valid_metric_name("jobcap_jobs"));
    EXPECT_TRUE(valid_metric_name("a:b_c9"));
    EXPECT_TRUE(valid_metric_name("_x"));
    EXPECT_FALSE(valid_metric_name(""));
    EXPECT_FALSE(valid_metric_name("9a"));
    EXPECT_FALSE(valid_metric_name("a-b"));
    EXPECT_FALSE(valid_metric_name("a b"));
    EXPECT_TRUE(valid_label_name("queue"));
    EXPECT_FALSE(valid_label_name("a:b"));
    EXPECT_FALSE(valid_label_name("__name__"));
    EXPECT_FALSE(valid_label_name("1x"));
}

TEST(Prometheus, LabelValuesAreEscaped)
{
    EXPECT_EQ(label("media"), "media");
    EXPECT_EQ(label("a\"b"), "a\\\"b");
    EXPECT_EQ(label("back\\slash"), "back\\\\slash");
    EXPECT_EQ(label("two\nlines"), "two\\nlines");
    EXPECT_EQ(label("\\\"\n"), "\\\\\\\"\\n");
    EXPECT_EQ(label("ünïcode {x=\"1\"}"), "ünïcode {x=\\\"1\\\"}");
    EXPECT_EQ(label(""), "");
}

TEST(Prometheus, HelpKeepsQuotes)
{
    EXPECT_EQ(help("say \"dead\"\nand \\"), "say \"dead\"\\nand \\\\");
}

TEST(Prometheus, SampleValues)
{
    EXPECT_EQ(value(0), "0");
    EXPECT_EQ(value(40), "40");
    EXPECT_EQ(value(-3), "-3");
    EXPECT_EQ(value(1e15), "1000000000000000");
    EXPECT_EQ(value(0.25), "0.25");
    EXPECT_EQ(std::stod(value(0.1)), 0.1);
    EXPECT_EQ(value(NAN), "NaN");
    EXPECT_EQ(value(INFINITY), "+Inf");
    EXPECT_EQ(value(-INFINITY), "-Inf");
    EXPECT_EQ(std::stod(value(1e300)), 1e300);
}
