// enter(): the one exception boundary and caller check every SQL entry point goes through.
#include "boundary.hpp"

#include "spi/citus.hpp"

namespace jobcap {

Datum enter(FunctionCallInfo fcinfo, const char* function, Duty duty, EntryBody body)
{
    return guard(function, [&]() -> Datum {
        Access access = admit(function, duty);
        if (likely(!citus::loaded()))
            return body(fcinfo, function, access);
        // On a Citus node, a hot-path call works on its queue's shard (spi/citus.hpp).
        citus::Outer outer = citus::enter_call(fcinfo, function);
        Datum result = body(fcinfo, function, access);
        citus::leave_call(outer);
        return result;
    });
}

}  // namespace jobcap
