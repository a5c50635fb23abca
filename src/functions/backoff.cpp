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
    bool unused = false;
    Datum base = arg_span(fcinfo, 1, "backoff_base", true, false, &unused);
    Datum max = arg_span(fcinfo, 2, "backoff_max", true, false, &unused);
    core::Span b = {DatumGetIntervalP(base)->month, DatumGetIntervalP(base)->day,
                    DatumGetIntervalP(base)->time};
    core::Span m = {DatumGetIntervalP(max)->month, DatumGetIntervalP(max)->day,
                    DatumGetIntervalP(max)->time};
    int64 usec = core::backoff_delay(attempt, core::span_usec(b), core::span_usec(m),
                                     pg_prng_double(&pg_global_prng_state));
    Interval* result = static_cast<Interval*>(palloc0(sizeof(Interval)));
    result->time = usec;
    PG_RETURN_INTERVAL_P(result);
}
