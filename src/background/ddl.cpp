// Database DDL seen by every backend of a server that preloads jobcap (a ProcessUtility hook):
// the reapers keep out of the way of the DDL that needs a database to itself, and the launcher
// learns at once about the databases it may now serve.
//
// - DROP DATABASE, ALTER DATABASE ... RENAME, ALTER DATABASE ... SET TABLESPACE and CREATE
//   DATABASE ... TEMPLATE fail after 5 s ("being accessed by other users") while any session is
//   connected to the database, the reaper included: the reaper of that database is stopped first
//   (SIGTERM, then a wait until it has left), when the caller owns the database. DROP DATABASE
//   ... WITH (FORCE) needs it too: its caller may not terminate a superuser's process.
// - ALTER EXTENSION jobcap UPDATE takes every jobcap table's lock before its script runs, jobs
//   first, as the workers' statements take them: the script's DDL would otherwise lock one table
//   while a worker holding jobs waits for it, and deadlock with the worker.
// - CREATE DATABASE, ALTER DATABASE and the above wake the launcher when their transaction ends
//   (SIGINT is its "look again now"), so a database named in jobcap.database is served as soon as
//   it exists or can be entered, and a stopped reaper comes back as soon as the DDL is done.
// - CREATE EXTENSION jobcap in a database the launcher will serve but whose reaper has not
//   connected yet waits briefly for it, so that the install script warns "no jobcap background
//   worker serves database" only when none will.
//
// The processes are found in pg_stat_activity. Plain data only, as everywhere that calls
// PostgreSQL.
#include "pg.hpp"

extern "C" {
#include "catalog/pg_database.h"
#include "commands/dbcommands.h"
#include "commands/defrem.h"
#include "nodes/parsenodes.h"
#include "catalog/namespace.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_class.h"
#include "pgstat.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "storage/procarray.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"
}

#include <csignal>

#include "jobcap.hpp"
#include "background/worker.hpp"

