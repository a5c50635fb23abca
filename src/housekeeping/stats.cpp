// Per-queue figures, shared by jobcap.queue_stats, jobcap.metrics(), jobcap.refresh_stats and
// the background worker's report, that stay cheap however many finished jobs are kept.
//
//  * Jobs by state now: the partial indexes jobs_claim (pending), jobs_running and jobs_dead, so
//    the cost follows the live and dead jobs, never the succeeded ones.
//  * Failures, lost leases (attempts that ended without a report: a lease that expired or a
//    claim that rolled back): job_errors over its (at) index; failures are rare events. Exact as
//    long as no job wrote more than jobcap.error_history history rows since the window started
//    (docs/observability.md: "When the failure figures are exact").
//  * Deaths in the window: jobs_dead, (queue, finished_at).
//  * Completions, cancellations and claim latency: counts per queue and minute that
//    refresh_counts adds to, each finished job once, from a watermark that late-committing
//    transactions cannot slip behind (settled_horizon, also the worker report's window end).
//    One writer at a time (a row lock on stats_progress); nothing on the claim or settle path
//    writes a shared row.
#include "housekeeping/stats.hpp"

#include "spi/rates.hpp"
#include "spi/citus.hpp"

#include "jobcap.hpp"
#include "spi/plans.hpp"
#include "spi/schema.hpp"

#include "core/stats.hpp"

extern "C" {
#include "utils/array.h"
#include "utils/backend_status.h"
#include "utils/guc.h"
}

