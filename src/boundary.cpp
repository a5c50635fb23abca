// enter(): the one exception boundary and caller check every SQL entry point goes through.
#include "boundary.hpp"

namespace jobcap {

Datum enter(FunctionCallInfo fcinfo, const char* function, Duty duty, EntryBody body)
{
    return guard(function, [&]() -> Datum {
        Access access = admit(function, duty);
        return body(fcinfo, function, access);
    });
}

}  // namespace jobcap
