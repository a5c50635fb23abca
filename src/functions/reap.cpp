// reap_jobs: the reaper (housekeeping/reap.hpp) called from SQL, for a server without the
// background worker (pg_cron, cron + psql).
#include "boundary.hpp"
#include "housekeeping/reap.hpp"
#include "housekeeping/rollbacks.hpp"
#include "spi/access.hpp"
#include "spi/args.hpp"
#include "spi/plans.hpp"

namespace {

// A reaped job into reap_jobs' result.
void put_reaped(void* arg, Datum job_id, Datum queue, Datum state)
{
    ReturnSetInfo* rsinfo = static_cast<ReturnSetInfo*>(arg);
    Datum values[3] = {job_id, queue, state};
    bool nulls[3] = {false, false, false};
    tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
}

}  // namespace

using namespace jobcap;

JOBCAP_FUNCTION(reap_jobs, Duty::operator_)
{
    int32 max_jobs = arg_count(fcinfo, 0, "max_jobs", core::kMaxReapBatch);
    InitMaterializedSRF(fcinfo, 0);
    ReturnSetInfo* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);

    spi_open(access);
    reap(max_jobs, put_reaped, rsinfo);
    spi_close(access);
    return (Datum) 0;
}

// A rolled-back claim counted where its job is: on a Citus cluster the background worker of a
// node whose shard of the job moved away after the rollback calls this, and Citus delegates the
// call by the fence to the node that holds the shard now (background/reaper.cpp). The count is
// the reaper's own (count_rolled_back): only a job still pending, below its cap, with a fence
// lower than the claim's. True when it counted. Not granted to anyone: superusers and the
// owner's members (the background worker) only.
JOBCAP_FUNCTION(count_rolled_back_claim, Duty::owner)
{
    RolledBackClaim claim = {};
    claim.job_id = arg_job_id(fcinfo, 0);
    claim.fence = arg_fence(fcinfo, 1);
    text_to_cstring_buffer(DatumGetTextPP(arg_required(fcinfo, 2, "worker")), claim.worker,
                           sizeof claim.worker);
    bool dead = false;
    spi_open(access);
    bool counted = count_rolled_back(claim, &dead);
    spi_close(access);
    return BoolGetDatum(counted);
}
