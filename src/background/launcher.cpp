// The launcher ("jobcap launcher"): the one static background worker jobcap registers. It
// connects to no database (it reads the shared catalog pg_database, as the autovacuum launcher
// does) and keeps one reaper (reaper.cpp) running per database that jobcap.database selects:
// the databases listed there, or with '*' every database that accepts connections.
//
// The launcher only starts reapers; each reaper decides for itself when to leave: when its
// database is no longer selected (on SIGHUP), when the launcher that started it is gone (a new
// launcher starts a new one), and, with '*', when its database has no jobcap extension (the
// launcher looks again later). A reaper holds a session advisory lock on its database, so two
// never serve one database at once.
//
// Shaped like pg_cron's launcher and PostgreSQL's autovacuum launcher (get_database_list): signal
// handlers set flags and the latch; a memory context is reset each turn; catalog reads happen in
// a short transaction. Plain data only, as everywhere that calls PostgreSQL.
#include "pg.hpp"

extern "C" {
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/pg_database.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/varlena.h"
}

#include "jobcap.hpp"
#include "background/worker.hpp"

extern "C" PGDLLEXPORT void jobcap_launcher_main(Datum main_arg);

namespace jobcap {
namespace {

constexpr int kMaxDatabases = 32;   // names one jobcap.database list may hold
constexpr int kMaxServed = 1024;    // databases one launcher keeps track of
constexpr int kRestartSeconds = 5;  // bgw_restart_time of the launcher; also the wait
                                    // before a reaper that ran a while is started again
constexpr int kQuickExitMs = 5000;  // a reaper that stopped sooner than this found
                                    // nothing to do (with '*', a reaper leaves after
                                    // a second when there is no extension), or
                                    // crashed at once: either way, not again soon

// A database the launcher serves (or served).
struct Served {
    Oid dboid;
    char name[NAMEDATALEN];
    BackgroundWorkerHandle* handle;  // TopMemoryContext; null while none runs
    TimestampTz started;
    TimestampTz next_start;  // no new reaper before this
    bool selected;           // selected by the last scan
    bool slot_warned;
};

Served served[kMaxServed];
int nserved = 0;

// Listed names already reported as not servable (cleared on reload): one line each, not one
// per look.
char unservable[kMaxDatabases][NAMEDATALEN];
int nunservable = 0;

// SIGINT (pg_cancel_backend) asks the launcher to look at every database now, waiving the waits:
// CREATE EXTENSION jobcap sends it, so a new database is served at once under '*', and so does
// every CREATE DATABASE, ALTER DATABASE and database rename when its transaction ends
// (src/background/ddl.cpp), so a listed database is served as soon as it exists.
volatile sig_atomic_t rescan_requested = false;

void request_rescan(SIGNAL_ARGS)
{
    int save_errno = errno;
    rescan_requested = true;
    SetLatch(MyLatch);
    errno = save_errno;
}

// How long a database whose reaper left at once waits before the next try: sixty reap
// intervals (a minute by default), at least a second.
int64 recheck_usec()
{
    return Max((int64) guc_reap_interval_ms * 60, (int64) 1000) * 1000;
}

Served* find(Oid dboid)
{
    for (int i = 0; i < nserved; ++i)
        if (served[i].dboid == dboid)
            return &served[i];
    return nullptr;
}

// Marks every database jobcap.database selects, adding new ones (pg_database, read like the
// autovacuum launcher's get_database_list).
void scan_databases()
{
    for (int i = 0; i < nserved; ++i)
        served[i].selected = false;

    SetCurrentStatementStartTimestamp();
    StartTransactionCommand();
    (void) GetTransactionSnapshot();
    Relation rel = table_open(DatabaseRelationId, AccessShareLock);
    TableScanDesc scan = table_beginscan_catalog(rel, 0, nullptr);
    HeapTuple tuple;
    while ((tuple = heap_getnext(scan, ForwardScanDirection)) != nullptr) {
        Form_pg_database db = (Form_pg_database) GETSTRUCT(tuple);
        // -2: a database whose DROP was interrupted (PostgreSQL 15.4+); it cannot be entered.
        if (!db->datallowconn || db->datistemplate || db->datconnlimit == -2)
            continue;
        if (!database_wanted(NameStr(db->datname)))
            continue;
        Served* s = find(db->oid);
        if (s == nullptr) {
            if (nserved == kMaxServed)
                continue;
            s = &served[nserved++];
            memset(s, 0, sizeof *s);
            s->dboid = db->oid;
        }
        strlcpy(s->name, NameStr(db->datname), sizeof s->name);
        s->selected = true;
    }
    table_endscan(scan);
    table_close(rel, AccessShareLock);
    CommitTransactionCommand();
}

// Says once per name when a listed database cannot be served (it does not exist yet, is a
// template or refuses connections); it is served as soon as it can be.
void report_unservable()
{
    if (all_databases())
        return;
    char* raw = pstrdup(guc_database != nullptr ? guc_database : "");
    List* names = NIL;
    if (!SplitGUCList(raw, ',', &names))
        return;
    ListCell* lc;
    foreach (lc, names) {
        const char* name = static_cast<const char*>(lfirst(lc));
        bool found = false;
        for (int i = 0; i < nserved && !found; ++i)
            found = served[i].selected && strcmp(served[i].name, name) == 0;
        for (int i = 0; i < nunservable && !found; ++i)
            found = strcmp(unservable[i], name) == 0;
        if (found || nunservable == kMaxDatabases)
            continue;
        strlcpy(unservable[nunservable++], name, NAMEDATALEN);
        ereport(LOG, (errmsg("jobcap launcher cannot serve database \"%s\" named in "
                             "jobcap.database",
                             name),
                      errdetail("It does not exist, is a template, or does not accept "
                                "connections. It is served as soon as the CREATE DATABASE or "
                                "ALTER DATABASE that makes it servable commits.")));
    }
}

// Starts a reaper for s; false when no background worker slot is free.
bool start_reaper(Served* s, TimestampTz now)
{
    BackgroundWorker bgw;
    memset(&bgw, 0, sizeof bgw);
    bgw.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
    bgw.bgw_start_time = BgWorkerStart_RecoveryFinished;
    bgw.bgw_restart_time = BGW_NEVER_RESTART;  // the launcher restarts it
    strlcpy(bgw.bgw_library_name, "jobcap", BGW_MAXLEN);
    strlcpy(bgw.bgw_function_name, "jobcap_reaper_main", BGW_MAXLEN);
    snprintf(bgw.bgw_name, BGW_MAXLEN, "jobcap reaper for database %s", s->name);
    strlcpy(bgw.bgw_type, "jobcap reaper", BGW_MAXLEN);
    strlcpy(bgw.bgw_extra, s->name, BGW_EXTRALEN);
    bgw.bgw_main_arg = ObjectIdGetDatum(s->dboid);
    bgw.bgw_notify_pid = MyProcPid;

    MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);
    BackgroundWorkerHandle* handle = nullptr;
    bool ok = RegisterDynamicBackgroundWorker(&bgw, &handle);
    MemoryContextSwitchTo(old);
    if (!ok) {
        if (!s->slot_warned)
            ereport(LOG, (errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
                          errmsg("jobcap launcher could not start a reaper for database \"%s\": "
                                 "no free background worker slot",
                                 s->name),
                          errhint("Raise max_worker_processes (each served database needs one "
                                  "worker), or select fewer databases in jobcap.database.")));
        s->slot_warned = true;
        s->next_start = now + (int64) kRestartSeconds * USECS_PER_SEC;
        return false;
    }
    s->slot_warned = false;
    s->handle = handle;
    s->started = now;
    ereport(DEBUG1, (errmsg("jobcap launcher started a reaper for database \"%s\"", s->name)));
    return true;
}

// One turn: scan, notice reapers that stopped, start the missing ones. Returns the time to
// sleep, in milliseconds.
long turn()
{
    scan_databases();
    report_unservable();

    TimestampTz now = GetCurrentTimestamp();
    TimestampTz wake = now + recheck_usec();  // '*' finds new databases at this pace
    int kept = 0;
    for (int i = 0; i < nserved; ++i) {
        Served s = served[i];
        if (s.handle != nullptr) {
            pid_t pid;
            if (GetBackgroundWorkerPid(s.handle, &pid) != BGWH_STOPPED) {
                served[kept++] = s;  // running (it leaves by itself when unselected)
                continue;
            }
            // It stopped: soon after starting means nothing to do here (or a crash at start):
            // look again later; after a real run, start it again as the postmaster would.
            bool quick = now - s.started < (int64) kQuickExitMs * 1000;
            s.next_start = now + (quick ? recheck_usec() : (int64) kRestartSeconds * USECS_PER_SEC);
            pfree(s.handle);
            s.handle = nullptr;
        }
        if (!s.selected)
            continue;  // forgotten: unselected or dropped, and no reaper left
        if (now >= s.next_start)
            start_reaper(&s, now);
        if (s.handle == nullptr && s.next_start < wake)
            wake = s.next_start;
        served[kept++] = s;
    }
    nserved = kept;

    long ms = (long) ((wake - now) / 1000);
    return Max(ms, 100L);
}

}  // namespace

