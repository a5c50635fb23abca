// The extension's own lifecycle: what DROP EXTENSION jobcap must not leave behind.
//
// DROP EXTENSION drops every member of jobcap, but schema jobcap is no member (CREATE EXTENSION
// made it, or adopted it, for the control file's schema = jobcap), so it stays, with its grants
// to jobcap_worker and jobcap_operator: DROP ROLE would then refuse. The event trigger
// jobcap_before_drop_extension (ddl_command_start, tag DROP EXTENSION) calls this function
// before any DROP EXTENSION; when the statement names jobcap and the caller may drop it, every
// grant on the schema is revoked, and the schema's initial privileges (pg_init_privs, recorded by
// the install's GRANT) are forgotten: from PostgreSQL 17 on, DROP ROLE also refuses while they
// name the role. The DROP's rollback, should it fail, undoes both; the trigger itself is a
// member and goes with the extension.
#include "boundary.hpp"

extern "C" {
#include "catalog/namespace.h"
#include "catalog/pg_namespace.h"
#include "commands/event_trigger.h"
#include "nodes/parsenodes.h"
#include "utils/acl.h"
}

namespace jobcap {
namespace {

// One statement: the REVOKE to run, or no row when there is nothing to revoke or the caller
// is not allowed to drop the extension (DROP EXTENSION then reports that itself).
constexpr const char* kRevokeSchemaGrants =
    "SELECT pg_catalog.format('REVOKE ALL ON SCHEMA jobcap FROM %s',"
    "   pg_catalog.string_agg(DISTINCT CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0"
    "     THEN 'PUBLIC' ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)) END,"
    "   ', '))"
    "  FROM pg_catalog.pg_namespace n, pg_catalog.aclexplode(n.nspacl) a"
    " WHERE n.nspname OPERATOR(pg_catalog.=) 'jobcap'"
    "   AND a.grantee OPERATOR(pg_catalog.<>) n.nspowner"
    "   AND EXISTS (SELECT FROM pg_catalog.pg_extension e"
    "                WHERE e.extname OPERATOR(pg_catalog.=) 'jobcap'"
    "                  AND e.extnamespace OPERATOR(pg_catalog.=) n.oid"
    "                  AND pg_catalog.pg_has_role(e.extowner, 'USAGE'))"
    " HAVING pg_catalog.count(*) OPERATOR(pg_catalog.>) 0";

bool names_jobcap(const DropStmt* stmt)
{
    if (stmt->removeType != OBJECT_EXTENSION)
        return false;
    ListCell* cell;
    foreach (cell, stmt->objects)
        if (strcmp(strVal(lfirst(cell)), "jobcap") == 0)
            return true;
    return false;
}

}  // namespace
}  // namespace jobcap

using namespace jobcap;

JOBCAP_FUNCTION(before_drop_extension, Duty::anyone)
{
    if (!CALLED_AS_EVENT_TRIGGER(fcinfo))
        ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
                        errmsg("%s must be called as an event trigger", function)));
    Node* tree = reinterpret_cast<EventTriggerData*>(fcinfo->context)->parsetree;
    if (tree == nullptr || !IsA(tree, DropStmt) || !names_jobcap(reinterpret_cast<DropStmt*>(tree)))
        PG_RETURN_NULL();

    if (SPI_connect() != SPI_OK_CONNECT)
        elog(ERROR, "SPI_connect failed");
    int rc = SPI_execute(kRevokeSchemaGrants, true, 0);
    if (rc != SPI_OK_SELECT)
        elog(ERROR, "SPI_execute failed: %s", SPI_result_code_string(rc));
    if (SPI_processed > 0) {
        char* revoke = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
        rc = SPI_execute(revoke, false, 0);
        if (rc != SPI_OK_UTILITY)
            elog(ERROR, "SPI_execute failed: %s", SPI_result_code_string(rc));
        removeExtObjInitPriv(get_namespace_oid("jobcap", false), NamespaceRelationId);
    }
    SPI_finish();
    PG_RETURN_NULL();
}
