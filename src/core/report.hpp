// The background worker's report line, decided and worded without PostgreSQL. One line per queue
// per jobcap.report_interval, and only when the queue got worse since the previous report. Every
// figure counts distinct jobs: four poison jobs are four jobs, however many attempts they burned.
#pragma once

#include <cstddef>
#include <cstdint>

namespace jobcap::core {

// What the worker measured for one queue over one report window.
struct QueueWindow {
    std::int64_t new_dead = 0;         // jobs that went dead in the window
    std::int64_t dead = 0;             // dead jobs now (all time)
    std::int64_t lease_jobs = 0;       // distinct jobs that lost an attempt without a report (a
                                       // worker's crash_job, an expired lease, a rolled-back claim)
    std::int64_t lease_attempts = 0;   // the attempts they lost
    std::int64_t due = 0;              // pending jobs whose run_at has come
    std::int64_t due_before = -1;      // the same at the previous report; -1: no previous report
    std::int64_t oldest_due_sec = 0;   // age of the oldest due job, seconds
    std::int64_t window_sec = 0;       // the report interval, seconds
    std::int64_t failing_jobs = 0;     // distinct jobs that reported an error (fail_job)
    std::int64_t failed_attempts = 0;  // the attempts they failed
};

// A backlog is growing when more jobs are due than at the previous report and the oldest of them
// has waited longer than a whole window: the workers are not draining it.
bool backlog_growing(const QueueWindow& w) noexcept;

// True when the queue got worse: new dead jobs, attempts lost to crashes, or a growing
// backlog. Only then is a line written. Reported errors alone are not news (the job is retried,
// and a job that keeps failing goes dead, which is); a line that is written says them too.
bool got_worse(const QueueWindow& w) noexcept;

// Writes the line (without the queue name prefix the caller adds) into out, NUL-terminated and
// cut to out_size. Returns false, writing nothing, when the queue did not get worse.
//   1 job went dead (3 dead in all); 4 jobs failed 40 attempts; 2 jobs lost 5 attempts to
//   crashes, expired leases or rolled-back claims; backlog 120 due (was 80), oldest waiting 5 min
bool report_line(const QueueWindow& w, char* out, std::size_t out_size) noexcept;

// "45 s", "12 min", "3 h", "2 d": a coarse age for people.
void format_age(std::int64_t seconds, char* out, std::size_t out_size) noexcept;

}  // namespace jobcap::core
