#include "cpp_only.hpp"

#include "flow.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace jobcap::core {
namespace {

// Floor division (the times are microseconds since 2000 and may precede it).
std::int64_t floor_div(std::int64_t a, std::int64_t b) noexcept
{
    std::int64_t q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

int ring_index(std::int64_t slot) noexcept
{
    std::int64_t r = slot % kRateRing;
    return static_cast<int>(r < 0 ? r + kRateRing : r);
}

}  // namespace

std::int64_t rate_slot_us(std::int64_t period_us) noexcept
{
    if (period_us <= kRateSlots)
        return 1;
    return period_us / kRateSlots + (period_us % kRateSlots != 0 ? 1 : 0);
}

RateWindow rate_empty(std::int64_t slot_us, std::int64_t now_us) noexcept
{
    RateWindow w = {};
    w.slot_us = slot_us < 1 ? 1 : slot_us;
    w.newest = floor_div(now_us, w.slot_us);
    return w;
}

void rate_advance(RateWindow& w, std::int64_t slot_us, std::int64_t now_us) noexcept
{
    if (slot_us < 1)
        slot_us = 1;
    std::int64_t slot = floor_div(now_us, slot_us);
    if (w.slot_us != slot_us) {
        // Every claim counted was made by the end of the newest slot: charge them all to the
        // slot of the new width holding that instant (or now's, for a clock that went back),
        // later than they were made, so counted as long or longer, then move on to now.
        std::int64_t total = rate_counted(w);
        std::int64_t last_us = (w.newest + 1) * w.slot_us - 1;
        std::memset(w.counts, 0, sizeof w.counts);
        w.slot_us = slot_us;
        w.newest = std::min(floor_div(last_us, slot_us), slot);
        w.counts[ring_index(w.newest)] =
            static_cast<std::int32_t>(total > kMaxRateLimit ? kMaxRateLimit : total);
    }
    if (slot <= w.newest)
        return;
    if (slot - w.newest >= kRateRing) {
        std::memset(w.counts, 0, sizeof w.counts);
    } else {
        for (std::int64_t s = w.newest + 1; s <= slot; ++s)
            w.counts[ring_index(s)] = 0;
    }
    w.newest = slot;
}

std::int64_t rate_counted(const RateWindow& w) noexcept
{
    std::int64_t total = 0;
    for (std::int32_t c : w.counts)
        total += c > 0 ? c : 0;
    return total;
}

std::int32_t rate_room(const RateWindow& w, std::int32_t limit) noexcept
{
    std::int64_t room = static_cast<std::int64_t>(limit) - rate_counted(w);
    return room > 0 ? static_cast<std::int32_t>(room) : 0;
}

void rate_align(RateWindow* rows, int n, std::int64_t slot_us, std::int64_t now_us) noexcept
{
    if (slot_us < 1)
        slot_us = 1;
    std::int64_t newest = floor_div(now_us, slot_us);
    for (int i = 0; i < n; ++i) {
        rate_advance(rows[i], slot_us, now_us);
        newest = std::max(newest, rows[i].newest);
    }
    for (int i = 0; i < n; ++i)
        rate_advance(rows[i], slot_us, newest * slot_us);
}

std::int32_t rate_room(const RateWindow* rows, int n, std::int32_t limit) noexcept
{
    std::int64_t room = limit;
    for (int i = 0; i < n; ++i)
        room -= rate_counted(rows[i]);
    return room > 0 ? static_cast<std::int32_t>(room) : 0;
}

void rate_charge(RateWindow& w, std::int32_t n) noexcept
{
    if (n <= 0)
        return;
    std::int32_t& c = w.counts[ring_index(w.newest)];
    c = c > kMaxRateLimit - n ? kMaxRateLimit : c + n;
}

bool rate_allowance_covers(const RateAllowance& a, std::int64_t slot_us, std::int64_t now_us,
                           std::int32_t n) noexcept
{
    return a.usable && n > 0 && a.left >= n && slot_us >= 1 && a.slot_us == slot_us &&
           floor_div(now_us, slot_us) == a.slot;
}

std::int32_t rate_charge_ahead(const RateAllowance& a, std::int64_t slot_us, std::int64_t now_us,
                               std::int32_t claimed, std::int32_t most) noexcept
{
    if (slot_us < 1 || claimed >= most || a.slot_us != slot_us)
        return claimed;
    std::int64_t slot = floor_div(now_us, slot_us);
    std::int32_t before = a.use_slot == slot ? a.used_before : a.use_slot == slot - 1 ? a.used : 0;
    std::int32_t so_far = a.use_slot == slot ? a.used : 0;
    // The pace of the previous slot, or of this one so far once it has a few claims (a backend
    // that just started claiming), over what is left of this slot.
    double elapsed = static_cast<double>(now_us - slot * slot_us) + 1;
    double left = static_cast<double>(slot_us) - elapsed + 1;
    double pace = static_cast<double>(before) / static_cast<double>(slot_us);
    if (so_far >= kRatePaceClaims)
        pace = std::max(pace, so_far / elapsed);
    double expected = std::ceil(pace * left);
    if (expected >= most)
        return most;
    return std::max(claimed, static_cast<std::int32_t>(expected));
}

void rate_note_claims(RateAllowance& a, std::int64_t slot_us, std::int64_t now_us, std::int32_t n,
                      bool covered, std::int32_t charged, std::int64_t charged_slot) noexcept
{
    std::int64_t slot = floor_div(now_us, slot_us < 1 ? 1 : slot_us);
    if (a.slot_us != slot_us || slot > a.use_slot + 1) {
        a.used = a.used_before = 0;
    } else if (slot == a.use_slot + 1) {
        a.used_before = a.used;
        a.used = 0;
    }
    if (a.slot_us != slot_us || slot >= a.use_slot) {
        a.use_slot = slot;
        a.used += n;
    }
    a.slot_us = slot_us;
    if (covered) {
        a.left -= n;
        return;
    }
    a.usable = false;  // what an earlier charge left is given up: this one replaces it
    a.slot = charged_slot;
    a.left = charged > n ? charged - n : 0;
}

}  // namespace jobcap::core
