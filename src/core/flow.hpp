// A queue's rate limit without PostgreSQL (docs/flow_control.md): the sliding window that keeps
// every window of rate_period at or under rate_limit claims. Its state is a row of
// jobcap.queue_rates; the claim (src/functions/claim.cpp) reads and charges it under the queue's
// row lock with these functions, so the rule is written once.
//
// Time is cut into slots of ceil(rate_period / 16); the window keeps the claims admitted in each
// of the last 17 slots. Any window of rate_period lies within 17 consecutive slots, and a claim
// takes only what keeps the claims of the 17 slots ending at its own at or under the limit: so
// no window of rate_period ever holds more claims than the limit. The price is at most one slot:
// under steady demand the queue gets its limit per 17/16 of the period.
#pragma once

#include <cstdint>

namespace jobcap::core {

inline constexpr int kRateSlots = 16;             // slots per rate_period
inline constexpr int kRateRing = kRateSlots + 1;  // slots a window of rate_period can touch
inline constexpr std::int32_t kMaxRateLimit = 1000000000;

// A queue's window: the slot width (microseconds), the newest slot counted (a time in
// microseconds divided by the width, rounded down), and the claims per slot, slot s at
// counts[s mod 17].
struct RateWindow {
    std::int64_t slot_us;
    std::int64_t newest;
    std::int32_t counts[kRateRing];
};

// The slot width of a rate_period in microseconds: ceil(period / 16), at least 1 (so 16 slots
// cover at least the period).
std::int64_t rate_slot_us(std::int64_t period_us) noexcept;

// A window with nothing counted, its newest slot now's.
RateWindow rate_empty(std::int64_t slot_us, std::int64_t now_us) noexcept;

// Moves w to now: the slots that left the window are emptied. A clock that went back keeps the
// newest slot (claims are then charged to it: counted longer, never less). A different slot
// width (rate_period was changed) counts every claim as made at the end of the newest slot.
void rate_advance(RateWindow& w, std::int64_t slot_us, std::int64_t now_us) noexcept;

// The claims w holds (its 17 slots).
std::int64_t rate_counted(const RateWindow& w) noexcept;

// How many more claims w admits under limit, after rate_advance.
std::int32_t rate_room(const RateWindow& w, std::int32_t limit) noexcept;

// Charges n claims to w's newest slot.
void rate_charge(RateWindow& w, std::int32_t n) noexcept;

// A queue's window kept in several rows (one per claim turn, each charged by its own claims):
// moves each to slot_us and to the newest slot of any of them or now's, whichever is later, so
// that their 17 slots are the same 17 and their sum is the queue's window. A row charged later
// than now (a clock that went back, a claim whose clock reading came after this one's) keeps
// its slot, and the rows charged after aligning are charged there: counted longer, never less.
void rate_align(RateWindow* rows, int n, std::int64_t slot_us, std::int64_t now_us) noexcept;

// How many more claims the aligned rows admit under limit together.
std::int32_t rate_room(const RateWindow* rows, int n, std::int32_t limit) noexcept;

// A backend's charge ahead of its own claims of a queue far below its rate limit (the direct
// path's shared claims, src/direct/rates.cpp): a claim that charges the window also charges it
// for the claims this backend is expected to make in the rest of the slot (at the pace of its
// previous slot or of this one so far, at most a shared claim's batch in all), and the claims that follow in the same
// slot are made under that charge without reading or writing the window: they were counted
// before they were made, in the slot they are made in. Claims charged and never made stay
// counted (the window then admits fewer, never more); a backend that claimed nothing in the
// previous slot and fewer than kRatePaceClaims in this one charges only what it claims.
inline constexpr std::int32_t kRatePaceClaims = 8;

struct RateAllowance {
    std::int64_t slot_us = 0;      // the width the window was charged in
    std::int64_t slot = 0;         // the slot charged: claims under it only while now is in it
    std::int32_t left = 0;         // claims charged and not made
    bool usable = false;           // the charge has committed
    std::int64_t use_slot = 0;     // this backend's latest shared claim's slot
    std::int32_t used = 0;         // its claims in use_slot
    std::int32_t used_before = 0;  // and in the slot before it
};

// Whether n claims at now may be made under a's charge.
bool rate_allowance_covers(const RateAllowance& a, std::int64_t slot_us, std::int64_t now_us,
                           std::int32_t n) noexcept;

// How many claims the charge of a claim that took claimed at now counts: claimed and what this
// backend is expected to claim in the rest of now's slot, at most most: at the pace of its
// previous slot, or of this one so far once it has made kRatePaceClaims claims in it.
std::int32_t rate_charge_ahead(const RateAllowance& a, std::int64_t slot_us, std::int64_t now_us,
                               std::int32_t claimed, std::int32_t most) noexcept;

// Notes n claims made at now: from the allowance when covered, else under a charge of charged
// claims made by this claim in slot charged_slot (left over: not usable until it commits).
void rate_note_claims(RateAllowance& a, std::int64_t slot_us, std::int64_t now_us, std::int32_t n,
                      bool covered, std::int32_t charged = 0,
                      std::int64_t charged_slot = 0) noexcept;

}  // namespace jobcap::core
