// jobcap.metrics(): the numbers of jobcap.queue_stats (over jobcap.stats_window) in the
// Prometheus text exposition format 0.0.4, for a textfile collector, a scrape proxy or a
// postgres_exporter query. Names are fixed and checked; queue names are escaped as label values.
#include "spi/access.hpp"
#include "boundary.hpp"
#include "spi/errors.hpp"
#include "spi/plans.hpp"
#include "housekeeping/stats.hpp"
#include "spi/schema.hpp"

#include "core/stats.hpp"

namespace jobcap {
namespace {

void help_and_type(StringInfo out, const char* name, const char* type, const char* help)
{
    if (!core::valid_metric_name(name))
        elog(ERROR, "jobcap: invalid metric name \"%s\"", name);
    size_t len = strlen(help);
    char* escaped = static_cast<char*>(palloc(2 * len + 1));
    core::escape_help(help, len, escaped);
    appendStringInfo(out, "# HELP %s %s\n# TYPE %s %s\n", name, escaped, name, type);
    pfree(escaped);
}

// name{queue="...",label="value"} number
void sample(StringInfo out, const char* name, const char* queue, const char* label,
            const char* label_value, double value)
{
    appendStringInfoString(out, name);
    bool any = false;
    if (queue != nullptr) {
        size_t len = strlen(queue);
        char* escaped = static_cast<char*>(palloc(2 * len + 1));
        core::escape_label_value(queue, len, escaped);
        appendStringInfo(out, "{queue=\"%s\"", escaped);
        pfree(escaped);
        any = true;
    }
    if (label != nullptr) {
        if (!core::valid_label_name(label))
            elog(ERROR, "jobcap: invalid label name \"%s\"", label);
        appendStringInfo(out, "%s%s=\"%s\"", any ? "," : "{", label, label_value);
        any = true;
    }
    char number[64];
    core::format_sample_value(value, number, sizeof number);
    appendStringInfo(out, "%s %s\n", any ? "}" : "", number);
}

typedef int64 QueueStats::*Count;

struct PerQueue {
    const char* name;
    Count field;
    bool counted;  // from the worker's counts: left out while nothing is counted
    const char* help;
};

// The due jobs each limit holds back now (collect_stats: -1, left out, for a queue without it).
struct Held {
    const char* name;
    Count field;
    const char* help;
};

const Held kHeld[] = {
    {"jobcap_jobs_held_by_max_running", &QueueStats::held_by_max_running,
     "Due pending jobs beyond the queue's max_running minus its running jobs now: claims take "
     "no more until jobs settle; queues without max_running are left out."},
    {"jobcap_jobs_held_by_rate", &QueueStats::held_by_rate,
     "Due pending jobs beyond what the queue's rate limit admits now (rate_limit claims in any "
     "rate_period); queues without a rate limit are left out."},
    {"jobcap_jobs_held_by_key", &QueueStats::held_by_key,
     "Due pending jobs whose concurrency key is at the queue's max_running_per_key now: claims "
     "skip them until a job of the key settles; queues without a per-key limit are left out."},
};

const PerQueue kWindowCounts[] = {
    {"jobcap_window_succeeded_jobs", &QueueStats::succeeded, true,
     "Jobs that succeeded in the window (counted per minute by jobcap.refresh_stats)."},
    {"jobcap_window_cancelled_jobs", &QueueStats::cancelled, true,
     "Jobs cancelled in the window (counted per minute by jobcap.refresh_stats)."},
    {"jobcap_window_new_dead_jobs", &QueueStats::new_dead, false,
     "Jobs that went dead (attempts used up) in the window."},
    {"jobcap_window_failed_attempts", &QueueStats::failed_attempts, false,
     "Attempts that reported an error (fail_job) in the window."},
    {"jobcap_window_failing_jobs", &QueueStats::failing_jobs, false,
     "Distinct jobs that reported an error in the window: four poison jobs are 4."},
    {"jobcap_window_lost_leases", &QueueStats::lost_leases, false,
     "Attempts that ended without a report in the window: a lease that expired (killed, hung, "
     "timed out), a claim that rolled back, a crash seen by the worker, or an attempt past its "
     "max_run_time."},
    {"jobcap_window_crashed_jobs", &QueueStats::crashed_jobs, false,
     "Distinct jobs that lost a lease or rolled back a claim in the window."},
};

}  // namespace
}  // namespace jobcap

using namespace jobcap;

