#include "spi/access.hpp"

#include "spi/errors.hpp"
#include "spi/plans.hpp"

extern "C" {
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "utils/acl.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"
}

namespace jobcap {
namespace {

// The owner of jobcap.jobs: every table of the extension has the same one (the role that ran
// CREATE EXTENSION). Three syscache look-ups; no state kept between calls, so DROP and CREATE
// EXTENSION in one session (even by another superuser) need no invalidation.
Oid table_owner()
{
    Oid schema = get_namespace_oid("jobcap", true);
    Oid jobs = OidIsValid(schema) ? get_relname_relid("jobs", schema) : InvalidOid;
    HeapTuple tuple = OidIsValid(jobs) ? SearchSysCache1(RELOID, ObjectIdGetDatum(jobs)) : nullptr;
    if (!HeapTupleIsValid(tuple))
        ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                        errmsg("extension \"jobcap\" is not installed in this database"),
                        errhint("Run CREATE EXTENSION jobcap.")));
    Oid owner = reinterpret_cast<Form_pg_class>(GETSTRUCT(tuple))->relowner;
    ReleaseSysCache(tuple);
    return owner;
}

[[noreturn]] void deny(const char* what, const char* detail, const char* hint)
{
    ereport(ERROR,
            (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE), errmsg("permission denied to %s", what),
             errdetail("%s", detail), errhint("%s", hint)));
    pg_unreachable();
}

JOBCAP_STATEMENT(
    queue_access,
    "SELECT EXISTS (SELECT FROM jobcap.queues WHERE queue = $1), " JOBCAP_MAY_WORK("$2", "$1"),
    {TEXTOID, OIDOID}, PlanKind::generic);

JOBCAP_STATEMENT(job_access,
                 "SELECT " JOBCAP_MAY_WORK("$2",
                                           "j.queue") " FROM jobcap.jobs j WHERE j.job_id = $1",
                 {INT8OID, OIDOID}, PlanKind::generic);

}  // namespace

Access admit(const char* function, Duty duty)
{
    Access a = {GetUserId(), InvalidOid, false, InvalidOid, 0};
    if (duty == Duty::anyone)
        return a;
    a.owner = table_owner();
    a.privileged = superuser_arg(a.caller) || has_privs_of_role(a.caller, a.owner);
    if (a.privileged)
        return a;
    switch (duty) {
    case Duty::anyone:
    case Duty::worker:
        break;  // the statements check the queue's grants
    case Duty::operator_: {
        Oid role = get_role_oid("jobcap_operator", true);
        if (!OidIsValid(role) || !has_privs_of_role(a.caller, role))
            deny("manage jobcap queues and jobs",
                 psprintf("jobcap.%s needs the privileges of role jobcap_operator.", function),
                 "Grant jobcap_operator to the role that operates jobcap.");
        break;
    }
    case Duty::owner:
        deny("change jobcap queue grants",
             psprintf("jobcap.%s is for superusers and the owner of jobcap's tables.", function),
             "Ask the owner of the extension.");
    }
    return a;
}

constexpr const char* kPinnedSearchPath = "pg_catalog, jobcap, pg_temp";

void spi_open(Access& a)
{
    if (SPI_connect() != SPI_OK_CONNECT)
        elog(ERROR, "jobcap: SPI_connect failed");
    // What a SET search_path clause does (fmgr_security_definer), for the functions without one.
    // An error before spi_close needs nothing here: abort pops the nest level.
    a.search_path_level = 0;
    if (strcmp(namespace_search_path, kPinnedSearchPath) != 0) {
        a.search_path_level = NewGUCNestLevel();
        (void) set_config_option("search_path", kPinnedSearchPath, PGC_USERSET, PGC_S_SESSION,
                                 GUC_ACTION_SAVE, true, 0, false);
    }
    GetUserIdAndSecContext(&a.saved_user, &a.saved_context);
    // Restricted as well: nothing that runs as the owner can leave session state behind.
    SetUserIdAndSecContext(
        a.owner, a.saved_context | SECURITY_LOCAL_USERID_CHANGE | SECURITY_RESTRICTED_OPERATION);
}

void spi_close(Access& a)
{
    SetUserIdAndSecContext(a.saved_user, a.saved_context);
    if (a.search_path_level > 0) {
        AtEOXact_GUC(true, a.search_path_level);
        a.search_path_level = 0;
    }
    if (SPI_finish() != SPI_OK_FINISH)
        elog(ERROR, "jobcap: SPI_finish failed");
}

Params& Params::add_caller(const Access& a)
{
    return add(ObjectIdGetDatum(a.caller), a.privileged);
}

bool may_operate(const Access& a)
{
    if (a.privileged)
        return true;
    Oid role = get_role_oid("jobcap_operator", true);
    return OidIsValid(role) && has_privs_of_role(a.caller, role);
}

Datum caller_name(const Access& a)
{
    return CStringGetTextDatum(GetUserNameFromId(a.caller, false));
}

void check_queue(const Access& a, const char* function, Datum queue, const char* name)
{
    Params p;
    p.add(queue).add_caller(a);
    execute(queue_access, p, SPI_OK_SELECT);
    if (!DatumGetBool(result_column(0, 2)))
        deny_queue(function, name);
    if (!DatumGetBool(result_column(0, 1)))
        raise_unknown_queue(name);
}

void check_job(const Access& a, const char* function, int64 job_id)
{
    Params p;
    p.add(Int64GetDatum(job_id)).add_caller(a);
    refuse_job(a, function, job_id, execute(job_access, p, SPI_OK_SELECT));
}

void refuse_job(const Access& a, const char* function, int64 job_id, uint64 rows)
{
    // A job of another queue and a job that does not exist are refused alike, so that a worker
    // role cannot learn which job ids exist; an owner is told the job is unknown.
    if (rows == 0) {
        if (a.privileged)
            raise_unknown_job(job_id);
        deny_job(function, job_id);
    }
    if (!DatumGetBool(result_column(0, 1)))
        deny_job(function, job_id);
}

void deny_queue(const char* function, const char* queue)
{
    ereport(ERROR,
            (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
             errmsg("permission denied for queue \"%s\"", queue),
             errdetail("jobcap.%s works only on queues granted to the calling role.", function),
             errhint("The owner grants a queue with jobcap.grant_queue(queue, role).")));
    pg_unreachable();
}

void deny_job(const char* function, int64 job_id)
{
    ereport(ERROR, (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
                    errmsg("permission denied for job %lld", static_cast<long long>(job_id)),
                    errdetail("jobcap.%s works only on jobs of queues granted to the calling role.",
                              function),
                    errhint("The owner grants a queue with jobcap.grant_queue(queue, role).")));
    pg_unreachable();
}

}  // namespace jobcap
