// The errors every family of functions shares: bad arguments, unknown objects, stale fences.
#include "spi/access.hpp"
#include "spi/citus.hpp"
#include "spi/errors.hpp"
#include "spi/plans.hpp"
#include "spi/statements.hpp"

namespace jobcap {
namespace {

int sqlstate(core::Fault fault)
{
    switch (fault) {
    case core::Fault::null_value:
        return ERRCODE_NULL_VALUE_NOT_ALLOWED;
    case core::Fault::out_of_range:
        return ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE;
    case core::Fault::invalid_value:
    case core::Fault::none:
        break;
    }
    return ERRCODE_INVALID_PARAMETER_VALUE;
}

// The current state and fence of a job, read only to explain a failed compare-and-swap,
// whether the caller ($2) may work it at all, and the kind of its last history row (a snooze or
// an attempt past its run-time limit explains a pending or dead job).
JOBCAP_STATEMENT(job_now,
                 "SELECT state::text, fence, " JOBCAP_MAY_WORK(
                     "$2", "jobs.queue") ", (SELECT e.kind FROM jobcap.job_errors e"
                                         "   WHERE e.job_id = $1 ORDER BY e.seq DESC LIMIT 1)"
                                         " FROM jobcap.jobs WHERE job_id = $1",
                 {INT8OID, OIDOID}, PlanKind::generic);

}  // namespace

namespace statements {
JOBCAP_STATEMENT(queue_exists, "SELECT FROM jobcap.queues WHERE queue = $1", {TEXTOID});
}  // namespace statements

void refuse_subtransaction(const char* function, const char* detail, const char* hint)
{
    if (IsSubTransaction())
        ereport(ERROR, (errcode(ERRCODE_ACTIVE_SQL_TRANSACTION),
                        errmsg("%s cannot run inside a subtransaction", function),
                        errdetail("%s", detail), errhint("%s", hint)));
}

void raise_problem(const core::Problem& problem)
{
    ereport(ERROR, (errcode(sqlstate(problem.fault)), errmsg("%s", problem.message),
                    problem.hint[0] ? errhint("%s", problem.hint) : 0));
    pg_unreachable();
}

void raise_unknown_job(int64 job_id)
{
    ereport(ERROR, (errcode(ERRCODE_UNDEFINED_OBJECT),
                    errmsg("job %lld does not exist", static_cast<long long>(job_id))));
    pg_unreachable();
}

void raise_unknown_queue(const char* queue)
{
    ereport(ERROR, (errcode(ERRCODE_UNDEFINED_OBJECT), errmsg("queue \"%s\" does not exist", queue),
                    errhint("Create it with jobcap.create_queue('%s').", queue)));
    pg_unreachable();
}

void raise_not_current(const Access& access, const char* function, int64 job_id, int64 fence)
{
    Params p;
    p.add(Int64GetDatum(job_id)).add_caller(access);
    // A caller denied the job's queue learns nothing more, not even whether the job exists.
    // On a Citus node a fence that is not the job's may have routed the call to another shard.
    uint64 rows = execute(job_now, p, SPI_OK_SELECT);
    if (rows == 0 && citus::routed != nullptr)
        rows = citus::job_now_across_shards(p);
    if (rows == 0) {
        if (access.privileged)
            raise_unknown_job(job_id);
        deny_job(function, job_id);
    }
    if (!DatumGetBool(result_column(0, 3)))
        deny_job(function, job_id);

    const char* state = TextDatumGetCString(result_column(0, 1));
    int64 current = DatumGetInt64(result_column(0, 2));
    bool no_kind = false;
    Datum kind = result_column(0, 4, &no_kind);
    const char* last = no_kind ? "" : TextDatumGetCString(kind);
    bool settled = fence == current && strcmp(state, "running") != 0;
    const char* why;
    if (settled && strcmp(last, "timed_out") == 0 &&
        (strcmp(state, "pending") == 0 || strcmp(state, "dead") == 0))
        why = "The attempt ran past its max_run_time and the background worker ended it.";
    else if (settled && strcmp(last, "snoozed") == 0 &&
             (strcmp(state, "pending") == 0 || strcmp(state, "dead") == 0))
        why = "The job was snoozed.";
    else if (fence > current)
        why =
            "That fence is newer than the job's: its claim rolled back, or it was never this "
            "job's.";
    else if (strcmp(state, "running") == 0 || fence < current)
        why = "The job's lease expired and it was claimed again under a newer fence.";
    else if (strcmp(state, "pending") == 0)
        why =
            "The job is back in the queue: it was released, or its lease expired and the reaper "
            "returned it.";
    else if (strcmp(state, "succeeded") == 0)
        why = "The job has already succeeded.";
    else if (strcmp(state, "dead") == 0)
        why = "The job is dead: its attempts are used up.";
    else
        why = "The job was cancelled.";

    ereport(ERROR,
            (errcode(kStaleFence),
             errmsg("fence %lld of job %lld is not current", static_cast<long long>(fence),
                    static_cast<long long>(job_id)),
             errdetail("%s (%s refused; job state %s, current fence %lld.)", why, function, state,
                       static_cast<long long>(current)),
             errhint("Stop working on this job: its effects in this transaction roll back.")));
    pg_unreachable();
}

}  // namespace jobcap
