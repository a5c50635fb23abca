// jobcap on a Citus cluster: which node holds what, and routing a call to its shard (citus.hpp).
// The statements retargeted to a shard are in citus_shards.cpp.
#include "spi/citus.hpp"

#include "spi/access.hpp"
#include "spi/plans.hpp"

extern "C" {
#include "catalog/namespace.h"
#include "commands/extension.h"
#include "common/hashfn.h"
#include "storage/lock.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
}

namespace jobcap::citus {

const Shard* routed = nullptr;

namespace {

enum class Known : uint8 { unknown, yes, no };

Known jobs_distributed = Known::unknown;
Oid jobs_relid = InvalidOid;
bool callback_registered = false;

// Citus's lock on the placements of colocated shards (its resource_lock.h): an advisory tag
// (database, shard index, colocation id, class 8). A Citus write holds it in ShareLock while it
// runs; a shard move takes it in ExclusiveLock on every node before switching placements.
constexpr uint16 kCitusColocatedShardsMetadataLock = 8;

// What this backend knows of the shards: Citus's catalogs as last read, until an invalidation
// of jobcap.jobs' relcache entry (Citus sends one whenever a placement or shard of it changes).
struct Map {
    bool fresh;
    uint32 colocation;
    int count;
    Shard* shards;  // sorted by range, in map_context
};
Map map = {};
MemoryContext map_context = nullptr;

// The shard a routed call works on (routed points here while one is).
Shard current = {};

void forget(Datum, Oid relid)
{
    if (relid == InvalidOid || relid == jobs_relid) {
        jobs_distributed = Known::unknown;
        map.fresh = false;
    }
}

// Runs a read of Citus's catalogs inside an SPI connection of its own.
void catalog_connect()
{
    if (SPI_connect() != SPI_OK_CONNECT)
        elog(ERROR, "jobcap: SPI_connect failed");
}

// The shards of jobcap.jobs, with their colocated shards of job_errors, stats_minutes and
// stats_latency (the same range: Citus colocates by range), and whether each is on this node.
constexpr const char* kShardsSql =
    "SELECT s.shardid, s.shardminvalue::pg_catalog.int4, s.shardmaxvalue::pg_catalog.int4,"
    "  EXISTS (SELECT FROM pg_catalog.pg_dist_placement p, pg_catalog.pg_dist_local_group g"
    "           WHERE p.shardid = s.shardid AND p.groupid = g.groupid),"
    "  (SELECT c.shardid FROM pg_catalog.pg_dist_shard c"
    "    WHERE c.logicalrelid = 'jobcap.job_errors'::pg_catalog.regclass"
    "      AND c.shardminvalue = s.shardminvalue),"
    "  (SELECT c.shardid FROM pg_catalog.pg_dist_shard c"
    "    WHERE c.logicalrelid = 'jobcap.stats_minutes'::pg_catalog.regclass"
    "      AND c.shardminvalue = s.shardminvalue),"
    "  (SELECT c.shardid FROM pg_catalog.pg_dist_shard c"
    "    WHERE c.logicalrelid = 'jobcap.stats_latency'::pg_catalog.regclass"
    "      AND c.shardminvalue = s.shardminvalue),"
    "  (SELECT p.colocationid FROM pg_catalog.pg_dist_partition p"
    "    WHERE p.logicalrelid = s.logicalrelid)"
    " FROM pg_catalog.pg_dist_shard s"
    " WHERE s.logicalrelid = 'jobcap.jobs'::pg_catalog.regclass"
    " ORDER BY s.shardminvalue::pg_catalog.int4";

[[noreturn]] void partly_distributed(const char* what)
{
    ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                    errmsg("jobcap is only partly distributed: %s", what),
                    errhint("Run SELECT jobcap.distribute() on the coordinator again.")));
    pg_unreachable();
}

int64 column_int8(uint64 row, int column, const char* what)
{
    bool null = false;
    Datum d = SPI_getbinval(SPI_tuptable->vals[row], SPI_tuptable->tupdesc, column, &null);
    if (null)
        partly_distributed(what);
    return DatumGetInt64(d);
}

int32 column_int4(uint64 row, int column)
{
    bool null = false;
    Datum d = SPI_getbinval(SPI_tuptable->vals[row], SPI_tuptable->tupdesc, column, &null);
    return null ? 0 : DatumGetInt32(d);
}

