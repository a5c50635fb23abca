// jobcap.backoff(attempt, backoff_base, backoff_max): the retry delay, computed by the pure
// core (src/core/backoff.hpp documents the formula). The fail and reap statements call it.
#include "spi/args.hpp"
#include "boundary.hpp"
#include "spi/errors.hpp"
#include "core/backoff.hpp"

using namespace jobcap;

JOBCAP_FUNCTION(backoff, Duty::anyone)
{
    int32 attempt = DatumGetInt32(arg_required(fcinfo, 0, "attempt"));
    // Only their lengths count (a month as 30 days): the delay is a plain length of time.
    core::Span b = arg_length(fcinfo, 1, "backoff_base");
    core::Span m = arg_length(fcinfo, 2, "backoff_max");
    int64 usec = core::backoff_delay(attempt, core::span_usec(b), core::span_usec(m),
                                     pg_prng_double(&pg_global_prng_state));
    Interval* result = static_cast<Interval*>(palloc0(sizeof(Interval)));
    result->time = usec;
    PG_RETURN_INTERVAL_P(result);
}
