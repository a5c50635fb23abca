#include "core/cron.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>

using jobcap::core::cron_latest;
using jobcap::core::cron_next;
using jobcap::core::CronSpec;
using jobcap::core::days_from_civil;
using jobcap::core::parse_cron;
using jobcap::core::Problem;

namespace {

CronSpec parsed(const char* text)
{
    CronSpec spec;
    Problem p = parse_cron(text, std::strlen(text), &spec);
    EXPECT_FALSE(p) << text << ": " << p.message;
    return spec;
}

std::string problem_of(const char* text)
{
    CronSpec spec;
    Problem p = parse_cron(text, std::strlen(text), &spec);
    return p ? std::string(p.message) : std::string();
}

// Minutes since the epoch of a UTC civil time.
std::int64_t at(int y, int mo, int d, int h, int mi)
{
    return days_from_civil(y, mo, d) * 1440 + h * 60 + mi;
}

// A limit far beyond every test's dates.
constexpr std::int64_t kNoLimit = INT64_MAX / 2;

std::int64_t next_of(const char* text, std::int64_t after)
{
    std::int64_t next = -1;
    EXPECT_TRUE(cron_next(parsed(text), after, kNoLimit, &next)) << text;
    return next;
}

}  // namespace

TEST(Cron, CivilDays)
{
    EXPECT_EQ(days_from_civil(1970, 1, 1), 0);
    EXPECT_EQ(days_from_civil(2000, 3, 1), 11017);
    std::int64_t y = 0;
    int m = 0;
    int d = 0;
    jobcap::core::civil_from_days(days_from_civil(2024, 2, 29), &y, &m, &d);
    EXPECT_EQ(y, 2024);
    EXPECT_EQ(m, 2);
    EXPECT_EQ(d, 29);
    jobcap::core::civil_from_days(-1, &y, &m, &d);
    EXPECT_EQ(y, 1969);
    EXPECT_EQ(m, 12);
    EXPECT_EQ(d, 31);
}

TEST(Cron, FieldsRangesStepsLists)
{
    CronSpec s = parsed("*/15 9-17 * * *");
    EXPECT_EQ(s.minutes, (1ull << 0) | (1ull << 15) | (1ull << 30) | (1ull << 45));
    EXPECT_EQ(s.hours, 0x3fe00u);
    EXPECT_TRUE(s.any_day);
    EXPECT_TRUE(s.any_weekday);
    s = parsed("0,30 1-10/3 1,15 */6 1-5");
    EXPECT_EQ(s.minutes, (1ull << 0) | (1ull << 30));
    EXPECT_EQ(s.hours, (1u << 1) | (1u << 4) | (1u << 7) | (1u << 10));
    EXPECT_EQ(s.days, (1u << 1) | (1u << 15));
    EXPECT_EQ(s.months, (1u << 1) | (1u << 7));
    EXPECT_EQ(s.weekdays, 0x3e);
    EXPECT_FALSE(s.any_day);
    EXPECT_FALSE(s.any_weekday);
    // a/n runs from a to the end of the field.
    s = parsed("50/5 * * * *");
    EXPECT_EQ(s.minutes, (1ull << 50) | (1ull << 55));
    // Surrounding and repeated blanks are fine.
    s = parsed("  5   4\t* * *  ");
    EXPECT_EQ(s.minutes, 1ull << 5);
    EXPECT_EQ(s.hours, 1u << 4);
}

TEST(Cron, NamesAndSunday)
{
    CronSpec s = parsed("0 0 * JAN-mar,Dec mon-FRI");
    EXPECT_EQ(s.months, (1u << 1) | (1u << 2) | (1u << 3) | (1u << 12));
    EXPECT_EQ(s.weekdays, 0x3e);
    EXPECT_EQ(parsed("0 0 * * 7").weekdays, 1u);
    EXPECT_EQ(parsed("0 0 * * sun").weekdays, 1u);
    EXPECT_EQ(parsed("0 0 * * 5-7").weekdays, (1u << 0) | (1u << 5) | (1u << 6));
    EXPECT_EQ(parsed("@daily").hours, 1u);
    EXPECT_EQ(parsed("@HOURLY").hours, 0xffffffu);
    EXPECT_EQ(parsed("@weekly").weekdays, 1u);
}

