#include "core/rules.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

using namespace jobcap::core;

namespace {

Problem name(const std::string& s, bool is_null = false)
{
    return check_name("queue", s.data(), s.size(), kMaxQueueName, is_null);
}

Span seconds(std::int64_t s)
{
    return Span{0, 0, s * 1000000};
}

}  // namespace

TEST(Names, AcceptPrintableNames)
{
    EXPECT_FALSE(name("mail"));
    EXPECT_FALSE(name("ocr.documents/high-priority"));
    EXPECT_FALSE(name("\xc3\xa9t\xc3\xa9"));  // UTF-8 is fine
    EXPECT_FALSE(name(std::string(kMaxQueueName, 'q')));
}

TEST(Names, RejectNullEmptyLongAndControl)
{
    Problem p = name("", true);
    EXPECT_EQ(p.fault, Fault::null_value);
    EXPECT_STREQ(p.message, "queue must not be null");

    p = name("");
    EXPECT_EQ(p.fault, Fault::invalid_value);
    EXPECT_STREQ(p.message, "queue must not be empty");

    p = name(std::string(kMaxQueueName + 1, 'q'));
    EXPECT_EQ(p.fault, Fault::invalid_value);
    EXPECT_STREQ(p.message, "queue is too long (129 bytes, at most 128)");

    EXPECT_EQ(name("a\nb").fault, Fault::invalid_value);
    EXPECT_EQ(name("tab\there").fault, Fault::invalid_value);
    EXPECT_EQ(name("del\x7f").fault, Fault::invalid_value);
    EXPECT_STREQ(name("bell\a").hint, "Names are printable text.");
}

TEST(Counts, PositiveAndBounded)
{
    EXPECT_FALSE(check_positive("batch", 1, kMaxBatch, false));
    EXPECT_FALSE(check_positive("batch", kMaxBatch, kMaxBatch, false));
    EXPECT_EQ(check_positive("batch", 0, kMaxBatch, false).fault, Fault::invalid_value);
    EXPECT_STREQ(check_positive("batch", -5, kMaxBatch, false).message,
                 "batch must be positive, not -5");
    Problem p = check_positive("batch", kMaxBatch + 1, kMaxBatch, false);
    EXPECT_EQ(p.fault, Fault::out_of_range);
    EXPECT_STREQ(p.message, "batch must be at most 10000, not 10001");
    EXPECT_EQ(check_positive("batch", 1, kMaxBatch, true).fault, Fault::null_value);
}

TEST(Spans, NormaliseLikePostgres)
{
    EXPECT_EQ(span_usec(Span{1, 0, 0}), std::int64_t(30) * 86400 * 1000000);
    EXPECT_EQ(span_usec(Span{0, 2, 5}), std::int64_t(2) * 86400 * 1000000 + 5);
    EXPECT_EQ(span_usec(Span{1, -30, 0}), 0);
    // Saturates instead of overflowing.
    EXPECT_EQ(span_usec(Span{INT32_MAX, INT32_MAX, INT64_MAX}), kMaxSpanUsec * 4);
    EXPECT_EQ(span_usec(Span{INT32_MIN, INT32_MIN, INT64_MIN}), -kMaxSpanUsec * 4);
}

TEST(Spans, LeaseMustBePositiveAndSane)
{
    EXPECT_FALSE(check_span("lease", seconds(300), false, false));
    EXPECT_STREQ(check_span("lease", seconds(0), false, false).message, "lease must be positive");
    EXPECT_STREQ(check_span("lease", seconds(-1), false, false).message, "lease must be positive");
    // One month minus 31 days is negative, whatever its parts look like.
    EXPECT_TRUE(check_span("lease", Span{1, -31, 0}, false, false));
    Problem p = check_span("lease", Span{12 * 11, 0, 0}, false, false);
    EXPECT_EQ(p.fault, Fault::out_of_range);
    EXPECT_STREQ(p.message, "lease must be at most 10 years");
    EXPECT_EQ(check_span("lease", Span{}, false, true).fault, Fault::null_value);
}

TEST(Spans, BackoffMayBeZero)
{
    EXPECT_FALSE(check_span("backoff_base", seconds(0), true, false));
    EXPECT_STREQ(check_span("backoff_base", seconds(-1), true, false).message,
                 "backoff_base must not be negative");
}

TEST(Spans, BackoffOrder)
{
    EXPECT_FALSE(check_backoff_order(seconds(10), seconds(3600)));
    EXPECT_FALSE(check_backoff_order(seconds(10), seconds(10)));
    Problem p = check_backoff_order(seconds(3601), Span{0, 0, 3600000000});
    EXPECT_EQ(p.fault, Fault::invalid_value);
    EXPECT_STREQ(p.message, "backoff_base must not exceed backoff_max");
    // A day is more than 23 hours, however it is written.
    EXPECT_TRUE(check_backoff_order(Span{0, 1, 0}, seconds(23 * 3600)));
}

TEST(Problems, ArePlainData)
{
    // Frames that an ereport can jump over may hold a Problem: it must have no destructor.
    static_assert(std::is_trivially_destructible_v<Problem>);
    static_assert(std::is_trivially_destructible_v<Span>);
}
