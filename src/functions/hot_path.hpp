// Which path serves a call of the hot path (claim.cpp, settle.cpp): the direct path when it
// may (src/direct/direct.hpp), else the SQL statements, the reference.
#pragma once

#include "direct/direct.hpp"
#include "spi/access.hpp"
#include "spi/calls.hpp"
#include "spi/errors.hpp"

namespace jobcap {

// Runs call on the direct path when it may serve this call of function (direct::usable says
// which path served, at DEBUG2) and returns true; false leaves the call to the SQL path. call
// returns false when no current row matched, with the (job_id, fence) that was not current in
// *stale: the stale-fence error is then raised as the SQL path raises it, explained from the
// job's row by SQL (raise_not_current). need: as direct::usable's.
template <typename Call>
bool served_directly(Access& access, const char* function, direct::Need need, Call&& call)
{
    if (!direct::usable(function, access, need))
        return false;
    FencedCall stale = {};
    if (!call(&stale)) {
        spi_open(access);
        raise_not_current(access, function, stale.job_id, stale.fence);
    }
    return true;
}

// complete_job and complete_and_claim's completion with the SQL statements, inside an open SPI
// connection: the fenced compare-and-swap (raising the stale-fence error), then the release of
// the jobs that wait for this one (housekeeping/workflows.hpp). schema_0_1: the 0.1.0 declaration
// (no output).
// Returns the new state.
Datum complete_with_statements(Access& access, const char* function, const CompleteCall& c,
                               bool schema_0_1);

// After the direct path completed ids[0..n) (the completed jobs that others depend on): their
// release, with the SQL statements. Nothing when n is 0.
void release_after_direct(Access& access, const int64* ids, int n, TimestampTz now);

}  // namespace jobcap