TEST(Cron, BadExpressions)
{
    EXPECT_NE(problem_of("* * * *").find("4 fields, not five"), std::string::npos);
    EXPECT_NE(problem_of("").find("0 fields"), std::string::npos);
    EXPECT_NE(problem_of("* * * * * *").find("more than five"), std::string::npos);
    EXPECT_NE(problem_of("60 * * * *").find("minute field \"60\" is out of range 0-59"),
              std::string::npos);
    EXPECT_NE(problem_of("* 24 * * *").find("hour field"), std::string::npos);
    EXPECT_NE(problem_of("* * 0 * *").find("out of range 1-31"), std::string::npos);
    EXPECT_NE(problem_of("* * * 13 *").find("month field"), std::string::npos);
    EXPECT_NE(problem_of("* * * * 8").find("day of week field"), std::string::npos);
    EXPECT_NE(problem_of("5-1 * * * *").find("runs backwards"), std::string::npos);
    EXPECT_NE(problem_of("*/0 * * * *").find("step"), std::string::npos);
    EXPECT_NE(problem_of("1, * * * *").find("comma"), std::string::npos);
    EXPECT_NE(problem_of("x * * * *").find("not a number"), std::string::npos);
    EXPECT_NE(problem_of("* * * janu *").find("not a number"), std::string::npos);
    EXPECT_NE(problem_of("* * * * mon-").find("without an end"), std::string::npos);
    EXPECT_NE(problem_of("1-2-3 * * * *").find("not a number"), std::string::npos);
    EXPECT_NE(problem_of("99999999999 * * * *").find("minute"), std::string::npos);
    EXPECT_NE(problem_of("@often").find("unknown macro"), std::string::npos);
    EXPECT_NE(problem_of("0 0 30 2 *").find("no month"), std::string::npos);
    EXPECT_NE(problem_of(std::string(300, '*').c_str()).find("longer than"), std::string::npos);
    // 31 only in months that have it is fine; so is 30 February when a weekday may match.
    EXPECT_EQ(problem_of("0 0 31 1-3 *"), "");
    EXPECT_EQ(problem_of("0 0 30 2 mon"), "");
    EXPECT_EQ(problem_of("0 0 29 2 *"), "");
}

TEST(Cron, NextSlot)
{
    std::int64_t t = at(2026, 12, 1, 15, 7);
    EXPECT_EQ(next_of("* * * * *", t), t + 1);
    EXPECT_EQ(next_of("*/15 * * * *", t), at(2026, 12, 1, 15, 15));
    EXPECT_EQ(next_of("0 * * * *", t), at(2026, 12, 1, 16, 0));
    EXPECT_EQ(next_of("0 3 * * *", t), at(2026, 12, 2, 3, 0));
    // Strictly after: a slot equal to `after` is not the next one.
    EXPECT_EQ(next_of("7 15 * * *", t), at(2026, 12, 2, 15, 7));
    // Across a month and a year.
    EXPECT_EQ(next_of("0 0 1 * *", t), at(2027, 1, 1, 0, 0));
    EXPECT_EQ(next_of("@yearly", t), at(2027, 1, 1, 0, 0));
    // 1 December 2026 is a Tuesday.
    EXPECT_EQ(next_of("30 9 * * mon-fri", t), at(2026, 12, 2, 9, 30));
    EXPECT_EQ(next_of("0 0 * * sat,sun", t), at(2026, 12, 5, 0, 0));
    // Leap day: the next 29 February after 2026 is in 2028.
    EXPECT_EQ(next_of("0 12 29 2 *", t), at(2028, 2, 29, 12, 0));
}