bool all_databases()
{
    return guc_database != nullptr && strcmp(guc_database, "*") == 0;
}

bool database_wanted(const char* name)
{
    if (all_databases())
        return true;
    char* raw = pstrdup(guc_database != nullptr ? guc_database : "");
    List* names = NIL;
    bool wanted = false;
    if (SplitGUCList(raw, ',', &names)) {
        ListCell* lc;
        foreach (lc, names)
            wanted |= strcmp(static_cast<const char*>(lfirst(lc)), name) == 0;
    }
    list_free(names);
    pfree(raw);
    return wanted;
}

// jobcap.database: '*', or a list of at most kMaxDatabases database names.
bool check_database(char** newval, void**, GucSource)
{
    char* raw = pstrdup(*newval);
    List* names = NIL;
    bool ok = SplitGUCList(raw, ',', &names);
    if (!ok) {
        GUC_check_errdetail("List syntax is invalid.");
    } else if (list_length(names) > kMaxDatabases) {
        GUC_check_errdetail("At most %d databases can be listed; use '*' for all.", kMaxDatabases);
        ok = false;
    } else {
        ListCell* lc;
        foreach (lc, names) {
            const char* name = static_cast<const char*>(lfirst(lc));
            if (strcmp(name, "*") == 0 && list_length(names) > 1) {
                GUC_check_errdetail("'*' selects every database and stands alone.");
                ok = false;
                break;
            }
            if (name[0] == '\0' || strlen(name) >= NAMEDATALEN) {
                GUC_check_errdetail("\"%s\" is not a valid database name.", name);
                ok = false;
                break;
            }
        }
    }
    list_free(names);
    pfree(raw);
    return ok;
}