// Reads the shards afresh. The invalidations that arrive while reading leave the map stale, to
// be read again by the next route.
void load_map()
{
    if (map_context == nullptr)
        map_context =
            AllocSetContextCreate(TopMemoryContext, "jobcap Citus shards", ALLOCSET_SMALL_SIZES);
    MemoryContextReset(map_context);
    map = {};
    map.fresh = true;
    catalog_connect();
    // As of now, not as of the statement's snapshot: a call that waited for a shard move to
    // commit (lock_placement) reads the placements again here, and must see the move, or it
    // would work on the moved-away shard Citus has not dropped yet.
    PushActiveSnapshot(GetLatestSnapshot());
    int rc = SPI_execute(kShardsSql, true, 0);
    PopActiveSnapshot();
    if (rc != SPI_OK_SELECT)
        elog(ERROR, "jobcap: reading Citus's shards failed: %s", SPI_result_code_string(rc));
    uint64 rows = SPI_processed;
    Shard* shards =
        static_cast<Shard*>(MemoryContextAllocZero(map_context, sizeof(Shard) * (rows + 1)));
    for (uint64 r = 0; r < rows; ++r) {
        Shard& s = shards[r];
        s.jobs = column_int8(r, 1, "jobcap.jobs");
        s.lo = column_int4(r, 2);
        s.hi = column_int4(r, 3);
        bool null = false;
        s.local =
            DatumGetBool(SPI_getbinval(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 4, &null));
        s.errors = column_int8(r, 5, "jobcap.job_errors is not colocated with jobcap.jobs");
        s.minutes = column_int8(r, 6, "jobcap.stats_minutes is not colocated with jobcap.jobs");
        s.latency = column_int8(r, 7, "jobcap.stats_latency is not colocated with jobcap.jobs");
        s.index = static_cast<uint32>(r);
        map.colocation = static_cast<uint32>(column_int4(r, 8));
    }
    SPI_finish();
    if (rows == 0)
        partly_distributed("jobcap.jobs has no shards");
    map.count = static_cast<int>(rows);
    map.shards = shards;
}

const Shard* shard_of(int32 hash)
{
    int lo = 0, hi = map.count - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const Shard& s = map.shards[mid];
        if (hash < s.lo)
            hi = mid - 1;
        else if (hash > s.hi)
            lo = mid + 1;
        else
            return &s;
    }
    partly_distributed("a hash falls in no shard of jobcap.jobs");
}

// Takes Citus's placement lock of shard s in ShareLock, as a Citus write does; held to the end
// of the transaction. The invalidations of every placement change committed before it are then
// accepted (forget), so the map read next is current, and no move of the shard commits before
// the transaction ends.
void lock_placement(const Shard& s)
{
    LOCKTAG tag;
    SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, s.index, map.colocation,
                         kCitusColocatedShardsMetadataLock);
    (void) LockAcquire(&tag, ShareLock, false, false);
    AcceptInvalidationMessages();
}

// The shard of hash, under its placement lock, with placements read after the lock was taken.
Shard locked_shard_of(int32 hash)
{
    for (int tries = 0; tries < 5; ++tries) {
        if (!map.fresh)
            load_map();
        const Shard* s = shard_of(hash);
        lock_placement(*s);
        if (map.fresh)
            return *s;
    }
    ereport(ERROR, (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
                    errmsg("could not route a jobcap call: the shards of jobcap.jobs keep moving"),
                    errhint("Retry the call.")));
    pg_unreachable();
}

// Citus's hash of a text value (its hash function for text, hashtext, under a deterministic
// collation): what it routes a call by.
int32 text_hash(const char* data, int len)
{
    return static_cast<int32>(
        DatumGetUInt32(hash_any(reinterpret_cast<const unsigned char*>(data), len)));
}

