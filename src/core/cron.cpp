#include "cpp_only.hpp"

#include "cron.hpp"

#include <cctype>
#include <cstdio>
#include <cstring>

namespace jobcap::core {
namespace {

constexpr std::int64_t kMinutesPerDay = 1440;
// The Gregorian calendar repeats every 400 years (146,097 days, a whole number of weeks): an
// expression that matches some day matches one in any 400 years. Shorter cycles do not hold
// across a century year that is not a leap year (29 February on a Sunday: 2088, then 2128).
constexpr std::int64_t kSearchDays = 146097 + 1;

struct Field {
    const char* name;
    int min;
    int max;
    const char* const* names;  // three-letter names of min..max, or nullptr
};

const char* const kMonthNames[] = {"jan", "feb", "mar", "apr", "may", "jun",
                                   "jul", "aug", "sep", "oct", "nov", "dec"};
const char* const kDayNames[] = {"sun", "mon", "tue", "wed", "thu", "fri", "sat"};

const Field kFields[5] = {
    {"minute", 0, 59, nullptr},       {"hour", 0, 23, nullptr},
    {"day of month", 1, 31, nullptr}, {"month", 1, 12, kMonthNames},
    {"day of week", 0, 7, kDayNames},
};

Problem bad(const char* detail)
{
    Problem p;
    p.fault = Fault::invalid_value;
    std::snprintf(p.message, sizeof p.message, "invalid cron expression: %s", detail);
    std::snprintf(p.hint, sizeof p.hint, "%s",
                  "Use five fields: minute hour day-of-month month day-of-week, such as "
                  "'*/15 * * * *' or '0 3 * * mon-fri'.");
    return p;
}

// "<field> field \"<text>\" <what>", what formatted with a and b.
Problem bad_field(const Field& f, const char* shown, const char* what, long long a = 0,
                  long long b = 0)
{
    char said[60];
    std::snprintf(said, sizeof said, what, a, b);
    char detail[140];
    std::snprintf(detail, sizeof detail, "%s field \"%s\" %s", f.name, shown, said);
    return bad(detail);
}

bool same_word(const char* a, const char* b, std::size_t n)
{
    for (std::size_t k = 0; k < n; ++k)
        if (std::tolower(static_cast<unsigned char>(a[k])) !=
            std::tolower(static_cast<unsigned char>(b[k])))
            return false;
    return true;
}

// A number or (where the field has them) a name, at text[*i]; advances *i.
bool read_value(const Field& f, const char* text, std::size_t end, std::size_t* i, int* value)
{
    std::size_t start = *i;
    if (*i < end && std::isdigit(static_cast<unsigned char>(text[*i]))) {
        long v = 0;
        while (*i < end && std::isdigit(static_cast<unsigned char>(text[*i])) && v < 1000)
            v = v * 10 + (text[(*i)++] - '0');
        if (*i < end && std::isdigit(static_cast<unsigned char>(text[*i])))
            return false;
        *value = static_cast<int>(v);
        return true;
    }
    if (f.names == nullptr || end - start < 3)
        return false;
    for (int n = 0; n <= f.max - f.min && !(f.min == 0 && n == 7); ++n) {
        if (same_word(text + start, f.names[n], 3) &&
            (end - start == 3 || !std::isalpha(static_cast<unsigned char>(text[start + 3])))) {
            *i = start + 3;
            *value = f.min + n;
            return true;
        }
    }
    return false;
}

// One field, text[begin, end), into *bits.
Problem parse_field(const Field& f, const char* text, std::size_t begin, std::size_t end,
                    std::uint64_t* bits)
{
    char shown[64];
    std::snprintf(shown, sizeof shown, "%.*s", static_cast<int>(end - begin), text + begin);
    std::size_t i = begin;
    while (i < end) {
        int lo = f.min;
        int hi = f.max;
        bool star = false;
        bool ranged = false;
        if (text[i] == '*') {
            star = true;
            ++i;
        } else {
            if (!read_value(f, text, end, &i, &lo))
                return bad_field(f, shown, "is not a number, range, step or list");
            hi = lo;
            if (i < end && text[i] == '-') {
                ranged = true;
                ++i;
                if (!read_value(f, text, end, &i, &hi))
                    return bad_field(f, shown, "has a range without an end");
            }
        }
        int step = 1;
        if (i < end && text[i] == '/') {
            ++i;
            int s = 0;
            Field numbers = {f.name, 1, 1000, nullptr};
            if (!read_value(numbers, text, end, &i, &s) || s < 1)
                return bad_field(f, shown, "has a step that is not a positive number");
            step = s;
            if (!star && !ranged)
                hi = f.max;  // a/n: from a to the end of the field
        }
        if (i < end && text[i] != ',')
            return bad_field(f, shown, "is not a number, range, step or list");
        if (lo < f.min || hi > f.max)
            return bad_field(f, shown, "is out of range %lld-%lld", f.min, f.max);
        if (lo > hi)
            return bad_field(f, shown, "has a range that runs backwards");
        for (int v = lo; v <= hi; v += step)
            *bits |= std::uint64_t(1) << v;
        if (i < end) {  // a comma
            ++i;
            if (i == end)
                return bad_field(f, shown, "ends with a comma");
        }
    }
    return {};
}

bool day_matches(const CronSpec& s, std::int64_t day)
{
    std::int64_t y = 0;
    int m = 0;
    int d = 0;
    civil_from_days(day, &y, &m, &d);
    if (!(s.months & (1u << m)))
        return false;
    int weekday = static_cast<int>(((day % 7) + 7 + 4) % 7);  // 1970-01-01 was a Thursday
    bool dom = (s.days >> d) & 1u;
    bool dow = (s.weekdays >> weekday) & 1u;
    return (s.any_day || s.any_weekday) ? (dom && dow) : (dom || dow);
}

// The first matching minute of the day at or after minute `from` (0..1439), or -1.
int first_minute(const CronSpec& s, int from)
{
    for (int h = from / 60; h < 24; ++h) {
        if (!((s.hours >> h) & 1u))
            continue;
        for (int m = (h == from / 60 ? from % 60 : 0); m < 60; ++m)
            if ((s.minutes >> m) & 1u)
                return h * 60 + m;
    }
    return -1;
}

// The last matching minute of the day at or before minute `upto` (0..1439), or -1.
int last_minute(const CronSpec& s, int upto)
{
    for (int h = upto / 60; h >= 0; --h) {
        if (!((s.hours >> h) & 1u))
            continue;
        for (int m = (h == upto / 60 ? upto % 60 : 59); m >= 0; --m)
            if ((s.minutes >> m) & 1u)
                return h * 60 + m;
    }
    return -1;
}

std::int64_t floor_div(std::int64_t a, std::int64_t b)
{
    return a / b - ((a % b != 0) && ((a < 0) != (b < 0)));
}

struct Macro {
    const char* name;
    const char* fields;
};
const Macro kMacros[] = {{"@yearly", "0 0 1 1 *"},  {"@annually", "0 0 1 1 *"},
                         {"@monthly", "0 0 1 * *"}, {"@weekly", "0 0 * * 0"},
                         {"@daily", "0 0 * * *"},   {"@midnight", "0 0 * * *"},
                         {"@hourly", "0 * * * *"}};

}  // namespace

void civil_from_days(std::int64_t z, std::int64_t* year, int* month, int* day)
{
    // Howard Hinnant's civil_from_days.
    z += 719468;
    std::int64_t era = floor_div(z, 146097);
    std::int64_t doe = z - era * 146097;
    std::int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    std::int64_t y = yoe + era * 400;
    std::int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    std::int64_t mp = (5 * doy + 2) / 153;
    *day = static_cast<int>(doy - (153 * mp + 2) / 5 + 1);
    *month = static_cast<int>(mp < 10 ? mp + 3 : mp - 9);
    *year = y + (*month <= 2);
}

std::int64_t days_from_civil(std::int64_t y, int m, int d)
{
    y -= m <= 2;
    std::int64_t era = floor_div(y, 400);
    std::int64_t yoe = y - era * 400;
    std::int64_t doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
    std::int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

Problem parse_cron(const char* text, std::size_t length, CronSpec* out)
{
    *out = CronSpec{};
    if (length > kMaxCronLength) {
        char m[60];
        std::snprintf(m, sizeof m, "longer than %d bytes", static_cast<int>(kMaxCronLength));
        return bad(m);
    }
    std::size_t i = 0;
    while (i < length && std::isspace(static_cast<unsigned char>(text[i])))
        ++i;
    std::size_t end = length;
    while (end > i && std::isspace(static_cast<unsigned char>(text[end - 1])))
        --end;
    if (i < end && text[i] == '@') {
        for (const Macro& m : kMacros)
            if (end - i == std::strlen(m.name) && same_word(text + i, m.name, end - i))
                return parse_cron(m.fields, std::strlen(m.fields), out);
        char m[60];
        std::snprintf(m, sizeof m, "unknown macro \"%.*s\"",
                      static_cast<int>(end - i < 30 ? end - i : 30), text + i);
        return bad(m);
    }
    std::uint64_t bits[5] = {0, 0, 0, 0, 0};
    int n = 0;
    while (i < end) {
        std::size_t start = i;
        while (i < end && !std::isspace(static_cast<unsigned char>(text[i])))
            ++i;
        if (n == 5)
            return bad("more than five fields");
        Problem p = parse_field(kFields[n], text, start, i, &bits[n]);
        if (p)
            return p;
        if (n == 2)
            out->any_day = text[start] == '*';
        if (n == 4)
            out->any_weekday = text[start] == '*';
        ++n;
        while (i < end && std::isspace(static_cast<unsigned char>(text[i])))
            ++i;
    }
    if (n < 5) {
        char m[40];
        std::snprintf(m, sizeof m, "%d field%s, not five", n, n == 1 ? "" : "s");
        return bad(m);
    }
    out->minutes = bits[0];
    out->hours = static_cast<std::uint32_t>(bits[1]);
    out->days = static_cast<std::uint32_t>(bits[2]);
    out->months = static_cast<std::uint16_t>(bits[3]);
    std::uint64_t weekdays = bits[4];
    if (weekdays & (1u << 7))
        weekdays = (weekdays | 1u) & ~(std::uint64_t(1) << 7);
    out->weekdays = static_cast<std::uint8_t>(weekdays);

    // A day of month that no chosen month has (30 February) and no weekday to fall back on.
    if (!out->any_day && out->any_weekday) {
        static const int kLongest[13] = {0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
        bool some = false;
        for (int m = 1; m <= 12; ++m)
            if ((out->months >> m) & 1u)
                for (int d = 1; d <= kLongest[m]; ++d)
                    if ((out->days >> d) & 1u)
                        some = true;
        if (!some)
            return bad("no month chosen has the days of month chosen");
    }
    return {};
}

bool cron_next(const CronSpec& s, std::int64_t after, std::int64_t limit, std::int64_t* next)
{
    if (after >= limit)
        return false;
    std::int64_t start = after + 1;
    std::int64_t day = floor_div(start, kMinutesPerDay);
    int from = static_cast<int>(start - day * kMinutesPerDay);
    for (std::int64_t k = 0; k < kSearchDays; ++k, ++day, from = 0) {
        if (!day_matches(s, day))
            continue;
        if (day * kMinutesPerDay > limit)
            return false;
        int m = first_minute(s, from);
        if (m >= 0) {
            *next = day * kMinutesPerDay + m;
            return *next <= limit;
        }
    }
    return false;
}

bool cron_latest(const CronSpec& s, std::int64_t after, std::int64_t upto, std::int64_t* slot)
{
    if (upto <= after)
        return false;
    std::int64_t day = floor_div(upto, kMinutesPerDay);
    int until = static_cast<int>(upto - day * kMinutesPerDay);
    for (std::int64_t k = 0; k < kSearchDays;
         ++k, --day, until = static_cast<int>(kMinutesPerDay - 1)) {
        if ((day + 1) * kMinutesPerDay - 1 <= after)
            return false;
        if (!day_matches(s, day))
            continue;
        int m = last_minute(s, until);
        if (m >= 0) {
            std::int64_t t = day * kMinutesPerDay + m;
            if (t <= after)
                return false;
            *slot = t;
            return true;
        }
    }
    return false;
}

}  // namespace jobcap::core
