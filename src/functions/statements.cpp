// jobcap.statements(): the SQL text and parameter types of the statements jobcap prepares, so
// that a DBA (and the plan-shape tests) can PREPARE and EXPLAIN exactly what runs.
#include "spi/access.hpp"
#include "boundary.hpp"
#include "spi/statements.hpp"

namespace jobcap {
namespace {

struct Named {
    const char* name;
    const Statement* statement;
};

const Named kStatements[] = {
    {"enqueue_job", &statements::insert_job},     {"enqueue_jobs", &statements::insert_jobs},
    {"claim_job", &statements::claim_batch},
    {"claim_job_by_id", &statements::claim_one},  {"complete_job", &statements::complete},
    {"complete_jobs", &statements::complete_many},
    {"fail_job", &statements::fail},              {"crash_job", &statements::crash},
    {"release_job", &statements::release},        {"heartbeat", &statements::heartbeat},
    {"assert_fence", &statements::assert_current}, {"reap_jobs", &statements::reap_cohort},
    {"queue_stats", &statements::queue_stats},     {"refresh_stats", &statements::refresh_stats},
};

}  // namespace
}  // namespace jobcap

using namespace jobcap;

JOBCAP_FUNCTION(jobcap_statements)
{
    return guard("statements", [&]() -> Datum {
        admit("statements", Duty::operator_);
        InitMaterializedSRF(fcinfo, 0);
        ReturnSetInfo* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
        for (const Named& n : kStatements) {
            Datum* types = static_cast<Datum*>(palloc(sizeof(Datum) * (n.statement->nargs + 1)));
            for (int i = 0; i < n.statement->nargs; ++i)
                types[i] = ObjectIdGetDatum(n.statement->argtypes[i]);
            Datum values[3] = {
                CStringGetTextDatum(n.name),
                PointerGetDatum(construct_array(types, n.statement->nargs, REGTYPEOID,
                                                sizeof(Oid), true, TYPALIGN_INT)),
                CStringGetTextDatum(n.statement->sql)};
            bool nulls[3] = {false, false, false};
            tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
        }
        return (Datum) 0;
    });
}
