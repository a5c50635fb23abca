// grant_queue and revoke_queue: which roles may work which queue (access.hpp applies them).
// Grants name roles, so they survive dump and restore; a renamed or dropped role's grant matches
// nobody until it is revoked.
#include "spi/access.hpp"
#include "spi/args.hpp"
#include "boundary.hpp"
#include "spi/errors.hpp"
#include "spi/plans.hpp"
#include "spi/queue_lock.hpp"

extern "C" {
#include "utils/acl.h"
}

namespace jobcap {
namespace {

// Nothing is inserted when the queue does not exist or the grant is already there.
JOBCAP_STATEMENT(insert_grant,
                 "INSERT INTO jobcap.queue_grants (queue, grantee, granted_by, granted_at)"
                 " SELECT q.queue, $2, $3, $4 FROM jobcap.queues q WHERE q.queue = $1"
                 " ON CONFLICT (queue, grantee) DO NOTHING",
                 {TEXTOID, TEXTOID, TEXTOID, TIMESTAMPTZOID});

// grant_queue's create_missing => true: the queue with create_queue's defaults (those of its SQL
// declaration, hence the call through SQL) unless it exists.
JOBCAP_STATEMENT(create_missing_queue,
                 "SELECT jobcap.create_queue($1)"
                 " WHERE NOT EXISTS (SELECT FROM jobcap.queues q WHERE q.queue = $1)",
                 {TEXTOID});

JOBCAP_STATEMENT(delete_grant, "DELETE FROM jobcap.queue_grants WHERE queue = $1 AND grantee = $2",
                 {TEXTOID, TEXTOID});

// A role name as PostgreSQL stores it: 1 to NAMEDATALEN - 1 bytes, taken literally (no case
// folding, no quotes), like pg_has_role's name arguments.
const char* arg_role(FunctionCallInfo fcinfo, int n)
{
    if (PG_ARGISNULL(n))
        raise_problem(core::check_not_null("role", true));
    text* t = PG_GETARG_TEXT_PP(n);
    std::size_t len = VARSIZE_ANY_EXHDR(t);
    if (len == 0 || len >= NAMEDATALEN)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("role must be 1 to %d bytes, not %zu", NAMEDATALEN - 1, len)));
    return text_to_cstring(t);
}

}  // namespace
}  // namespace jobcap

using namespace jobcap;

JOBCAP_FUNCTION(grant_queue, Duty::owner)
{
    NameArg queue = arg_queue(fcinfo, 0);
    const char* role = arg_role(fcinfo, 1);
    if (!OidIsValid(get_role_oid(role, true)))
        ereport(ERROR,
                (errcode(ERRCODE_UNDEFINED_OBJECT), errmsg("role \"%s\" does not exist", role),
                 errhint("To let every worker role work the queue, grant it to jobcap_worker.")));
    // compat(0.2.0): the 0.2.0 declaration has two arguments.
    bool create_missing = PG_NARGS() > 2 && !PG_ARGISNULL(2) && PG_GETARG_BOOL(2);
    Params p;
    p.add(queue.datum).add(CStringGetTextDatum(role)).add(caller_name(access));
    p.add(TimestampTzGetDatum(GetCurrentTimestamp()));
    Params q;
    q.add(queue.datum);

    spi_open(access);
    if (create_missing) {
        // Before the statement's snapshot: a creation of the name in progress elsewhere commits
        // first, and this one then sees its queue instead of failing to create it again.
        lock_queue_for_create(queue.datum);
        execute(create_missing_queue, q, SPI_OK_SELECT);
    }
    bool granted = execute(insert_grant, p, SPI_OK_INSERT) > 0;
    if (!granted)
        check_queue(access, function, queue.datum, queue.cstr);
    spi_close(access);
    PG_RETURN_BOOL(granted);
}

JOBCAP_FUNCTION(revoke_queue, Duty::owner)
{
    NameArg queue = arg_queue(fcinfo, 0);
    // The role need not exist any more: a dropped role's grants are revoked the same way.
    Params p;
    p.add(queue.datum).add(CStringGetTextDatum(arg_role(fcinfo, 1)));

    spi_open(access);
    bool revoked = execute(delete_grant, p, SPI_OK_DELETE) > 0;
    if (!revoked)
        check_queue(access, function, queue.datum, queue.cstr);
    spi_close(access);
    PG_RETURN_BOOL(revoked);
}