namespace jobcap {
namespace {

constexpr long kReaperWaitMs = 2000;   // CREATE EXTENSION waits this long for a reaper
constexpr long kReaperExitMs = 10000;  // database DDL waits this long for a stopped reaper to leave
constexpr long kPollMs = 20;

ProcessUtility_hook_type previous_utility = nullptr;
pid_t launcher_to_wake = 0;  // at the end of this transaction

// The pid of a process of backend_type `type` (in database dboid, unless InvalidOid), or 0.
// Read as the bootstrap superuser: pg_stat_activity shows another role's backend_type only to
// those with its privileges, and jobcap's processes run as a superuser, while the caller may be
// a database's owner who is none. An error needs no cleanup: transaction abort restores the user.
pid_t find_process(const char* type, Oid dboid)
{
    pid_t pid = 0;
    Oid saved_user = InvalidOid;
    int saved_context = 0;
    GetUserIdAndSecContext(&saved_user, &saved_context);
    SetUserIdAndSecContext(BOOTSTRAP_SUPERUSERID, saved_context | SECURITY_LOCAL_USERID_CHANGE);
    SPI_connect();
    Oid types[2] = {TEXTOID, OIDOID};
    Datum values[2] = {CStringGetTextDatum(type), ObjectIdGetDatum(dboid)};
    char nulls[3] = {' ', OidIsValid(dboid) ? ' ' : 'n', '\0'};
    int rc = SPI_execute_with_args(
        "SELECT pid FROM pg_catalog.pg_stat_activity"
        " WHERE backend_type OPERATOR(pg_catalog.=) $1"
        "   AND ($2 IS NULL OR datid OPERATOR(pg_catalog.=) $2)"
        " LIMIT 1",
        2, types, values, nulls, true, 1);
    if (rc != SPI_OK_SELECT)
        elog(ERROR, "SPI_execute_with_args returned %d", rc);
    if (SPI_processed > 0) {
        bool isnull = false;
        Datum d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
        if (!isnull)
            pid = DatumGetInt32(d);
    }
    SPI_finish();
    SetUserIdAndSecContext(saved_user, saved_context);
    return pid;
}

// Wakes the launcher when this transaction ends, committed or not: it looks at every database
// again and starts the reapers that are missing.
void wake_launcher_at_end()
{
    launcher_to_wake = find_process("jobcap launcher", InvalidOid);
}

void at_transaction_end(XactEvent event, void*)
{
    if (launcher_to_wake == 0)
        return;
    if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_ABORT ||
        event == XACT_EVENT_PARALLEL_COMMIT || event == XACT_EVENT_PARALLEL_ABORT) {
        (void) kill(launcher_to_wake, SIGINT);
        launcher_to_wake = 0;
    }
}

// Stops the reaper connected to database `name`, if any, for a DDL that needs the database to
// itself. Only for a caller who owns the database: anyone else's DDL fails on its own.
void stop_reaper_of(const char* name, const char* ddl)
{
    if (name == nullptr)
        return;
    Oid dboid = get_database_oid(name, true);
    if (!OidIsValid(dboid))
        return;
    HeapTuple tuple = SearchSysCache1(DATABASEOID, ObjectIdGetDatum(dboid));
    if (!HeapTupleIsValid(tuple))
        return;
    Oid owner = ((Form_pg_database) GETSTRUCT(tuple))->datdba;
    ReleaseSysCache(tuple);
    if (!has_privs_of_role(GetUserId(), owner))
        return;
    pid_t reaper = find_process("jobcap reaper", dboid);
    if (reaper == 0)
        return;
    ereport(LOG, (errmsg("stopping the jobcap reaper of database \"%s\" for %s", name, ddl),
                  errdetail("The launcher starts it again when the statement's transaction ends, "
                            "if jobcap.database still selects the database.")));
    (void) kill(reaper, SIGTERM);
    wake_launcher_at_end();
    // Until it has left the database: the DDL counts the database's sessions once it holds the
    // database's lock (which keeps a new reaper out), and a reaper still leaving would count.
    for (long waited = 0; waited < kReaperExitMs && BackendPidGetProc(reaper) != nullptr;
         waited += kPollMs) {
        (void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, kPollMs,
                         PG_WAIT_EXTENSION);
        ResetLatch(MyLatch);
        CHECK_FOR_INTERRUPTS();
    }
}

// ALTER EXTENSION jobcap UPDATE: every table of schema jobcap locked for the script, jobs first
// (every worker statement locks jobs before the other tables), then the others without waiting
// while holding any: when one is busy, all are let go and taken again shortly, so this never
// waits while holding a lock a worker needs. Only for a caller with the tables' owner's
// privileges (anyone else's ALTER EXTENSION fails on its own).
void lock_tables_for_update()
{
    Oid schema = get_namespace_oid("jobcap", true);
    Oid jobs = OidIsValid(schema) ? get_relname_relid("jobs", schema) : InvalidOid;
    if (!OidIsValid(jobs))
        return;
    HeapTuple tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(jobs));
    if (!HeapTupleIsValid(tuple))
        return;
    Oid owner = ((Form_pg_class) GETSTRUCT(tuple))->relowner;
    ReleaseSysCache(tuple);
    if (!has_privs_of_role(GetUserId(), owner))
        return;

    SPI_connect();
    Oid types[1] = {OIDOID};
    Datum values[1] = {ObjectIdGetDatum(schema)};
    int rc = SPI_execute_with_args(
        "SELECT c.oid FROM pg_catalog.pg_class c"
        " WHERE c.relnamespace OPERATOR(pg_catalog.=) $1"
        "   AND c.relkind IN ('r', 'p') ORDER BY c.oid",
        1, types, values, nullptr, true, 0);
    if (rc != SPI_OK_SELECT)
        elog(ERROR, "SPI_execute_with_args returned %d", rc);
    int n = 0;
    // In the caller's memory: SPI_finish frees what was allocated after SPI_connect.
    Oid* tables = static_cast<Oid*>(SPI_palloc(sizeof(Oid) * (SPI_processed + 1)));
    for (uint64 i = 0; i < SPI_processed; ++i) {
        bool isnull = false;
        Oid t = DatumGetObjectId(
            SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &isnull));
        if (t != jobs)
            tables[n++] = t;
    }
    SPI_finish();

    for (;;) {
        LockRelationOid(jobs, AccessExclusiveLock);
        int held = 0;
        while (held < n && ConditionalLockRelationOid(tables[held], AccessExclusiveLock))
            ++held;
        if (held == n)
            break;
        for (int i = held - 1; i >= 0; --i)
            UnlockRelationOid(tables[i], AccessExclusiveLock);
        UnlockRelationOid(jobs, AccessExclusiveLock);
        (void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, kPollMs,
                         PG_WAIT_EXTENSION);
        ResetLatch(MyLatch);
        CHECK_FOR_INTERRUPTS();
    }
    pfree(tables);
}

