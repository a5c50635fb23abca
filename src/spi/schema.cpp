#include "spi/schema.hpp"

extern "C" {
#include "catalog/namespace.h"
#include "utils/lsyscache.h"
}

namespace jobcap {
namespace {

// The oid of relation jobcap.name, or InvalidOid.
Oid jobcap_relation(const char* name)
{
    Oid schema = get_namespace_oid("jobcap", true);
    return OidIsValid(schema) ? get_relname_relid(name, schema) : InvalidOid;
}

}  // namespace

bool queues_paused_column_exists()
{
    Oid queues = jobcap_relation("queues");
    return OidIsValid(queues) && get_attnum(queues, "paused") != InvalidAttrNumber;
}

bool job_schedules_table_exists()
{
    return OidIsValid(jobcap_relation("job_schedules"));
}

bool workflows_schema_exists()
{
    return OidIsValid(jobcap_relation("job_dependencies"));
}

bool flow_schema_exists()
{
    return OidIsValid(jobcap_relation("queue_rates"));
}

}  // namespace jobcap
