// Statistics shared by jobcap.queue_stats, jobcap.metrics() and the background worker's report:
// one collector, one set of numbers. Call inside an open SPI connection; plain data only.
#pragma once

#include "pg.hpp"

#include "core/rules.hpp"

namespace jobcap {

// jobcap.stats_window: the window of queue_stats, top_failing_jobs and metrics(), in seconds.
extern int guc_stats_window_s;
void define_stats_settings();  // from _PG_init

// One queue's figures. "Now" figures count jobs as they are; window figures count what
// happened in (since, until].
struct QueueStats {
    char queue[core::kMaxQueueName + 1];
    int64 pending;          // now: pending and due
    int64 scheduled;        // now: pending, run_at still ahead
    int64 running;          // now
    int64 dead;             // now (until pruned or requeued)
    int64 succeeded;        // window, from the counts (valid when counted)
    int64 cancelled;        // window, from the counts (valid when counted)
    int64 failed_attempts;  // window: error reports (fail_job)
    int64 failing_jobs;     // window: distinct jobs among them
    int64 lost_leases;      // window: attempts that ended without a report (lease expired,
                            // claim rolled back and counted by the reaper, crash seen by the
                            // worker, run-time limit passed)
    int64 crashed_jobs;     // window: distinct jobs among them
    int64 new_dead;         // window: jobs that went dead
    bool has_latency;       // any claim latency counted in the window
    double latency_p50;     // seconds
    double latency_p95;
    bool has_oldest;  // any due pending job
    double oldest_pending_sec;
    bool paused;        // now: pause_queue
    int32 max_running;  // now: the queue's limit, 0 for none
    int64 waiting;      // now: jobs waiting for the jobs they depend on
    // now: due jobs a claim could not take because of each limit; -1: the queue has none
    int64 held_by_max_running;  // beyond max_running minus the running jobs
    int64 held_by_rate;         // beyond what the rate limit's window admits now
    int64 held_by_key;          // whose concurrency key is at max_running_per_key
};

struct StatsWindow {
    TimestampTz since;
    TimestampTz until;
    TimestampTz now;            // for "now" figures
    TimestampTz counted_until;  // how far finished jobs are counted
    bool counted;               // counted_until > since: the counts cover some of the window
};

// Fills *out (allocated with SPI_palloc, one entry per queue, in queue order) and returns how
// many queues there are. w.since, w.until and w.now must be set.
uint64 collect_stats(StatsWindow& w, QueueStats** out);

// The end of a window that no transaction still running can write into: the start of the
// oldest transaction in this database that has written or is running a statement (a death or
// failure it commits later carries a time after its start), but not before now minus five
// report intervals (a transaction open for ages must not stall the window) nor before since.
TimestampTz settled_horizon(TimestampTz now, TimestampTz since);

// Counts up to max_jobs finished jobs not counted yet, up to the settled horizon. Returns how
// many it counted, or -1 when another call holds the counts.
int64 refresh_counts(int32 max_jobs);

}  // namespace jobcap