const char* option_string(List* options, const char* option)
{
    ListCell* lc;
    foreach (lc, options) {
        DefElem* d = lfirst_node(DefElem, lc);
        if (strcmp(d->defname, option) == 0)
            return defGetString(d);
    }
    return nullptr;
}

// CREATE EXTENSION jobcap: when the launcher will serve this database but its reaper has not
// connected yet (the database is new), wake the launcher and give the reaper a moment.
void await_reaper()
{
    if (all_databases())
        return;  // the install script wakes the launcher itself
    const char* name = get_database_name(MyDatabaseId);
    if (name == nullptr || !database_wanted(name) ||
        find_process("jobcap reaper", MyDatabaseId) != 0)
        return;
    pid_t launcher = find_process("jobcap launcher", InvalidOid);
    if (launcher == 0)
        return;
    (void) kill(launcher, SIGINT);
    for (long waited = 0; waited < kReaperWaitMs; waited += kPollMs) {
        (void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, kPollMs,
                         PG_WAIT_EXTENSION);
        ResetLatch(MyLatch);
        CHECK_FOR_INTERRUPTS();
        pgstat_clear_snapshot();  // read pg_stat_activity afresh
        if (find_process("jobcap reaper", MyDatabaseId) != 0)
            return;
    }
}

void on_utility(PlannedStmt* pstmt, const char* query, bool read_only_tree,
                ProcessUtilityContext context, ParamListInfo params, QueryEnvironment* env,
                DestReceiver* dest, QueryCompletion* qc)
{
    Node* stmt = pstmt->utilityStmt;
    switch (nodeTag(stmt)) {
    case T_CreatedbStmt: {
        CreatedbStmt* create = castNode(CreatedbStmt, stmt);
        stop_reaper_of(option_string(create->options, "template"), "CREATE DATABASE ... TEMPLATE");
        wake_launcher_at_end();
        break;
    }
    case T_AlterDatabaseStmt: {
        AlterDatabaseStmt* alter = castNode(AlterDatabaseStmt, stmt);
        if (option_string(alter->options, "tablespace") != nullptr)
            stop_reaper_of(alter->dbname, "ALTER DATABASE ... SET TABLESPACE");
        wake_launcher_at_end();
        break;
    }
    case T_RenameStmt: {
        RenameStmt* rename = castNode(RenameStmt, stmt);
        if (rename->renameType == OBJECT_DATABASE) {
            stop_reaper_of(rename->subname, "ALTER DATABASE ... RENAME");
            wake_launcher_at_end();
        }
        break;
    }
    case T_DropdbStmt:
        stop_reaper_of(castNode(DropdbStmt, stmt)->dbname, "DROP DATABASE");
        break;
    case T_CreateExtensionStmt:
        if (strcmp(castNode(CreateExtensionStmt, stmt)->extname, "jobcap") == 0)
            await_reaper();
        break;
    case T_AlterExtensionStmt:
        if (strcmp(castNode(AlterExtensionStmt, stmt)->extname, "jobcap") == 0)
            lock_tables_for_update();
        break;
    default:
        break;
    }
    if (previous_utility != nullptr)
        previous_utility(pstmt, query, read_only_tree, context, params, env, dest, qc);
    else
        standard_ProcessUtility(pstmt, query, read_only_tree, context, params, env, dest, qc);
}

}  // namespace

void install_ddl_hooks()
{
    previous_utility = ProcessUtility_hook;
    ProcessUtility_hook = on_utility;
    RegisterXactCallback(at_transaction_end, nullptr);
}

}  // namespace jobcap
