// reap_jobs: the reaper (housekeeping/reap.hpp) called from SQL, for a server without the
// background worker (pg_cron, cron + psql).
#include "boundary.hpp"
#include "housekeeping/reap.hpp"
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
