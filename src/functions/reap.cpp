// reap_jobs: expired leases go back to pending, or to dead when their attempt was the last;
// pending jobs over their cap (a lowered cap, rows inserted by hand) go to dead. Dead,
// cancelled and succeeded jobs are never touched.
#include "functions/reap.hpp"

#include "spi/access.hpp"
#include "spi/args.hpp"
#include "boundary.hpp"
#include "spi/errors.hpp"
#include "spi/history.hpp"
#include "spi/plans.hpp"
#include "spi/statements.hpp"
#include "spi/cap.hpp"

namespace jobcap {
namespace statements {

#define CAP JOBCAP_CAP

// One statement over a materialised cohort. Both locking scans run once and skip rows another
// transaction holds (a worker inside assert_fence, a settle in flight): those are reaped on a
// later pass, never waited for. The UPDATE repeats every guard, inside IS TRUE so that no
// partial index can be chosen for them (the rows are reached by primary key; see claim.cpp). A lease that expired counts as
// a failed attempt with backoff, and leaves a history row saying no report came.
// $1 = max_jobs, $2 = now (one clock reading per call: correct inside procedures too).
JOBCAP_STATEMENT(
    reap_jobs,
    "WITH expired AS MATERIALIZED ("
    "  SELECT j.job_id FROM jobcap.jobs j"
    "   WHERE j.state = 'running' AND j.lease_expires_at < $2"
    "   LIMIT $1 FOR NO KEY UPDATE OF j SKIP LOCKED),"
    " over_cap AS MATERIALIZED ("
    "  SELECT j.job_id FROM jobcap.jobs j"
    "   WHERE j.state = 'pending' AND j.attempts > 0"
    "     AND j.attempts >= " JOBCAP_CAP_BY("j.queue")
    "   LIMIT $1 - (SELECT count(*) FROM expired) FOR NO KEY UPDATE OF j SKIP LOCKED),"
    " reaped AS (UPDATE jobcap.jobs j"
    "   SET state = CASE WHEN j.attempts >= " CAP
    " THEN 'dead' ELSE 'pending' END::jobcap.job_state,"
    "       run_at = CASE WHEN j.attempts >= " CAP
    " THEN j.run_at ELSE $2 +"
    "         jobcap.backoff(j.attempts, q.backoff_base, q.backoff_max) END,"
    "       finished_at = CASE WHEN j.attempts >= " CAP
    " THEN $2 END,"
    "       lease_expires_at = NULL"
    "  FROM jobcap.queues q"
    " WHERE j.job_id = ANY (ARRAY(SELECT job_id FROM expired UNION ALL SELECT job_id FROM "
    "over_cap))"
    "   AND q.queue = j.queue"
    "   AND ((j.state = 'running' AND j.lease_expires_at < $2)"
    "     OR (j.state = 'pending' AND j.attempts >= " CAP
    ")) IS TRUE"
    " RETURNING j.job_id, j.queue, j.attempts, j.fence, j.worker, j.state,"
    "   j.job_id = ANY (ARRAY(SELECT job_id FROM expired)) AS lease_lost),"
    " lost AS (SELECT * FROM reaped WHERE lease_lost)," JOBCAP_HISTORY_CTES(
        "lost", "'lease_expired'", "'lease expired without a report'",
        "$2") " SELECT job_id, queue, state FROM reaped ORDER BY job_id",
    {INT4OID, TIMESTAMPTZOID}, PlanKind::steered);

}  // namespace statements

uint64 reap(int32 max_jobs)
{
    Params p;
    p.add(Int32GetDatum(max_jobs)).add(TimestampTzGetDatum(GetCurrentTimestamp()));
    return execute(statements::reap_jobs, p, SPI_OK_SELECT);
}

}  // namespace jobcap

using namespace jobcap;

JOBCAP_FUNCTION(reap_jobs, Duty::operator_)
{
    int32 max_jobs = arg_count(fcinfo, 0, "max_jobs", core::kMaxReapBatch);
    InitMaterializedSRF(fcinfo, 0);
    ReturnSetInfo* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);

    spi_open(access);
    uint64 rows = reap(max_jobs);
    for (uint64 r = 0; r < rows; ++r) {
        Datum values[3] = {result_column(r, 1), result_column(r, 2), result_column(r, 3)};
        bool nulls[3] = {false, false, false};
        tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
    }
    spi_close(access);
    return (Datum) 0;
}