namespace jobcap {

int guc_stats_window_s = 3600;

void define_stats_settings()
{
    DefineCustomIntVariable("jobcap.stats_window",
                            "Sets the window of jobcap.queue_stats, top_failing_jobs and metrics.",
                            "Failures, deaths, completions and claim latency are counted over "
                            "this much time up to now.",
                            &guc_stats_window_s, 3600, 60, 86400, PGC_USERSET, GUC_UNIT_S, nullptr,
                            nullptr, nullptr);
}

// The claim latency bin of ms (a float8 expression, not NULL): see core/stats.hpp.
#define JOBCAP_LATENCY_BIN_SQL(MS)                                                                 \
    "(CASE WHEN " MS " >= 1 THEN least(109, 1 + floor(4 * ln(" MS                                  \
    ") / ln(2::float8)))"                                                                          \
    " ELSE 0 END)::smallint"
static_assert(core::kLatencyBins == 110 && core::kLatencyBinsPerDoubling == 4,
              "JOBCAP_LATENCY_BIN_SQL spells out the bins of core/stats.hpp");

namespace statements {

// $1 = since, $2 = until, $3 = now. A minute of counts is in the window when it overlaps it.
// The queue's controls follow: CONTROLS, two expressions; then WAITING, the jobs waiting for
// others (0.3.0: from the index jobs_waiting); then FLOW, six expressions: the rate limit, its
// period and its window (RATE_ROWS: the queue_rates rows' slot_us, newest and lengths of counts
// as arrays, and their counts one after the other), and the due jobs held back by
// max_running_per_key (HELD_BY_KEY). An attempt past its run-time
// limit (timed_out) is lost like an expired lease.
#define LOST_KINDS "('lease_expired', 'claim_rolled_back', 'crashed', 'timed_out')"
#define QUEUE_STATS(CONTROLS, WAITING, FLOW, JOINS)                                                \
    "WITH pend AS (SELECT j.queue, count(*) FILTER (WHERE j.run_at <= $3) AS due,"                 \
    "     count(*) FILTER (WHERE j.run_at > $3) AS scheduled,"                                     \
    "     min(j.run_at) FILTER (WHERE j.run_at <= $3) AS oldest"                                   \
    "   FROM jobcap.jobs j WHERE j.state = 'pending' GROUP BY j.queue),"                           \
    " run AS (SELECT j.queue, count(*) AS n FROM jobcap.jobs j WHERE j.state = 'running'"          \
    "   GROUP BY j.queue),"                                                                        \
    " dead AS (SELECT j.queue, count(*) AS n,"                                                     \
    "     count(*) FILTER (WHERE j.finished_at > $1 AND j.finished_at <= $2) AS new"               \
    "   FROM jobcap.jobs j WHERE j.state = 'dead' GROUP BY j.queue),"                              \
    " fail AS (SELECT e.queue, count(*) FILTER (WHERE e.kind = 'error') AS attempts,"              \
    "     count(DISTINCT e.job_id) FILTER (WHERE e.kind = 'error') AS jobs,"                       \
    "     count(*) FILTER (WHERE e.kind IN " LOST_KINDS                                            \
    ") AS lost,"                                                                                   \
    "     count(DISTINCT e.job_id) FILTER (WHERE e.kind IN " LOST_KINDS                            \
    ") AS crashed"                                                                                 \
    "   FROM jobcap.job_errors e WHERE e.at > $1 AND e.at <= $2 GROUP BY e.queue),"                \
    " done AS (SELECT m.queue, sum(m.succeeded)::bigint AS succeeded,"                             \
    "     sum(m.cancelled)::bigint AS cancelled FROM jobcap.stats_minutes m"                       \
    "   WHERE m.minute > $1 - interval '1 minute' AND m.minute <= $2 GROUP BY m.queue),"           \
    " lat AS (SELECT l.queue, array_agg(l.bin ORDER BY l.bin) AS bins,"                            \
    "     array_agg(l.jobs ORDER BY l.bin) AS jobs"                                                \
    "   FROM (SELECT s.queue, s.bin, sum(s.jobs)::bigint AS jobs FROM jobcap.stats_latency s"      \
    "     WHERE s.minute > $1 - interval '1 minute' AND s.minute <= $2"                            \
    "     GROUP BY s.queue, s.bin) l GROUP BY l.queue)"                                            \
    " SELECT q.queue, coalesce(p.due, 0), coalesce(p.scheduled, 0), coalesce(r.n, 0),"             \
    "   coalesce(d.n, 0), coalesce(c.succeeded, 0), coalesce(c.cancelled, 0),"                     \
    "   coalesce(f.attempts, 0), coalesce(f.jobs, 0), coalesce(f.lost, 0), coalesce(f.crashed, "   \
    "0),"                                                                                          \
    "   coalesce(d.new, 0), l.bins, l.jobs, extract(epoch FROM $3 - p.oldest)::float8,"            \
    "   (SELECT s.counted_until FROM jobcap.stats_progress s), " CONTROLS ", " WAITING ", " FLOW   \
    "  FROM jobcap.queues q"                                                                       \
    "  LEFT JOIN pend p ON p.queue = q.queue LEFT JOIN run r ON r.queue = q.queue"                 \
    "  LEFT JOIN dead d ON d.queue = q.queue LEFT JOIN fail f ON f.queue = q.queue"                \
    "  LEFT JOIN done c ON c.queue = q.queue LEFT JOIN lat l ON l.queue = q.queue" JOINS           \
    " ORDER BY q.queue"

// A queue's due jobs whose concurrency key is at its max_running_per_key now (claims skip them
// until one of the key's running jobs settles); NULL without a per-key limit.
#define HELD_BY_KEY                                                                                \
    "CASE WHEN q.max_running_per_key IS NOT NULL THEN (SELECT count(*) FROM jobcap.jobs j"         \
    "   WHERE j.queue = q.queue AND j.state = 'pending' AND j.run_at <= $3"                        \
    "     AND j.concurrency_key IN (SELECT k.concurrency_key FROM jobcap.jobs k"                   \
    "       WHERE hashtextextended(k.queue, 0) = hashtextextended(q.queue, 0)"                     \
    "         AND k.queue = q.queue AND k.state = 'running' AND k.concurrency_key IS NOT NULL"     \
    "       GROUP BY 1 HAVING count(*) >= q.max_running_per_key)) END"
#define RATE_ROWS                                                                                  \
    "(SELECT array_agg(r.slot_us ORDER BY r.slot) FROM jobcap.queue_rates r"                       \
    "  WHERE r.queue = q.queue),"                                                                  \
    " (SELECT array_agg(r.newest ORDER BY r.slot) FROM jobcap.queue_rates r"                       \
    "  WHERE r.queue = q.queue),"                                                                  \
    " (SELECT array_agg(cardinality(r.counts) ORDER BY r.slot) FROM jobcap.queue_rates r"          \
    "  WHERE r.queue = q.queue),"                                                                  \
    " (SELECT array_agg(u.c ORDER BY r.slot, u.o) FROM jobcap.queue_rates r,"                      \
    "    unnest(r.counts) WITH ORDINALITY u(c, o) WHERE r.queue = q.queue)"
#define NO_FLOW                                                                                    \
    "NULL::int4, NULL::interval, NULL::int8[], NULL::int8[], NULL::int4[], NULL::int4[],"          \
    " NULL::int8"

JOBCAP_STATEMENT(queue_stats,
                 QUEUE_STATS("q.paused, q.max_running",
                             "(SELECT count(*) FROM jobcap.jobs w"
                             "   WHERE w.state = 'waiting' AND w.queue = q.queue)",
                             "q.rate_limit, q.rate_period, " RATE_ROWS ", " HELD_BY_KEY, ""),
                 {TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID});

// compat(0.2.0): the same on the 0.2.0 schema (no waiting jobs).
JOBCAP_STATEMENT(queue_stats_0_2, QUEUE_STATS("q.paused, q.max_running", "0::bigint", NO_FLOW, ""),
                 {TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID});

// compat(0.1.0): the same on the 0.1.0 schema (no controls yet), between installing this
// library and ALTER EXTENSION jobcap UPDATE: the reaper's report and the 0.1.0 queue_stats run
// it.
JOBCAP_STATEMENT(queue_stats_0_1, QUEUE_STATS("false, NULL::int4", "0::bigint", NO_FLOW, ""),
                 {TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID});

// Counts the jobs that finished in ($1, upto], where upto is $2 (the settled horizon) or, when
// more than $3 jobs finished by then, the finishing time of the $3-th (a job is counted in the
// call that covers its finished_at, so ties are counted together). Each job adds to its queue's
// minute of finishing: succeeded or cancelled, and its claim latency when it was ever claimed.
// Dead jobs are counted from jobs_dead directly. Minutes older than 25 hours go. fin reads one
// range per state (FINISHED_IN): with the three states in one IN list, which is jobs_finished's
// predicate, the planner would have no condition left on that index's first column and would
// read the whole index (or the table) at every count, once a second, however many finished jobs
// are kept.
#define FINISHED_IN(STATE)                                                                         \
    "SELECT j.queue, j.state,"                                                                     \
    "   date_bin('1 minute', j.finished_at, '2000-01-01 00:00+00') AS minute,"                     \
    "   extract(epoch FROM j.first_claimed_at - j.enqueued_at)::float8 * 1000 AS ms"               \
    " FROM jobcap.jobs j WHERE j.state = " STATE                                                   \
    "   AND j.finished_at > $1 AND j.finished_at <= (SELECT t FROM upto)"

JOBCAP_STATEMENT(refresh_stats, "WITH upto AS (SELECT coalesce((SELECT x.f FROM ("
    "     (SELECT j.finished_at AS f FROM jobcap.jobs j WHERE j.state = 'succeeded'"
    "       AND j.finished_at > $1 AND j.finished_at <= $2 ORDER BY j.finished_at LIMIT $3)"
    "     UNION ALL (SELECT j.finished_at FROM jobcap.jobs j WHERE j.state = 'dead'"
    "       AND j.finished_at > $1 AND j.finished_at <= $2 ORDER BY j.finished_at LIMIT $3)"
    "     UNION ALL (SELECT j.finished_at FROM jobcap.jobs j WHERE j.state = 'cancelled'"
    "       AND j.finished_at > $1 AND j.finished_at <= $2 ORDER BY j.finished_at LIMIT $3)) x"
    "   ORDER BY x.f OFFSET $3 - 1 LIMIT 1), $2) AS t),"
    " fin AS MATERIALIZED (" FINISHED_IN("'succeeded'") " UNION ALL " FINISHED_IN("'dead'")
    " UNION ALL " FINISHED_IN("'cancelled'") "),"
    " minutes AS (INSERT INTO jobcap.stats_minutes AS m (queue, minute, succeeded, cancelled)"
    "   SELECT f.queue, f.minute, count(*) FILTER (WHERE f.state = 'succeeded'),"
    "     count(*) FILTER (WHERE f.state = 'cancelled')"
    "   FROM fin f WHERE f.state <> 'dead' GROUP BY f.queue, f.minute"
    "   ON CONFLICT (queue, minute) DO UPDATE SET succeeded = m.succeeded + excluded.succeeded,"
    "     cancelled = m.cancelled + excluded.cancelled),"
    " latency AS (INSERT INTO jobcap.stats_latency AS l (queue, minute, bin, jobs)"
    "   SELECT f.queue, f.minute, " JOBCAP_LATENCY_BIN_SQL("f.ms") ", count(*)"
    "   FROM fin f WHERE f.ms IS NOT NULL GROUP BY 1, 2, 3"
    "   ON CONFLICT (queue, minute, bin) DO UPDATE SET jobs = l.jobs + excluded.jobs),"
    " old_minutes AS (DELETE FROM jobcap.stats_minutes m"
    "   WHERE m.minute < $2 - interval '25 hours'),"
    " old_latency AS (DELETE FROM jobcap.stats_latency l"
    "   WHERE l.minute < $2 - interval '25 hours'),"
    " progress AS (UPDATE jobcap.stats_progress SET counted_until = (SELECT t FROM upto)"
    "   RETURNING counted_until)"
    " SELECT (SELECT count(*) FROM fin), (SELECT counted_until FROM progress)",
    {TIMESTAMPTZOID, TIMESTAMPTZOID, INT4OID});

}  // namespace statements

namespace {

// One counter at a time: the worker and a scheduled refresh_stats() never count a job twice.
JOBCAP_STATEMENT(lock_progress,
                 "SELECT counted_until FROM jobcap.stats_progress FOR UPDATE SKIP LOCKED", {});

// The oldest transaction of this database that may still commit a death, a failure or a
// completion: one that has written, or is running a statement (or a fast-path call). Its writes
// carry times after its start. Autovacuum writes no jobs. Column 2 counts writers whose start
// cannot be known, which hold the window back as far as it may go (see settled_horizon):
// sessions hidden from this role, sessions with track_activities off ('disabled': no start
// time), and prepared transactions of this database (no session; their writes may date from
// any time before they were prepared).
JOBCAP_STATEMENT(
    oldest_writer,
    "SELECT min(a.xact_start) FILTER (WHERE a.backend_xid IS NOT NULL"
    "         OR a.state IN ('active', 'fastpath function call')),"
    "       count(*) FILTER (WHERE (a.state IS NULL AND a.query = '<insufficient privilege>')"
    "         OR a.state = 'disabled' OR (a.backend_xid IS NOT NULL AND a.xact_start IS NULL))"
    "       + (SELECT count(*) FROM pg_catalog.pg_prepared_xacts p"
    "           WHERE p.database = pg_catalog.current_database())"
    " FROM pg_catalog.pg_stat_activity a"
    " WHERE a.datname = pg_catalog.current_database() AND a.pid <> pg_catalog.pg_backend_pid()"
    "   AND a.backend_type IS DISTINCT FROM 'autovacuum worker'",
    {});

}  // namespace

TimestampTz settled_horizon(TimestampTz now, TimestampTz since)
{
    TimestampTz horizon = now;
    bool null = false;
    // pg_stat_activity is read once per transaction and then served from a copy: a second
    // look in the same transaction would see sessions as they were. Read it afresh.
    pgstat_clear_backend_activity_snapshot();
    execute(oldest_writer, Params(), SPI_OK_SELECT);
    Datum oldest = result_column(0, 1, &null);
    if (!null && DatumGetTimestampTz(oldest) < horizon)
        horizon = DatumGetTimestampTz(oldest);
    // A transaction open for ages must not stall the window: it may miss its own writes.
    TimestampTz floor = now - (int64) 5 * guc_report_interval_s * USECS_PER_SEC;
    if (DatumGetInt64(result_column(0, 2)) > 0 || horizon < floor)
        horizon = floor;
    if (horizon < since)
        horizon = since;
    return horizon;
}

namespace {

// Row r's due jobs held back by each limit of the queue (-1: it has no such limit): what a
// claim now could not take, counting the queue's pause nowhere (paused says that).
void held_back(uint64 r, TimestampTz now, QueueStats& s)
{
    s.held_by_max_running =
        s.max_running == 0 ? -1 : Max(0, s.pending - Max(0, s.max_running - s.running));
    bool unrated = false, no_rows = false, unkeyed = false;
    Datum limit = result_column(r, 20, &unrated);
    s.held_by_rate = -1;
    if (!unrated) {
        int64 slot_us = core::rate_slot_us(rate_period_usec(result_column(r, 21)));
        Datum slots_us = result_column(r, 22, &no_rows);
        RateRows window = rate_rows(0);
        if (!no_rows) {
            Datum *widths = nullptr, *newest = nullptr, *lengths = nullptr, *counts = nullptr;
            bool* null_counts = nullptr;
            int n = 0, nn = 0, nl = 0, nc = 0;
            deconstruct_array(DatumGetArrayTypeP(slots_us), INT8OID, 8, FLOAT8PASSBYVAL,
                              TYPALIGN_DOUBLE, &widths, nullptr, &n);
            deconstruct_array(DatumGetArrayTypeP(result_column(r, 23)), INT8OID, 8, FLOAT8PASSBYVAL,
                              TYPALIGN_DOUBLE, &newest, nullptr, &nn);
            deconstruct_array(DatumGetArrayTypeP(result_column(r, 24)), INT4OID, 4, true,
                              TYPALIGN_INT, &lengths, nullptr, &nl);
            deconstruct_array(DatumGetArrayTypeP(result_column(r, 25)), INT4OID, 4, true,
                              TYPALIGN_INT, &counts, &null_counts, &nc);
            window = rate_rows(n);
            int at = 0;
            for (int i = 0; i < n && i < nn && i < nl; ++i) {
                int32 row[core::kRateRing] = {};
                int length = DatumGetInt32(lengths[i]);
                for (int c = 0; c < length && at + c < nc; ++c)
                    if (c < core::kRateRing && !null_counts[at + c])
                        row[c] = DatumGetInt32(counts[at + c]);
                at += length;
                add_rate_row(window, false, DatumGetInt64(widths[i]), DatumGetInt64(newest[i]), row,
                             slot_us, now);
            }
        }
        s.held_by_rate =
            Max(0, s.pending - rate_rows_room(window, slot_us, now, DatumGetInt32(limit)));
    }
    Datum held = result_column(r, 26, &unkeyed);
    s.held_by_key = unkeyed ? -1 : DatumGetInt64(held);
}

}  // namespace

uint64 collect_stats(StatsWindow& w, QueueStats** out)
{
    Params p;
    p.add(TimestampTzGetDatum(w.since)).add(TimestampTzGetDatum(w.until));
    p.add(TimestampTzGetDatum(w.now));
    // compat(0.1.0): the 0.1.0 schema's figures, without queue controls. compat(0.2.0): the
    // 0.2.0 schema's, without waiting jobs.
    uint64 rows = execute(workflows_schema_exists()       ? statements::queue_stats
                          : queues_paused_column_exists() ? statements::queue_stats_0_2
                                                          : statements::queue_stats_0_1,
                          p, SPI_OK_SELECT);
    QueueStats* stats = static_cast<QueueStats*>(SPI_palloc(sizeof(QueueStats) * (rows + 1)));
    memset(stats, 0, sizeof(QueueStats) * (rows + 1));
    w.counted = false;
    w.counted_until = 0;
    for (uint64 r = 0; r < rows; ++r) {
        QueueStats& s = stats[r];
        text_to_cstring_buffer(DatumGetTextPP(result_column(r, 1)), s.queue, sizeof s.queue);
        int64* n[] = {&s.pending,     &s.scheduled,    &s.running,         &s.dead,
                      &s.succeeded,   &s.cancelled,    &s.failed_attempts, &s.failing_jobs,
                      &s.lost_leases, &s.crashed_jobs, &s.new_dead};
        for (int c = 0; c < 11; ++c)
            *n[c] = DatumGetInt64(result_column(r, c + 2));

        bool no_bins = false;
        Datum bins = result_column(r, 13, &no_bins);
        if (!no_bins) {
            Datum* b = nullptr;
            Datum* j = nullptr;
            int nb = 0;
            int nj = 0;
            deconstruct_array(DatumGetArrayTypeP(bins), INT2OID, 2, true, TYPALIGN_SHORT, &b,
                              nullptr, &nb);
            deconstruct_array(DatumGetArrayTypeP(result_column(r, 14)), INT8OID, 8, FLOAT8PASSBYVAL,
                              TYPALIGN_DOUBLE, &j, nullptr, &nj);
            int16* bin = static_cast<int16*>(palloc(sizeof(int16) * (nb + 1)));
            int64* jobs = static_cast<int64*>(palloc(sizeof(int64) * (nb + 1)));
            for (int i = 0; i < nb && i < nj; ++i) {
                bin[i] = DatumGetInt16(b[i]);
                jobs[i] = DatumGetInt64(j[i]);
            }
            int count = Min(nb, nj);
            s.has_latency = core::latency_quantile(bin, jobs, count, 0.5, &s.latency_p50) &&
                            core::latency_quantile(bin, jobs, count, 0.95, &s.latency_p95);
        }
        bool no_oldest = false;
        Datum oldest = result_column(r, 15, &no_oldest);
        s.has_oldest = !no_oldest;
        s.oldest_pending_sec = no_oldest ? 0.0 : DatumGetFloat8(oldest);
        w.counted_until = DatumGetTimestampTz(result_column(r, 16));
        s.paused = DatumGetBool(result_column(r, 17));
        bool uncapped = false;
        Datum cap = result_column(r, 18, &uncapped);
        s.max_running = uncapped ? 0 : DatumGetInt32(cap);
        s.waiting = DatumGetInt64(result_column(r, 19));
        held_back(r, w.now, s);
    }
    if (rows == 0) {
        // No queue: the watermark still tells whether counting runs.
        w.counted_until = 0;
    }
    w.counted = rows > 0 && w.counted_until > w.since;
    *out = stats;
    return rows;
}

namespace {

// On a Citus node: every job of the node's shards that finished in (since, horizon], shard by
// shard, all of them (a bound per shard would end each shard's count at a different time, and
// the node has one counted_until); each shard's statement moves counted_until to horizon.
int64 refresh_counts_on_shards(TimestampTz since, TimestampTz horizon)
{
    citus::Shard* shards = nullptr;
    int n = citus::local_shards(&shards);
    int64 counted = 0;
    for (int i = 0; i < n; ++i) {
        if (!citus::route_local(shards[i]))
            continue;
        Params p;
        p.add(TimestampTzGetDatum(since)).add(TimestampTzGetDatum(horizon));
        p.add(Int32GetDatum(PG_INT32_MAX));
        execute(statements::refresh_stats, p, SPI_OK_SELECT);
        citus::unroute();
        counted += DatumGetInt64(result_column(0, 1));
    }
    pfree(shards);
    return counted;
}

}  // namespace

int64 refresh_counts(int32 max_jobs)
{
    if (execute(lock_progress, Params(), SPI_OK_SELECT) == 0)
        return -1;
    TimestampTz since = DatumGetTimestampTz(result_column(0, 1));
    TimestampTz horizon = settled_horizon(GetCurrentTimestamp(), since);
    if (citus::loaded() && citus::distributed() && citus::routed == nullptr)
        return refresh_counts_on_shards(since, horizon);
    Params p;
    p.add(TimestampTzGetDatum(since)).add(TimestampTzGetDatum(horizon));
    p.add(Int32GetDatum(max_jobs));
    execute(statements::refresh_stats, p, SPI_OK_SELECT);
    return DatumGetInt64(result_column(0, 1));
}

}  // namespace jobcap
