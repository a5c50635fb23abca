// The reaper's statement, run by reap_jobs() and by the background worker: expired leases go
// back to pending, or to dead when their attempt was the last; pending jobs over their cap (a
// lowered cap, rows inserted by hand) go to dead. Dead, cancelled and succeeded jobs are never
// touched.
#include "housekeeping/reap.hpp"

#include "spi/access.hpp"
#include "spi/cap.hpp"
#include "spi/history.hpp"
#include "spi/plans.hpp"
#include "spi/schema.hpp"

namespace jobcap {
namespace statements {

// One statement over a materialised cohort. Both locking scans run once and skip rows another
// transaction holds (a worker inside assert_fence, a settle in flight): those are reaped on a
// later pass, never waited for. The UPDATE repeats every guard, inside IS TRUE so that no
// partial index can be chosen for them (the rows are reached by primary key; see
// functions/claim.cpp). A lease that expired counts as a failed attempt with backoff, and leaves
// a history row saying no report came. CAP: the cap of job j joined with queue q, CAP_BY: the
// same with the queue looked up by j.queue (spi/cap.hpp).
// $1 = max_jobs, $2 = now (one clock reading per call: correct inside procedures too).
#define REAP_JOBS(CAP, CAP_BY)                                                                     \
    "WITH expired AS MATERIALIZED ("                                                               \
    "  SELECT j.job_id FROM jobcap.jobs j"                                                         \
    "   WHERE j.state = 'running' AND j.lease_expires_at < $2"                                     \
    "   LIMIT $1 FOR NO KEY UPDATE OF j SKIP LOCKED),"                                             \
    " over_cap AS MATERIALIZED ("                                                                  \
    "  SELECT j.job_id FROM jobcap.jobs j"                                                         \
    "   WHERE j.state = 'pending' AND j.attempts > 0"                                              \
    "     AND j.attempts >= " CAP_BY                                                               \
    "   LIMIT $1 - (SELECT count(*) FROM expired) FOR NO KEY UPDATE OF j SKIP LOCKED),"            \
    " reaped AS (UPDATE jobcap.jobs j"                                                             \
    "   SET state = CASE WHEN j.attempts >= " CAP                                                  \
    " THEN 'dead' ELSE 'pending' END::jobcap.job_state,"                                           \
    "       run_at = CASE WHEN j.attempts >= " CAP                                                 \
    " THEN j.run_at ELSE $2 +"                                                                     \
    "         jobcap.backoff(j.attempts, q.backoff_base, q.backoff_max) END,"                      \
    "       finished_at = CASE WHEN j.attempts >= " CAP                                            \
    " THEN $2 END,"                                                                                \
    "       lease_expires_at = NULL"                                                               \
    "  FROM jobcap.queues q"                                                                       \
    " WHERE j.job_id = ANY (ARRAY(SELECT job_id FROM expired UNION ALL SELECT job_id FROM "        \
    "over_cap))"                                                                                   \
    "   AND q.queue = j.queue"                                                                     \
    "   AND ((j.state = 'running' AND j.lease_expires_at < $2)"                                    \
    "     OR (j.state = 'pending' AND j.attempts >= " CAP                                          \
    ")) IS TRUE"                                                                                   \
    " RETURNING j.job_id, j.queue, j.attempts, j.fence, j.worker, j.state,"                        \
    "   j.job_id = ANY (ARRAY(SELECT job_id FROM expired)) AS lease_lost),"                        \
    " lost AS (SELECT * FROM reaped WHERE lease_lost)," JOBCAP_HISTORY_CTES(                       \
        "lost", "'lease_expired'", "'lease expired without a report'",                             \
        "$2") " SELECT job_id, queue, state FROM reaped ORDER BY job_id"

JOBCAP_STATEMENT(reap_jobs, REAP_JOBS(JOBCAP_CAP, JOBCAP_CAP_BY("j.queue")),
                 {INT4OID, TIMESTAMPTZOID}, PlanKind::steered);

// compat(0.1.0): the same on the 0.1.0 schema (0.1.0's cap rule: no cap_epoch yet), between
// installing this library and ALTER EXTENSION jobcap UPDATE: reap_jobs() and the background
// worker both reap a database still at 0.1.0.
JOBCAP_STATEMENT(reap_jobs_0_1, REAP_JOBS(JOBCAP_CAP_0_1, JOBCAP_CAP_BY_0_1("j.queue")),
                 {INT4OID, TIMESTAMPTZOID}, PlanKind::steered);

}  // namespace statements

uint64 reap(int32 max_jobs, ReapedRow row, void* arg)
{
    TimestampTz now = GetCurrentTimestamp();
    Params p;
    p.add(Int32GetDatum(max_jobs)).add(TimestampTzGetDatum(now));
    // compat(0.1.0): the 0.1.0 schema's reaper.
    uint64 rows =
        execute(queues_paused_column_exists() ? statements::reap_jobs : statements::reap_jobs_0_1,
                p, SPI_OK_SELECT);
    int64* ended = static_cast<int64*>(palloc(sizeof(int64) * Max(rows, 1)));
    for (uint64 r = 0; r < rows; ++r) {
        if (row != nullptr)
            row(arg, result_column(r, 1), result_column(r, 2), result_column(r, 3));
        ended[r] = DatumGetInt64(result_column(r, 1));
    }
    // The jobs that went dead take their dependents with them (the others are ignored).
    cancel_dependents(ended, static_cast<int>(rows), now);
    pfree(ended);
    int32 left = max_jobs - static_cast<int32>(rows);
    uint64 timed_out = time_out_overdue(left, now, row, arg);
    left -= static_cast<int32>(timed_out);
    return rows + timed_out + expire_unclaimed(left, now, row, arg);
}

}  // namespace jobcap
