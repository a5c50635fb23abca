// jobcap.queue_stats (queue_stats_between) and jobcap.refresh_stats: the figures of
// housekeeping/stats.hpp, from SQL.
#include "boundary.hpp"
#include "housekeeping/stats.hpp"
#include "spi/access.hpp"
#include "spi/args.hpp"
#include "spi/plans.hpp"

namespace jobcap {
namespace {

Datum seconds_interval(double seconds)
{
    Interval* iv = static_cast<Interval*>(palloc0(sizeof(Interval)));
    iv->time = static_cast<int64>(seconds * USECS_PER_SEC + (seconds >= 0 ? 0.5 : -0.5));
    return IntervalPGetDatum(iv);
}

}  // namespace
}  // namespace jobcap

using namespace jobcap;

JOBCAP_FUNCTION(queue_stats_between, Duty::operator_)
{
    StatsWindow w = {};
    w.now = GetCurrentTimestamp();
    w.until = PG_ARGISNULL(1) ? w.now : PG_GETARG_TIMESTAMPTZ(1);
    w.since = PG_ARGISNULL(0) ? w.until - (int64) guc_stats_window_s * USECS_PER_SEC
                              : PG_GETARG_TIMESTAMPTZ(0);
    if (TIMESTAMP_NOT_FINITE(w.since) || TIMESTAMP_NOT_FINITE(w.until))
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("since and until must be finite times")));
    if (w.since >= w.until)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("since must be earlier than until")));
    InitMaterializedSRF(fcinfo, 0);
    ReturnSetInfo* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);

    spi_open(access);
    QueueStats* stats = nullptr;
    uint64 rows = collect_stats(w, &stats);
    spi_close(access);
    for (uint64 r = 0; r < rows; ++r) {
        const QueueStats& s = stats[r];
        Datum v[24];
        bool nulls[24] = {};
        v[0] = CStringGetTextDatum(s.queue);
        v[1] = Int64GetDatum(s.pending);
        v[2] = Int64GetDatum(s.scheduled);
        v[3] = Int64GetDatum(s.running);
        v[4] = Int64GetDatum(s.succeeded);
        nulls[4] = !w.counted;
        v[5] = Int64GetDatum(s.dead);
        v[6] = Int64GetDatum(s.cancelled);
        nulls[6] = !w.counted;
        v[7] = Int64GetDatum(s.failed_attempts);
        v[8] = Int64GetDatum(s.failing_jobs);
        v[9] = Int64GetDatum(s.lost_leases);
        v[10] = Int64GetDatum(s.crashed_jobs);
        v[11] = Int64GetDatum(s.new_dead);
        v[12] = s.has_latency ? seconds_interval(s.latency_p50) : (Datum) 0;
        v[13] = s.has_latency ? seconds_interval(s.latency_p95) : (Datum) 0;
        nulls[12] = nulls[13] = !s.has_latency;
        v[14] = s.has_oldest ? seconds_interval(s.oldest_pending_sec) : (Datum) 0;
        nulls[14] = !s.has_oldest;
        v[15] = TimestampTzGetDatum(w.since);
        v[16] = TimestampTzGetDatum(w.until);
        v[17] = TimestampTzGetDatum(w.counted_until);
        // compat(0.1.0): paused and max_running are columns of the 0.2.0 declaration only; the
        // 0.1.0 declaration's result takes the first 18.
        v[18] = BoolGetDatum(s.paused);
        v[19] = Int32GetDatum(s.max_running);
        nulls[19] = s.max_running == 0;
        // compat(0.2.0): waiting is a column of the 0.3.0 declaration only; the 0.2.0
        // declaration's result takes the first 20.
        v[20] = Int64GetDatum(s.waiting);
        // Also of the 0.3.0 declaration only: the due jobs each limit holds back, NULL for a
        // limit the queue does not have.
        int64 held[] = {s.held_by_max_running, s.held_by_rate, s.held_by_key};
        for (int c = 0; c < 3; ++c) {
            v[21 + c] = Int64GetDatum(held[c]);
            nulls[21 + c] = held[c] < 0;
        }
        tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, v, nulls);
    }
    return (Datum) 0;
}

JOBCAP_FUNCTION(refresh_stats, Duty::operator_)
{
    int32 max_jobs = arg_count(fcinfo, 0, "max_jobs", 1000000);
    if (IsolationUsesXactSnapshot())
        ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
                        errmsg("cannot refresh jobcap statistics in a REPEATABLE READ or "
                               "SERIALIZABLE transaction"),
                        errdetail("Jobs that finished after this transaction's snapshot "
                                  "would never be counted."),
                        errhint("Run jobcap.refresh_stats at READ COMMITTED.")));
    spi_open(access);
    int64 counted = refresh_counts(max_jobs);
    spi_close(access);
    PG_RETURN_INT64(counted < 0 ? 0 : counted);
}
