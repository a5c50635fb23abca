// The bounded error history, written inside the statement that settles the job, so history and
// state change together. SOURCE names a CTE of settled jobs with columns job_id, queue,
// attempts, fence, worker; KIND, ERROR and AT (the call's clock reading) are SQL expressions. One row per job is added and the
// job's history cut to its newest jobcap.error_history rows (the DELETE does not see the row the
// INSERT adds: one statement, one snapshot, hence "- 1"). Writers hold the job's row lock, so
// two writers never prune one job's history at once.
#pragma once

#define JOBCAP_HISTORY_CTES(SOURCE, KIND, ERROR, AT)                                               \
    " history_added AS (INSERT INTO jobcap.job_errors"                                             \
    "     (job_id, queue, attempt, fence, kind, worker, error, at)"                                \
    "   SELECT s.job_id, s.queue, s.attempts, s.fence, " KIND ", s.worker, " ERROR ", " AT         \
    "     FROM " SOURCE                                                                            \
    " s WHERE pg_catalog.current_setting('jobcap.error_history')::int > 0),"                       \
    " history_pruned AS (DELETE FROM jobcap.job_errors e USING " SOURCE                            \
    " s"                                                                                           \
    "   WHERE e.job_id = s.job_id AND e.seq <= (SELECT e2.seq FROM jobcap.job_errors e2"           \
    "     WHERE e2.job_id = s.job_id ORDER BY e2.seq DESC"                                         \
    "     OFFSET greatest(pg_catalog.current_setting('jobcap.error_history')::int - 1, 0) LIMIT "  \
    "1))"