JOBCAP_FUNCTION(metrics, Duty::operator_)
{
    StatsWindow w = {};
    w.now = GetCurrentTimestamp();
    w.until = w.now;
    w.since = w.now - (int64) guc_stats_window_s * USECS_PER_SEC;

    spi_open(access);
    QueueStats* stats = nullptr;
    uint64 rows = collect_stats(w, &stats);
    spi_close(access);

    StringInfoData out;
    initStringInfo(&out);
    help_and_type(&out, "jobcap_jobs", "gauge",
                  "Jobs in each state now; pending counts due jobs, scheduled those whose "
                  "run_at is ahead, waiting those that wait for jobs they depend on, dead those "
                  "kept until requeued or pruned.");
    static const char* const kStates[] = {"pending", "scheduled", "running", "dead", "waiting"};
    for (uint64 r = 0; r < rows; ++r) {
        int64 n[] = {stats[r].pending, stats[r].scheduled, stats[r].running, stats[r].dead,
                     stats[r].waiting};
        for (int s = 0; s < 5; ++s)
            sample(&out, "jobcap_jobs", stats[r].queue, "state", kStates[s], (double) n[s]);
    }
    help_and_type(&out, "jobcap_queue_paused", "gauge",
                  "1 while the queue is paused (jobcap.pause_queue): it hands out no job.");
    for (uint64 r = 0; r < rows; ++r)
        sample(&out, "jobcap_queue_paused", stats[r].queue, nullptr, nullptr,
               stats[r].paused ? 1.0 : 0.0);
    help_and_type(&out, "jobcap_queue_max_running", "gauge",
                  "The queue's limit on jobs running at once (max_running); queues without "
                  "one are left out.");
    for (uint64 r = 0; r < rows; ++r)
        if (stats[r].max_running > 0)
            sample(&out, "jobcap_queue_max_running", stats[r].queue, nullptr, nullptr,
                   (double) stats[r].max_running);
    for (const Held& h : kHeld) {
        help_and_type(&out, h.name, "gauge", h.help);
        for (uint64 r = 0; r < rows; ++r)
            if (stats[r].*h.field >= 0)
                sample(&out, h.name, stats[r].queue, nullptr, nullptr,
                       (double) (stats[r].*h.field));
    }
    help_and_type(&out, "jobcap_oldest_pending_age_seconds", "gauge",
                  "Age of the oldest due pending job (since its run_at); 0 when none is due.");
    for (uint64 r = 0; r < rows; ++r)
        sample(&out, "jobcap_oldest_pending_age_seconds", stats[r].queue, nullptr, nullptr,
               stats[r].has_oldest ? stats[r].oldest_pending_sec : 0.0);
    help_and_type(&out, "jobcap_window_seconds", "gauge",
                  "Length of the window of the jobcap_window_* figures (jobcap.stats_window).");
    sample(&out, "jobcap_window_seconds", nullptr, nullptr, nullptr, (double) guc_stats_window_s);
    for (const PerQueue& m : kWindowCounts) {
        if (m.counted && !w.counted)
            continue;
        help_and_type(&out, m.name, "gauge", m.help);
        for (uint64 r = 0; r < rows; ++r)
            sample(&out, m.name, stats[r].queue, nullptr, nullptr, (double) (stats[r].*m.field));
    }
    // Quantiles only where some job finished in the window after a claim.
    const char* p_names[] = {"jobcap_window_claim_latency_p50_seconds",
                             "jobcap_window_claim_latency_p95_seconds"};
    const char* p_help[] = {
        "Median wait from enqueue to first claim of the jobs that finished in the window.",
        "95th percentile wait from enqueue to first claim of the jobs that finished in the "
        "window."};
    for (int p = 0; p < 2; ++p) {
        help_and_type(&out, p_names[p], "gauge", p_help[p]);
        for (uint64 r = 0; r < rows; ++r)
            if (stats[r].has_latency)
                sample(&out, p_names[p], stats[r].queue, nullptr, nullptr,
                       p == 0 ? stats[r].latency_p50 : stats[r].latency_p95);
    }
    if (rows > 0) {
        help_and_type(&out, "jobcap_counts_lag_seconds", "gauge",
                      "How far behind now the counts of finished jobs are "
                      "(jobcap.refresh_stats; "
                      "the background worker keeps this to a few seconds).");
        sample(&out, "jobcap_counts_lag_seconds", nullptr, nullptr, nullptr,
               (double) (w.now - w.counted_until) / USECS_PER_SEC);
    }
    PG_RETURN_TEXT_P(cstring_to_text_with_len(out.data, out.len));
}