void register_launcher()
{
    BackgroundWorker bgw;
    memset(&bgw, 0, sizeof bgw);
    bgw.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
    // A standby runs no reaper: the launcher starts when recovery ends (at promotion).
    bgw.bgw_start_time = BgWorkerStart_RecoveryFinished;
    bgw.bgw_restart_time = kRestartSeconds;
    strlcpy(bgw.bgw_library_name, "jobcap", BGW_MAXLEN);
    strlcpy(bgw.bgw_function_name, "jobcap_launcher_main", BGW_MAXLEN);
    strlcpy(bgw.bgw_name, "jobcap launcher", BGW_MAXLEN);
    strlcpy(bgw.bgw_type, "jobcap launcher", BGW_MAXLEN);
    RegisterBackgroundWorker(&bgw);
}

}  // namespace jobcap

using namespace jobcap;

extern "C" void jobcap_launcher_main(Datum)
{
    pqsignal(SIGHUP, SignalHandlerForConfigReload);
    pqsignal(SIGTERM, die);
    pqsignal(SIGINT, request_rescan);
    BackgroundWorkerUnblockSignals();
    BackgroundWorkerInitializeConnection(nullptr, nullptr, 0);  // shared catalogs only
    SetConfigOption("application_name", "jobcap launcher", PGC_USERSET, PGC_S_OVERRIDE);
    ereport(LOG, (errmsg("jobcap launcher started"),
                  errdetail("It serves %s.", all_databases()
                                                 ? "every database that has jobcap"
                                                 : "the databases named in jobcap.database")));

    MemoryContext turn_context =
        AllocSetContextCreate(TopMemoryContext, "jobcap launcher", ALLOCSET_DEFAULT_SIZES);
    for (;;) {
        CHECK_FOR_INTERRUPTS();
        if (ConfigReloadPending) {
            ConfigReloadPending = false;
            ProcessConfigFile(PGC_SIGHUP);
            nunservable = 0;
        }
        if (rescan_requested) {
            rescan_requested = false;
            for (int i = 0; i < nserved; ++i)
                served[i].next_start = 0;
        }
        MemoryContextSwitchTo(turn_context);
        MemoryContextReset(turn_context);

        long wait = turn();

        // Woken early by SIGHUP and by the postmaster when a reaper starts or stops.
        (void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, wait,
                         PG_WAIT_EXTENSION);
        ResetLatch(MyLatch);
    }
}
