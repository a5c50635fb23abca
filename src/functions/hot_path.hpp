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
    if (!direct::usable(function, need))
        return false;
    FencedCall stale = {};
    if (!call(&stale)) {
        spi_open(access);
        raise_not_current(access, function, stale.job_id, stale.fence);
    }
    return true;
}

}  // namespace jobcap
