// Who may do what: the one place every SQL entry point goes through before it touches a table.
//
// jobcap's functions are SECURITY INVOKER (with a pinned search_path), so PostgreSQL's EXECUTE
// privilege is the first gate and current_user at entry is the caller. admit() then applies
// jobcap's own rules to that caller, and spi_open()/spi_close() run jobcap's prepared statements as
// the owner of its tables, switching the user around the SPI calls only, as PostgreSQL's
// foreign-key triggers do (SetUserIdAndSecContext with SECURITY_LOCAL_USERID_CHANGE). An error
// raised in between needs no cleanup here: transaction and subtransaction abort restore the
// user saved when they began (AbortTransaction, AbortSubTransaction in xact.c).
//
// The rules:
//  * superusers and members of the tables' owner ("privileged") pass everything;
//  * operator functions (queues, cancel, requeue, reap, statements) need the privileges of
//    jobcap_operator, and touch every queue;
//  * worker functions (enqueue, claim, complete, fail, heartbeat, assert_fence) touch only the
//    queues granted with jobcap.grant_queue to the caller or to a role whose privileges it has
//    (pg_has_role(..., 'USAGE'): membership with INHERIT, as for table privileges). That check
//    runs inside each statement (JOBCAP_MAY_WORK below), so it costs no extra round trip;
//  * grant_queue and revoke_queue are for privileged callers only.
// Access holds plain data only (see boundary.hpp).
#pragma once

#include "pg.hpp"

namespace jobcap {

enum class Duty : uint8 {
    anyone,     // no check and no table: pure functions (backoff)
    worker,     // per-queue grants decide
    operator_,  // jobcap_operator's privileges, every queue
    owner,      // superusers and the owner's members only
};

struct Access {
    Oid caller;       // GetUserId() at entry
    Oid owner;        // owner of jobcap's tables: statements run as this role
    bool privileged;  // superuser or member of the owner: no per-queue check
    Oid saved_user;   // the caller's user and security context while switched
    int saved_context;
    int search_path_level;  // the GUC nest level spi_open pinned search_path at; 0: none
};

// Checks that the caller may call a function of this duty at all (42501 otherwise) and
// returns what spi_open() and the statements need.
Access admit(const char* function, Duty duty);

// SPI_connect, then run as the owner with search_path pinned to pg_catalog, jobcap, pg_temp
// (when the function's own SET clause has not pinned it already: the hot path's functions have
// none). spi_close() switches back, restores search_path, then SPI_finish.
void spi_open(Access& access);
void spi_close(Access& access);

// Whether the caller has jobcap_operator's privileges (or passes everything): for functions a
// worker may call on its own queues' jobs and an operator on every job (cancel_job, job_tree).
bool may_operate(const Access& access);

// The caller's role name, for history rows written on its behalf.
Datum caller_name(const Access& access);

// After a statement found nothing for a queue or a job (inside connect/finish): raises 42501
// when the caller may not work it, 42704 when it does not exist; returns when both are fine.
// A denied caller gets 42501 whether or not the queue or job exists.
void check_queue(const Access& access, const char* function, Datum queue, const char* name);
void check_job(const Access& access, const char* function, int64 job_id);
// The same refusal after a statement of the caller's own that returned ROWS rows: none when the
// job does not exist, else one whose first column says whether the caller may work the job.
void refuse_job(const Access& access, const char* function, int64 job_id, uint64 rows);

// 42501 for a queue or job the caller may not work. The job's message is the same whether or
// not the job exists, so a denied caller learns nothing about other queues.
[[noreturn]] void deny_queue(const char* function, const char* queue);
[[noreturn]] void deny_job(const char* function, int64 job_id);

}  // namespace jobcap

// SQL: true when the role in CALLER (an oid parameter; NULL = privileged) may work queue QUEUE
// (a parameter or a QUALIFIED column: a bare "queue" would mean the grant's own column).
// Grants name roles; a dropped or renamed role's grant matches nobody.
#define JOBCAP_MAY_WORK(CALLER, QUEUE)                                                             \
    "(" CALLER                                                                                     \
    "::pg_catalog.oid IS NULL OR EXISTS (SELECT FROM jobcap.queue_grants g"                        \
    " WHERE g.queue = " QUEUE " AND pg_catalog.pg_has_role(" CALLER                                \
    ","                                                                                            \
    " pg_catalog.to_regrole(pg_catalog.quote_ident(g.grantee))::pg_catalog.oid, 'USAGE')))"
