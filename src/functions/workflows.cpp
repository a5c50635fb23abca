// snooze_job and job_tree: a worker's "not now" with a bound, and a workflow seen whole
// (docs/workflows.md). What settles with the jobs that depend on a job is
// housekeeping/workflows.hpp.
#include "boundary.hpp"
#include "housekeeping/workflows.hpp"
#include "spi/access.hpp"
#include "spi/args.hpp"
#include "spi/cap.hpp"
#include "spi/errors.hpp"
#include "spi/history.hpp"
#include "spi/plans.hpp"

namespace jobcap {
namespace {

// A job snoozed within its queue's max_snoozes goes back to pending at now + delay with the
// claim's attempt given back (as release_job gives it back: the fence stays stale for good).
// Beyond the bound the attempt counts: pending at now + delay, or dead when it was the last (CAP,
// spi/cap.hpp), so a job that snoozes forever still reaches its cap. FREE: the snooze is within
// the bound, read from the row before the update. $3 = delay, $4 = now, $5 = caller. The history
// row's attempt is the attempt snoozed. Returns the new state, whether to wake the queue's
// listeners (pending, notify on), and the queue.
#define FREE "coalesce(j.snoozes, 0) < q.max_snoozes"
#define ALIVE "(" FREE " OR j.attempts < " JOBCAP_CAP ")"
JOBCAP_STATEMENT(
    snooze_job,
    "WITH snoozed AS (UPDATE jobcap.jobs j"
    "   SET state = CASE WHEN " ALIVE " THEN 'pending' ELSE 'dead' END::jobcap.job_state,"
    "       attempts = j.attempts - (" FREE ")::int,"
    "       snoozes = coalesce(j.snoozes, 0) + 1,"
    "       run_at = CASE WHEN " ALIVE " THEN $4 + $3 ELSE j.run_at END,"
    "       finished_at = CASE WHEN " ALIVE " THEN NULL ELSE $4 END,"
    "       lease_expires_at = NULL"
    "  FROM jobcap.queues q"
    " WHERE j.job_id = $1 AND (j.fence = $2 AND j.state = 'running') IS TRUE AND q.queue = j.queue"
    "   AND " JOBCAP_MAY_WORK("$5", "j.queue")
    " RETURNING j.job_id, j.queue, j.attempts + (j.snoozes <= q.max_snoozes)::int AS attempts,"
    "   j.fence, j.worker, j.state, j.snoozes, q.max_snoozes, j.snoozes <= q.max_snoozes AS free),"
    JOBCAP_HISTORY_CTES(
        "snoozed", "'snoozed'",
        "CASE WHEN s.free THEN format('snoozed for %s (snooze %s of %s)', $3, s.snoozes,"
        " s.max_snoozes) ELSE format('snoozed for %s: over max_snoozes (%s), the attempt counts',"
        " $3, s.max_snoozes) END",
        "$4")
    " SELECT s.state, s.state = 'pending' AND q.notify, s.queue"
    "   FROM snoozed s JOIN jobcap.queues q ON q.queue = s.queue",
    {INT8OID, INT8OID, INTERVALOID, TIMESTAMPTZOID, OIDOID}, PlanKind::generic);

// The workflow of job $1: its ancestors up to the jobs that depend on nothing (the roots), and
// every job that depends on those, directly or not. depth: the longest chain of dependencies
// from a root. reason: for a dead or cancelled job, the last history row that says why. Jobs of
// queues the caller ($2; NULL: every queue) may not work are left out.
JOBCAP_STATEMENT(
    job_tree,
    "WITH RECURSIVE up(job_id) AS (SELECT $1::bigint"
    "   UNION SELECT d.depends_on FROM up u JOIN jobcap.job_dependencies d ON d.job_id = u.job_id),"
    " roots AS (SELECT u.job_id FROM up u WHERE NOT EXISTS (SELECT FROM jobcap.job_dependencies d"
    "   WHERE d.job_id = u.job_id)),"
    " down(job_id, depth) AS (SELECT r.job_id, 0 FROM roots r"
    "   UNION SELECT d.job_id, w.depth + 1 FROM down w"
    "   JOIN jobcap.job_dependencies d ON d.depends_on = w.job_id),"
    " tree AS (SELECT w.job_id, max(w.depth) AS depth FROM down w GROUP BY w.job_id)"
    " SELECT j.job_id, j.queue, j.state, t.depth::int,"
    "   (SELECT array_agg(d.depends_on ORDER BY d.depends_on) FROM jobcap.job_dependencies d"
    "     WHERE d.job_id = j.job_id),"
    "   j.waiting_on, j.attempts, j.enqueued_at, j.finished_at,"
    "   CASE WHEN j.state IN ('dead', 'cancelled') THEN (SELECT e.error FROM jobcap.job_errors e"
    "     WHERE e.job_id = j.job_id AND e.kind <> ALL ('{requeued,released,snoozed}')"
    "     ORDER BY e.seq DESC LIMIT 1) END"
    "  FROM tree t JOIN jobcap.jobs j ON j.job_id = t.job_id"
    " WHERE " JOBCAP_MAY_WORK("$2", "j.queue") " ORDER BY t.depth, j.job_id",
    {INT8OID, OIDOID});

}  // namespace
}  // namespace jobcap

using namespace jobcap;

JOBCAP_FUNCTION(snooze_job, Duty::worker)
{
    int64 job_id = arg_job_id(fcinfo, 0);
    int64 fence = arg_fence(fcinfo, 1);
    bool no_delay = false;
    Datum delay = arg_span(fcinfo, 2, "delay", true, false, &no_delay);
    TimestampTz now = GetCurrentTimestamp();
    Params p;
    p.add(Int64GetDatum(job_id)).add(Int64GetDatum(fence)).add(delay);
    p.add(TimestampTzGetDatum(now)).add_caller(access);

    spi_open(access);
    if (execute(snooze_job, p, SPI_OK_SELECT) == 0)
        raise_not_current(access, function, job_id, fence);
    Datum state = result_column(0, 1);
    char* wake = nullptr;
    if (DatumGetBool(result_column(0, 2))) {
        text* queue = DatumGetTextPP(result_column(0, 3));
        wake = static_cast<char*>(SPI_palloc(VARSIZE_ANY_EXHDR(queue) + 1));
        text_to_cstring_buffer(queue, wake, VARSIZE_ANY_EXHDR(queue) + 1);
    }
    if (job_state_is(state, "dead"))  // its last attempt: the jobs waiting for it go with it
        cancel_dependents(&job_id, 1, now);
    spi_close(access);
    if (wake != nullptr)
        Async_Notify("jobcap", wake);
    return state;
}

// A worker sees the workflows of its queues' jobs; an operator every one.
JOBCAP_FUNCTION(job_tree, Duty::worker)
{
    int64 job_id = arg_job_id(fcinfo, 0);
    bool operates = may_operate(access);
    Params p;
    p.add(Int64GetDatum(job_id)).add(ObjectIdGetDatum(access.caller), operates);
    InitMaterializedSRF(fcinfo, 0);
    ReturnSetInfo* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);

    spi_open(access);
    if (!operates)
        check_job(access, function, job_id);
    uint64 rows = execute(job_tree, p, SPI_OK_SELECT);
    if (rows == 0 && operates)
        raise_unknown_job(job_id);
    for (uint64 r = 0; r < rows; ++r) {
        Datum v[10];
        bool n[10];
        for (int c = 0; c < 10; ++c)
            v[c] = result_column(r, c + 1, &n[c]);
        tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, v, n);
    }
    spi_close(access);
    return (Datum) 0;
}
