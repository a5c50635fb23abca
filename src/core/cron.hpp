// Five-field cron expressions (minute hour day-of-month month day-of-week), as Vixie cron reads
// them, and the slots they name. Pure C++: plain data in, plain data out, nothing thrown.
//
// Fields: numbers, ranges a-b, steps (*/n, a-b/n, a/n: from a to the field's end), lists of
// those separated by commas; month and day-of-week also take English three-letter names
// (jan..dec, sun..sat, any case); day-of-week 7 is Sunday too. Whole expressions @yearly
// (@annually), @monthly, @weekly, @daily (@midnight) and @hourly stand for their usual fields.
// Day-of-month and day-of-week: when both are restricted (neither field starts with '*'), a day
// matches either; otherwise it must match both (Vixie cron's rule).
// Slots are whole minutes, counted from 1970-01-01 00:00 UTC: schedules run on UTC.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/rules.hpp"

namespace jobcap::core {

struct CronSpec {
    std::uint64_t minutes = 0;  // bit m: minute m (0-59)
    std::uint32_t hours = 0;    // bit h: hour h (0-23)
    std::uint32_t days = 0;     // bit d: day of month d (1-31)
    std::uint16_t months = 0;   // bit m: month m (1-12)
    std::uint8_t weekdays = 0;  // bit d: day of week d (0 = Sunday .. 6 = Saturday)
    bool any_day = false;       // the day-of-month field starts with '*'
    bool any_weekday = false;   // the day-of-week field starts with '*'
};

// The longest expression accepted, in bytes.
inline constexpr std::size_t kMaxCronLength = 256;

// Parses text (length bytes, not NUL-terminated); a problem (invalid_value) says what is wrong,
// and also when the expression names no day at all (such as 30 February).
Problem parse_cron(const char* text, std::size_t length, CronSpec* out);

// The first slot after `after` and at most `limit` (minutes since the epoch; the caller's last
// representable time); false when there is none. An expression parse_cron accepts matches within
// every 400 years, so false means only that the next slot lies past `limit`.
bool cron_next(const CronSpec& spec, std::int64_t after, std::int64_t limit, std::int64_t* next);

// The last slot in (after, upto]; false when there is none.
bool cron_latest(const CronSpec& spec, std::int64_t after, std::int64_t upto, std::int64_t* slot);

// Civil date of a day counted from 1970-01-01 (proleptic Gregorian), and the reverse.
void civil_from_days(std::int64_t days, std::int64_t* year, int* month, int* day);
std::int64_t days_from_civil(std::int64_t year, int month, int day);

}  // namespace jobcap::core
