// reap_jobs: the reaper (housekeeping/reap.hpp) called from SQL, for a server without the
// background worker (pg_cron, cron + psql).
#include "boundary.hpp"
#include "housekeeping/reap.hpp"
#include "spi/access.hpp"
#include "spi/args.hpp"
#include "spi/plans.hpp"

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