// How a hot-path function is routed: by the queue or the fence among its arguments. The same
// functions and arguments are given to create_distributed_function by jobcap.distribute().
enum class By : uint8 { queue, fence };
struct Rule {
    const char* function;
    By by;
    int arg;
};
constexpr Rule kRules[] = {
    {"claim_job", By::queue, 0},
    {"complete_and_claim", By::queue, 2},
    {"enqueue_job", By::queue, 0},
    {"enqueue_jobs", By::queue, 0},
    {"queue_depth", By::queue, 0},
    {"complete_job", By::fence, 1},
    {"fail_job", By::fence, 1},
    {"heartbeat", By::fence, 1},
    {"assert_fence", By::fence, 1},
    {"release_job", By::fence, 1},
    {"crash_job", By::fence, 1},
    {"give_up_job", By::fence, 1},
    {"snooze_job", By::fence, 1},
    {"time_out_job", By::fence, 1},
    {"count_rolled_back_claim", By::fence, 1},
};

// Functions whose statements span shards in ways Citus cannot plan (a job named by its id alone,
// joins of history with jobs, FOR UPDATE across shards, volatile functions in UPDATEs of a
// distributed table): on a distributed install each is refused at its entry with 0A000, which
// says so, instead of Citus's planner error from inside it. test/citus/cluster.sh calls each.
constexpr const char* kNotDistributed[] = {
    "cancel_job", "claim_job_by_id", "complete_jobs", "drop_queue",
    "job_result", "job_tree",        "metrics",       "queue_stats_between",
    "reap_jobs",  "requeue_dead",    "requeue_job",   "top_failing_jobs",
};

void refuse_if_not_distributed(const char* function)
{
    for (const char* f : kNotDistributed)
        if (strcmp(f, function) == 0 && distributed())
            ereport(ERROR,
                    (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
                     errmsg("jobcap.%s does not run on a distributed install yet", function),
                     errdetail("jobcap.jobs is distributed with Citus (jobcap.distribute()), and "
                               "the statements of jobcap.%s span its shards in ways Citus cannot "
                               "plan.",
                               function),
                     errhint("docs/scaling.md lists what runs on a Citus cluster.")));
}

const Rule* rule_of(const char* function)
{
    for (const Rule& r : kRules)
        if (strcmp(r.function, function) == 0)
            return &r;
    return nullptr;
}

// Citus runs a delegated call in a backend of its own, named so.
bool delegated_here()
{
    return application_name != nullptr &&
           strncmp(application_name, "citus_internal gpid=", 20) == 0;
}

[[noreturn]] void not_here(const char* function, const char* what, const Shard& s)
{
    if (delegated_here())
        ereport(ERROR,
                (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
                 errmsg("could not run jobcap.%s: the shard of %s moved to another node", function,
                        what),
                 errdetail("Shard %lld of jobcap.jobs left this node while the call was on its "
                           "way here.",
                           static_cast<long long>(s.jobs)),
                 errhint("Retry the call: Citus delegates it to the shard's new node. A call "
                         "whose arguments are computed by a query is not delegated by them: pass "
                         "constants.")));
    ereport(ERROR,
            (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
             errmsg("jobcap.%s must run on the node that holds the shard of %s", function, what),
             errdetail("jobcap is distributed with Citus, and shard %lld of jobcap.jobs is not on "
                       "this node. Citus delegates the call there when it is a statement of its "
                       "own with constant arguments: SELECT jobcap.%s(...) or SELECT * FROM "
                       "jobcap.%s(...).",
                       static_cast<long long>(s.jobs), function, function),
             errhint("Call it that way from the client, not from inside a PL/pgSQL expression or "
                     "a query that reads other tables.")));
    pg_unreachable();
}

JOBCAP_STATEMENT(job_now_anywhere,
                 "SELECT j.state::text, j.fence, " JOBCAP_MAY_WORK(
                     "$2", "j.queue") " FROM jobcap.jobs j WHERE j.job_id = $1",
                 {INT8OID, OIDOID});

void ensure_callback()
{
    if (!callback_registered) {
        CacheRegisterRelcacheCallback(forget, (Datum) 0);
        callback_registered = true;
    }
}

}  // namespace

int8 loaded_state = -1;

bool learn_loaded()
{
    loaded_state = GetConfigOption("citus.version", true, false) != nullptr ? 1 : 0;
    return loaded_state > 0;
}

