#include "core/report.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

using namespace jobcap::core;

namespace {

std::string line(const QueueWindow& w, std::size_t size = 512)
{
    char out[512];
    if (!report_line(w, out, size))
        return "<quiet>";
    return out;
}

QueueWindow window(std::int64_t window_sec = 60)
{
    QueueWindow w;
    w.window_sec = window_sec;
    return w;
}

}  // namespace

TEST(Report, QuietWhenNothingGotWorse)
{
    QueueWindow w = window();
    w.dead = 7;  // old dead jobs are not news
    w.due = 50;  // a backlog that is not growing
    w.due_before = 50;
    w.oldest_due_sec = 600;
    EXPECT_FALSE(got_worse(w));
    EXPECT_EQ(line(w), "<quiet>");
}

TEST(Report, OnePoisonJobIsOneJobNotItsAttempts)
{
    QueueWindow w = window();
    w.new_dead = 1;
    w.dead = 1;
    w.lease_jobs = 1;
    w.lease_attempts = 3;
    EXPECT_EQ(line(w),
              "1 job went dead (1 dead in all); 1 job lost 3 attempts to expired leases or "
              "rolled-back claims");
}

TEST(Report, PluralsAndEachPartAlone)
{
    QueueWindow w = window();
    w.new_dead = 4;
    w.dead = 9;
    EXPECT_EQ(line(w), "4 jobs went dead (9 dead in all)");

    w = window();
    w.lease_jobs = 2;
    w.lease_attempts = 1;  // cannot really be fewer than jobs; the wording still holds
    EXPECT_EQ(line(w), "2 jobs lost 1 attempt to expired leases or rolled-back claims");
}

TEST(Report, BacklogGrowsOnlyWhenLargerAndOlderThanTheWindow)
{
    QueueWindow w = window(60);
    w.due = 120;
    w.due_before = 80;
    w.oldest_due_sec = 300;
    EXPECT_TRUE(backlog_growing(w));
    EXPECT_EQ(line(w), "backlog 120 due (was 80), oldest waiting 5 min");

    w.oldest_due_sec = 59;  // larger but drained within a window: a burst, not a backlog
    EXPECT_FALSE(backlog_growing(w));
    w.oldest_due_sec = 300;
    w.due = 80;  // old but not larger
    EXPECT_FALSE(backlog_growing(w));
    w.due = 120;
    w.due_before = -1;  // first report: a baseline, no comparison
    EXPECT_FALSE(backlog_growing(w));
}

TEST(Report, AllThreeInOneLine)
{
    QueueWindow w = window(10);
    w.new_dead = 1;
    w.dead = 2;
    w.lease_jobs = 3;
    w.lease_attempts = 4;
    w.due = 5;
    w.due_before = 1;
    w.oldest_due_sec = 7200;
    EXPECT_EQ(line(w),
              "1 job went dead (2 dead in all); 3 jobs lost 4 attempts to expired leases or "
              "rolled-back claims; "
              "backlog 5 due (was 1), oldest waiting 2 h");
}

TEST(Report, CutToTheBufferAndTerminated)
{
    QueueWindow w = window();
    w.new_dead = 1;
    w.dead = 1;
    w.lease_jobs = 1;
    w.lease_attempts = 3;
    char out[16];
    std::memset(out, 'x', sizeof out);
    EXPECT_TRUE(report_line(w, out, sizeof out));
    EXPECT_EQ(std::strlen(out), sizeof out - 1);
    EXPECT_EQ(std::string(out), "1 job went dead");
    EXPECT_FALSE(report_line(w, out, 0));
}

TEST(Report, Ages)
{
    char out[32];
    format_age(-5, out, sizeof out);
    EXPECT_STREQ(out, "0 s");
    format_age(119, out, sizeof out);
    EXPECT_STREQ(out, "119 s");
    format_age(120, out, sizeof out);
    EXPECT_STREQ(out, "2 min");
    format_age(7199, out, sizeof out);
    EXPECT_STREQ(out, "119 min");
    format_age(7200, out, sizeof out);
    EXPECT_STREQ(out, "2 h");
    format_age(3 * 86400, out, sizeof out);
    EXPECT_STREQ(out, "3 d");
}

TEST(Report, FailuresCountJobsBesideAttemptsButAreNotNewsAlone)
{
    QueueWindow w = window();
    w.failing_jobs = 4;
    w.failed_attempts = 40;
    EXPECT_FALSE(got_worse(w));
    EXPECT_EQ(line(w), "<quiet>");
    w.new_dead = 4;
    w.dead = 4;
    EXPECT_EQ(line(w), "4 jobs went dead (4 dead in all); 4 jobs failed 40 attempts");
    w.failing_jobs = 1;
    w.failed_attempts = 1;
    w.lease_jobs = 1;
    w.lease_attempts = 2;
    EXPECT_EQ(line(w),
              "4 jobs went dead (4 dead in all); 1 job failed 1 attempt; 1 job lost 2 "
              "attempts to expired leases or rolled-back claims");
}
