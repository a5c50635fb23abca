#include "core/backoff.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

using jobcap::core::backoff_ceiling;
using jobcap::core::backoff_delay;

namespace {
constexpr std::int64_t kSecond = 1000000;
}

TEST(Backoff, DoublesFromBaseUpToMax)
{
    EXPECT_EQ(backoff_ceiling(1, 10 * kSecond, 3600 * kSecond), 10 * kSecond);
    EXPECT_EQ(backoff_ceiling(2, 10 * kSecond, 3600 * kSecond), 20 * kSecond);
    EXPECT_EQ(backoff_ceiling(3, 10 * kSecond, 3600 * kSecond), 40 * kSecond);
    EXPECT_EQ(backoff_ceiling(9, 10 * kSecond, 3600 * kSecond), 2560 * kSecond);
    EXPECT_EQ(backoff_ceiling(10, 10 * kSecond, 3600 * kSecond), 3600 * kSecond);
    EXPECT_EQ(backoff_ceiling(11, 10 * kSecond, 3600 * kSecond), 3600 * kSecond);
}

TEST(Backoff, NeverOverflowsForHugeAttempts)
{
    constexpr auto big = std::numeric_limits<std::int64_t>::max();
    EXPECT_EQ(backoff_ceiling(1000000, kSecond, 3600 * kSecond), 3600 * kSecond);
    EXPECT_EQ(backoff_ceiling(big, kSecond, big), big);
    EXPECT_EQ(backoff_ceiling(200, big / 3, big), big);
}

TEST(Backoff, ZeroOrNegativeInputsMeanNoDelay)
{
    EXPECT_EQ(backoff_ceiling(5, 0, 3600 * kSecond), 0);
    EXPECT_EQ(backoff_ceiling(5, kSecond, 0), 0);
    EXPECT_EQ(backoff_ceiling(5, -kSecond, 3600 * kSecond), 0);
    EXPECT_EQ(backoff_delay(5, 0, 0, 0.7), 0);
}

TEST(Backoff, AttemptBelowOneIsTheFirst)
{
    EXPECT_EQ(backoff_ceiling(0, 10 * kSecond, 3600 * kSecond), 10 * kSecond);
    EXPECT_EQ(backoff_ceiling(-3, 10 * kSecond, 3600 * kSecond), 10 * kSecond);
}

TEST(Backoff, BaseAboveMaxIsClampedToMax)
{
    EXPECT_EQ(backoff_ceiling(1, 100 * kSecond, 30 * kSecond), 30 * kSecond);
}

TEST(Backoff, JitterStaysInUpperHalf)
{
    const std::int64_t ceiling = 40 * kSecond;
    EXPECT_EQ(backoff_delay(3, 10 * kSecond, 3600 * kSecond, 0.0), ceiling / 2);
    EXPECT_EQ(backoff_delay(3, 10 * kSecond, 3600 * kSecond, 0.5), ceiling * 3 / 4);
    EXPECT_LT(backoff_delay(3, 10 * kSecond, 3600 * kSecond, 0.999999), ceiling);
    for (double u = 0.0; u < 1.0; u += 0.01) {
        auto d = backoff_delay(7, kSecond, 3600 * kSecond, u);
        EXPECT_GE(d, 32 * kSecond);
        EXPECT_LE(d, 64 * kSecond);
    }
}

TEST(Backoff, OutOfRangeRandomIsClamped)
{
    EXPECT_EQ(backoff_delay(1, 10 * kSecond, 60 * kSecond, -1.0), 5 * kSecond);
    EXPECT_EQ(backoff_delay(1, 10 * kSecond, 60 * kSecond, 7.0), 10 * kSecond);
}