bool distributed()
{
    if (!loaded())
        return false;
    ensure_callback();
    if (jobs_distributed == Known::unknown) {
        Oid nsp = get_namespace_oid("jobcap", true);
        jobs_relid = OidIsValid(nsp) ? get_relname_relid("jobs", nsp) : InvalidOid;
        bool yes = false;
        if (OidIsValid(jobs_relid) && OidIsValid(get_extension_oid("citus", true))) {
            catalog_connect();
            int rc = SPI_execute(
                "SELECT FROM pg_catalog.pg_dist_partition p"
                " WHERE p.logicalrelid = 'jobcap.jobs'::pg_catalog.regclass",
                true, 1);
            if (rc != SPI_OK_SELECT)
                elog(ERROR, "jobcap: reading Citus's tables failed: %s",
                     SPI_result_code_string(rc));
            yes = SPI_processed > 0;
            SPI_finish();
        }
        jobs_distributed = yes ? Known::yes : Known::no;
    }
    return jobs_distributed == Known::yes;
}

Outer enter_call(FunctionCallInfo fcinfo, const char* function)
{
    Outer outer = {current, routed != nullptr};
    routed = nullptr;
    const Rule* rule = rule_of(function);
    if (rule == nullptr)
        refuse_if_not_distributed(function);
    // The bound of the routed argument (fcinfo->nargs, not PG_NARGS: no declaration told apart).
    if (rule == nullptr || rule->arg >= fcinfo->nargs || PG_ARGISNULL(rule->arg) || !distributed())
        return outer;  // a NULL is the function's own error to raise
    int32 hash;
    char what[128];
    if (rule->by == By::queue) {
        text* queue = DatumGetTextPP(PG_GETARG_DATUM(rule->arg));
        hash = text_hash(VARDATA_ANY(queue), static_cast<int>(VARSIZE_ANY_EXHDR(queue)));
        snprintf(what, sizeof what, "queue \"%.*s\"",
                 Min(static_cast<int>(VARSIZE_ANY_EXHDR(queue)), 64), VARDATA_ANY(queue));
    } else {
        int64 fence = PG_GETARG_INT64(rule->arg);
        hash = fence_hash(fence);
        snprintf(what, sizeof what, "fence %lld", static_cast<long long>(fence));
    }
    Shard s = locked_shard_of(hash);
    if (!s.local)
        not_here(function, what, s);
    current = s;
    routed = &current;
    return outer;
}

void leave_call(const Outer& outer)
{
    current = outer.shard;
    routed = outer.routed ? &current : nullptr;
}

int32 fence_hash(int64 fence)
{
    char digits[MAXINT8LEN + 1];
    int len = pg_lltoa(fence, digits);
    return text_hash(digits, len);
}

// Inside a transaction block Citus runs a delegated call as a task that may not start others
// (a shard could move under them); this one only reads, to explain an error: it may.
uint64 job_now_across_shards(const Params& p)
{
    const Shard* was = routed;
    routed = nullptr;
    int nest = NewGUCNestLevel();
    (void) set_config_option("citus.allow_nested_distributed_execution", "on", PGC_SUSET,
                             PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
    uint64 rows = execute(job_now_anywhere, p, SPI_OK_SELECT);
    AtEOXact_GUC(true, nest);
    routed = was;
    return rows;
}

int local_shards(Shard** shards)
{
    if (!map.fresh)
        load_map();
    int n = 0;
    Shard* out = static_cast<Shard*>(palloc(sizeof(Shard) * (map.count + 1)));
    for (int i = 0; i < map.count; ++i)
        if (map.shards[i].local)
            out[n++] = map.shards[i];
    *shards = out;
    return n;
}

bool route_local(const Shard& s)
{
    Shard now = locked_shard_of(s.lo);
    if (!now.local || now.jobs != s.jobs)
        return false;
    current = now;
    routed = &current;
    return true;
}

bool route_fence_local(int64 fence)
{
    Shard s = locked_shard_of(fence_hash(fence));
    if (!s.local)
        return false;
    current = s;
    routed = &current;
    return true;
}

void unroute()
{
    routed = nullptr;
}

Oid jobs_shard_relid(const Shard& s)
{
    char name[NAMEDATALEN];
    snprintf(name, sizeof name, "jobs_%lld", static_cast<long long>(s.jobs));
    Oid nsp = get_namespace_oid("jobcap", true);
    return OidIsValid(nsp) ? get_relname_relid(name, nsp) : InvalidOid;
}

}  // namespace jobcap::citus
