// The reaper's vacuum step (src/background/vacuum.cpp says when and how it vacuums
// jobcap.jobs). Private to src/background/.
#pragma once

#include "pg.hpp"

namespace jobcap {

constexpr int kVacuumTimeoutMs = 10000;  // a vacuum of jobcap.jobs is cancelled after this
constexpr TimestampTz kVacuumTimeoutUs = kVacuumTimeoutMs * INT64CONST(1000);
constexpr int kVacuumSpacing = 9;  // no vacuum starts sooner than this many times the
                                   // last one's duration after it ended (<= 10% busy)
// The longest spacing a vacuum sets (its duration counts for at most its timeout).
constexpr TimestampTz kVacuumSpacingLongestUs = kVacuumSpacing * kVacuumTimeoutUs;

// Vacuums jobcap.jobs when autovacuum's threshold for it is crossed and the spacing allows.
// Returns false when the extension is not installed (the caller stops the cycle).
bool vacuum_if_due();

}  // namespace jobcap