TEST(Cron, DayOfMonthOrDayOfWeek)
{
    std::int64_t t = at(2026, 12, 1, 15, 7);  // a Tuesday
    // Both restricted: either matches (the 15th, or any Friday: 4 December comes first).
    EXPECT_EQ(next_of("0 0 15 * fri", t), at(2026, 12, 4, 0, 0));
    EXPECT_EQ(next_of("0 0 3 * fri", t), at(2026, 12, 3, 0, 0));
    // One of them '*': both must match (here: only the day of month counts).
    EXPECT_EQ(next_of("0 0 15 * *", t), at(2026, 12, 15, 0, 0));
    EXPECT_EQ(next_of("0 0 * * fri", t), at(2026, 12, 4, 0, 0));
    // A step that starts with '*' counts as '*' (Vixie): the 1st, 3rd, ... that is a Friday.
    EXPECT_EQ(next_of("0 0 */2 * fri", t), at(2026, 12, 11, 0, 0));
}

TEST(Cron, LatestSlot)
{
    CronSpec every_5 = parsed("*/5 * * * *");
    std::int64_t slot = -1;
    std::int64_t now = at(2026, 12, 1, 15, 7);
    EXPECT_TRUE(cron_latest(every_5, now - 60, now, &slot));
    EXPECT_EQ(slot, at(2026, 12, 1, 15, 5));
    // The window is (after, upto]: upto itself counts, after does not.
    EXPECT_TRUE(cron_latest(every_5, now - 60, at(2026, 12, 1, 15, 10), &slot));
    EXPECT_EQ(slot, at(2026, 12, 1, 15, 10));
    EXPECT_FALSE(cron_latest(every_5, at(2026, 12, 1, 15, 5), now, &slot));
    // Days back: the latest 03:00 before a Tuesday afternoon is that morning.
    EXPECT_TRUE(cron_latest(parsed("0 3 * * *"), now - 10 * 1440, now, &slot));
    EXPECT_EQ(slot, at(2026, 12, 1, 3, 0));
    // The latest Monday 09:00 missed during a long outage.
    EXPECT_TRUE(cron_latest(parsed("0 9 * * mon"), now - 30 * 1440, now, &slot));
    EXPECT_EQ(slot, at(2026, 11, 30, 9, 0));
    EXPECT_FALSE(cron_latest(parsed("0 9 * * mon"), at(2026, 11, 30, 9, 0), now, &slot));
    EXPECT_FALSE(cron_latest(every_5, now, now, &slot));
}

TEST(Cron, RareDaysAcrossACenturyYear)
{
    // 29 February on a Sunday: 2088, then 2128 (2100 is not a leap year), 40 years apart.
    EXPECT_EQ(next_of("0 0 29 2 */7", at(2088, 3, 1, 0, 0)), at(2128, 2, 29, 0, 0));
    // The latest such slot, seen from a worker that last ran in 2088.
    std::int64_t slot = -1;
    EXPECT_TRUE(
        cron_latest(parsed("0 0 29 2 */7"), at(2088, 2, 29, 0, 0), at(2128, 3, 1, 0, 0), &slot));
    EXPECT_EQ(slot, at(2128, 2, 29, 0, 0));
    // From the year 2000 (a century year that is a leap year): 2004.
    EXPECT_EQ(next_of("0 0 29 2 */7", at(2000, 1, 1, 0, 0)), at(2004, 2, 29, 0, 0));
    // Both day fields restricted: either matches, so the first Monday of February comes first.
    EXPECT_EQ(next_of("0 0 29 feb mon", at(2096, 3, 1, 0, 0)), at(2097, 2, 4, 0, 0));
}

TEST(Cron, Limit)
{
    CronSpec every_minute = parsed("* * * * *");
    std::int64_t t = at(2026, 12, 1, 15, 7);
    std::int64_t next = -1;
    // The limit itself may be the slot; nothing after it is.
    EXPECT_TRUE(cron_next(every_minute, t, t + 1, &next));
    EXPECT_EQ(next, t + 1);
    EXPECT_FALSE(cron_next(every_minute, t, t, &next));
    EXPECT_FALSE(cron_next(every_minute, t + 5, t, &next));
    // A yearly slot past the limit is none, not a slot beyond it.
    EXPECT_FALSE(cron_next(parsed("@yearly"), t, at(2026, 12, 31, 23, 59), &next));
    EXPECT_TRUE(cron_next(parsed("@yearly"), t, at(2027, 1, 1, 0, 0), &next));
    EXPECT_EQ(next, at(2027, 1, 1, 0, 0));
}
