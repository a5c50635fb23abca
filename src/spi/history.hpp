// The bounded error history, in SQL (the direct path's is src/direct/history.cpp).
//
// JOBCAP_HISTORY_CTES: written inside the statement that settles the job, so history and state
// change together. SOURCE names a CTE of settled jobs with columns job_id, queue, attempts,
// fence, worker; KIND, ERROR and AT (the call's clock reading) are SQL expressions. One row per
// job is added and the job's history cut to its newest jobcap.error_history rows (the DELETE
// does not see the row the INSERT adds: one statement, one snapshot, hence "- 1"). Writers hold
// the job's row lock, so two writers never prune one job's history at once.
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

// JOBCAP_DELETE_DOOMED: the jobs of CTE doomed (column job_id, rows locked by the statement)
// that still pass GUARD (SQL starting with AND, on job j) deleted with their whole history: CTEs
// gone (the deleted job ids) and history_gone. Retention, purge_dead and purge_pending.
#define JOBCAP_DELETE_DOOMED(GUARD)                                                                \
    " gone AS (DELETE FROM jobcap.jobs j"                                                          \
    "   WHERE j.job_id = ANY (ARRAY(SELECT job_id FROM doomed))" GUARD                             \
    "   RETURNING j.job_id),"                                                                      \
    " history_gone AS (DELETE FROM jobcap.job_errors e"                                            \
    "   WHERE e.job_id = ANY (ARRAY(SELECT job_id FROM gone)))"

// The same on the 0.3.0 schema: a deleted job's edges to the jobs it depended on go with it
// (jobcap.job_dependencies; only a job enqueued with depends_on has any), and gone says which
// deleted jobs others depended on (column has_dependents): the caller cancels those still
// waiting (housekeeping/workflows.hpp). compat(0.2.0): JOBCAP_DELETE_DOOMED on the 0.2.0 schema.
#define JOBCAP_DELETE_DOOMED_WITH_EDGES(GUARD)                                                     \
    " gone AS (DELETE FROM jobcap.jobs j"                                                          \
    "   WHERE j.job_id = ANY (ARRAY(SELECT job_id FROM doomed))" GUARD                             \
    "   RETURNING j.job_id, j.waiting_on IS NOT NULL AS dependent, j.has_dependents),"             \
    " history_gone AS (DELETE FROM jobcap.job_errors e"                                            \
    "   WHERE e.job_id = ANY (ARRAY(SELECT job_id FROM gone))),"                                   \
    " edges_gone AS (DELETE FROM jobcap.job_dependencies d"                                        \
    "   WHERE d.job_id = ANY (ARRAY(SELECT job_id FROM gone WHERE dependent)))"
