// enqueue_job and enqueue_jobs: one INSERT that also checks the queue and resolves a dedupe key;
// on the direct path (direct/enqueue.cpp) when it may serve the call and no dedupe key is given.
#include "spi/access.hpp"
#include "spi/args.hpp"
#include "spi/citus.hpp"
#include "boundary.hpp"
#include "spi/errors.hpp"
#include "jobcap.hpp"
#include "spi/plans.hpp"
#include "spi/queue_lock.hpp"
#include "spi/statements.hpp"
#include "direct/direct.hpp"
#include "housekeeping/workflows.hpp"
#include "spi/history.hpp"
#include "spi/schema.hpp"

#include <algorithm>

namespace jobcap {
namespace {
constexpr std::size_t kMaxDedupeKey = 1024;
constexpr int kMaxEnqueueBatch = 100000;

// The workflow parameters (docs/workflows.md) of the 0.3.0 declarations, after the 0.2.0 ones:
// depends_on, parent_outputs, max_run_time, start_by, in this order from these positions.
// compat(0.2.0): a call through a 0.2.0 declaration passes none of them (PG_NARGS()).
constexpr int kEnqueueJobWorkflow = 6;
constexpr int kEnqueueJobsWorkflow = 5;
// concurrency_key (enqueue_job) and concurrency_keys (enqueue_jobs), after the workflow
// parameters (docs/flow_control.md). compat(0.2.0): not passed by the 0.2.0 declarations.
constexpr int kEnqueueJobKey = kEnqueueJobWorkflow + 4;
constexpr int kEnqueueJobsKeys = kEnqueueJobsWorkflow + 4;
// enqueue_job's dedupe_window and dedupe, last (docs/flow_control.md#dedupe-windows).
constexpr int kEnqueueJobDedupe = kEnqueueJobKey + 1;

// What an enqueue's workflow parameters ask for: the jobs it depends on (sorted, each once).
struct Dependencies {
    int64* ids;
    int n;
    bool pass_output;
};

// run_at, priority and max_attempts (arguments first..first+2), shared by both enqueues; the
// time of the call is enqueued_at.
EnqueueValues read_schedule(FunctionCallInfo fcinfo, int first)
{
    EnqueueValues v = {};
    v.run_at = DatumGetTimestampTz(arg_required(fcinfo, first, "run_at"));
    if (TIMESTAMP_NOT_FINITE(v.run_at))
        ereport(ERROR,
                (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("run_at must be a finite time")));
    v.priority = DatumGetInt32(arg_required(fcinfo, first + 1, "priority"));
    v.no_max_attempts =
        !arg_count_opt(fcinfo, first + 2, "max_attempts", core::kMaxAttempts, &v.max_attempts);
    v.now = GetCurrentTimestamp();
    return v;
}

void add_schedule(Params& p, const EnqueueValues& v)
{
    p.add(TimestampTzGetDatum(v.run_at)).add(Int32GetDatum(v.priority));
    p.add(Int32GetDatum(v.max_attempts), v.no_max_attempts);
}

// The workflow parameters from argument first on (depends_on, parent_outputs, max_run_time,
// start_by), into v and *deps; none when the declaration has no such arguments (compat(0.2.0)).
void read_workflow(FunctionCallInfo fcinfo, int first, EnqueueValues* v, Dependencies* deps)
{
    *deps = Dependencies{nullptr, 0, false};
    v->no_start_by = v->no_max_run_time = true;
    if (PG_NARGS() < first + 4)  // compat(0.2.0)
        return;
    if (!PG_ARGISNULL(first)) {
        ArrayType* a = PG_GETARG_ARRAYTYPE_P(first);
        int n = ArrayGetNItems(ARR_NDIM(a), ARR_DIMS(a));
        if (ARR_NDIM(a) > 1)
            ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                            errmsg("depends_on must be a one-dimensional array")));
        if (array_contains_nulls(a))
            ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
                            errmsg("depends_on must not contain nulls")));
        if (n > core::kMaxDependsOn)
            ereport(ERROR,
                    (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED), errmsg("cannot depend on %d jobs", n),
                     errhint("A job may depend on at most %d jobs; make a job that depends "
                             "on some of them the one to depend on.",
                             static_cast<int>(core::kMaxDependsOn))));
        const int64* given = reinterpret_cast<const int64*>(ARR_DATA_PTR(a));
        deps->ids = static_cast<int64*>(palloc(sizeof(int64) * Max(n, 1)));
        for (int i = 0; i < n; ++i) {
            if (given[i] <= 0)
                ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                                errmsg("depends_on must hold job ids, not %lld",
                                       static_cast<long long>(given[i]))));
            deps->ids[i] = given[i];
        }
        std::sort(deps->ids, deps->ids + n);
        deps->n = static_cast<int>(std::unique(deps->ids, deps->ids + n) - deps->ids);
    }
    deps->pass_output = DatumGetBool(arg_required(fcinfo, first + 1, "parent_outputs"));
    if (deps->pass_output && deps->n == 0)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("parent_outputs needs depends_on"),
                        errhint("A job receives the outputs of the jobs it depends on.")));
    v->max_run_time = arg_span(fcinfo, first + 2, "max_run_time", false, true, &v->no_max_run_time);
    v->no_start_by = PG_ARGISNULL(first + 3);
    v->start_by = v->no_start_by ? 0 : PG_GETARG_TIMESTAMPTZ(first + 3);
    if (!v->no_start_by && TIMESTAMP_NOT_FINITE(v->start_by))
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("start_by must be a finite time")));
}

// The per-job workflow values of an INSERT that lists them (0.3.0): max_run_time, start_by.
void add_deadlines(Params& p, const EnqueueValues& v)
{
    p.add(v.max_run_time, v.no_max_run_time);
    p.add(TimestampTzGetDatum(v.start_by), v.no_start_by);
}

// A concurrency key: 1 to kMaxDedupeKey bytes, as a dedupe key.
void check_key(const text* key, const char* what)
{
    std::size_t len = VARSIZE_ANY_EXHDR(key);
    if (len == 0 || len > kMaxDedupeKey)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("%s must be 1 to %d bytes, not %zu", what,
                               static_cast<int>(kMaxDedupeKey), len),
                        errhint("NULL means no key.")));
}

// enqueue_job's concurrency_key (argument `at`) into v: keys_array a one-element text[] (for the
// statements), keys and key_nulls its element (for the direct path); nothing when NULL or not
// passed (compat(0.2.0)).
void read_key(FunctionCallInfo fcinfo, int at, EnqueueValues* v)
{
    if (PG_NARGS() <= at || PG_ARGISNULL(at))
        return;
    text* key = PG_GETARG_TEXT_PP(at);
    check_key(key, "concurrency_key");
    Datum* keys = static_cast<Datum*>(palloc(sizeof(Datum)));
    bool* nulls = static_cast<bool*>(palloc(sizeof(bool)));
    keys[0] = PointerGetDatum(key);
    nulls[0] = false;
    v->keys = keys;
    v->key_nulls = nulls;
    v->keys_array = PointerGetDatum(construct_array(keys, 1, TEXTOID, -1, false, TYPALIGN_INT));
}

// enqueue_jobs' concurrency_keys (argument `at`) into v: one key or NULL per payload.
void read_keys(FunctionCallInfo fcinfo, int at, int n, EnqueueValues* v)
{
    // compat(0.2.0): the 0.2.0 declarations pass no keys.
    if (PG_NARGS() <= at || PG_ARGISNULL(at))
        return;
    ArrayType* a = PG_GETARG_ARRAYTYPE_P(at);
    int count = ArrayGetNItems(ARR_NDIM(a), ARR_DIMS(a));
    if (ARR_NDIM(a) > 1)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("concurrency_keys must be a one-dimensional array")));
    if (count != n)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("concurrency_keys has %d elements for %d payloads", count, n),
                        errhint("Give one key per payload, NULL for a job without one.")));
    Datum* keys = nullptr;
    bool* nulls = nullptr;
    int got = 0;
    deconstruct_array(a, TEXTOID, -1, false, TYPALIGN_INT, &keys, &nulls, &got);
    for (int i = 0; i < got; ++i)
        if (!nulls[i])
            check_key(DatumGetTextPP(keys[i]), "concurrency_keys element");
    v->keys = keys;
    v->key_nulls = nulls;
    v->keys_array = PointerGetDatum(a);
}

// The keys' parameter of the 0.3.0 statements: a text[] with one key or NULL per job, or NULL.
void add_keys(Params& p, const EnqueueValues& v)
{
    p.add(v.keys_array, v.keys == nullptr);
}

// Payloads that are to receive their parents' outputs must be JSON objects.
void check_objects(const Datum* payloads, int n)
{
    for (int i = 0; i < n; ++i)
        if (!JB_ROOT_IS_OBJECT(DatumGetJsonbP(payloads[i])))
            ereport(ERROR,
                    (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                     errmsg("payload must be a JSON object to receive its parents' outputs"),
                     errdetail("parent_outputs adds the key \"parent_outputs\" to the payload.")));
}

// Every payload of enqueue_jobs within jobcap.max_payload_bytes (array elements are never
// toasted: their size is what they hold).
void check_payload_sizes(const Datum* elems, int count)
{
    for (int i = 0; i < count; ++i) {
        Size size = VARSIZE_ANY_EXHDR(DatumGetPointer(elems[i]));
        if (size > static_cast<Size>(guc_max_payload_bytes))
            ereport(ERROR, (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
                            errmsg("payload %d is too large (%zu bytes, at most %d)", i + 1,
                                   static_cast<size_t>(size), guc_max_payload_bytes),
                            errhint("Store large data elsewhere and enqueue a reference to it, or "
                                    "raise jobcap.max_payload_bytes.")));
    }
}
}  // namespace

namespace statements {

// One statement: the queue must exist (no row otherwise); a dedupe key that matches a pending,
// running or dead job inserts nothing and yields that job. The fallback lookup runs under the
// same snapshot, so it can miss a conflicting job committed after it; the caller then retries.
// Column 1 says whether to wake workers: only when a job was inserted (a dedupe hit enqueued
// nothing, and re-enqueueing a dead key must leave the queue quiet). $8 = caller: a queue not
// granted to it is no queue here (access.hpp).
// DEADLINE_COLUMNS, DEADLINE_VALUES: the 0.3.0 columns max_run_time and start_by and their
// parameters ($9, $10 for enqueue_job; $8, $9 for enqueue_jobs), "" on the 0.2.0 schema.
#define ENQUEUE_JOB(DEADLINE_COLUMNS, DEADLINE_VALUES)                                             \
    "WITH q AS (SELECT queue, notify FROM jobcap.queues"                                           \
    "           WHERE queue = $1 AND " JOBCAP_MAY_WORK("$8", "$1") "),"                            \
    " ins AS (INSERT INTO jobcap.jobs"                                                             \
    "           (queue, payload, run_at, priority, max_attempts, dedupe_key, enqueued_at"          \
    DEADLINE_COLUMNS ")"                                                                           \
    "         SELECT q.queue, $2, $3, $4, $5, $6, $7" DEADLINE_VALUES " FROM q"                    \
    "         ON CONFLICT (queue, dedupe_key)"                                                     \
    "           WHERE dedupe_key IS NOT NULL AND state IN ('pending', 'running', 'dead')"          \
    "         DO NOTHING RETURNING job_id)"                                                        \
    " SELECT q.notify AND EXISTS (SELECT FROM ins), coalesce((SELECT job_id FROM ins),"            \
    "        (SELECT j.job_id FROM jobcap.jobs j WHERE $6 IS NOT NULL AND j.queue = $1"            \
    "           AND j.dedupe_key = $6 AND j.state IN ('pending', 'running', 'dead') LIMIT 1))"     \
    " FROM q"

// On the 0.3.0 schema also concurrency_key: $11, a one-element text[] (or NULL).
JOBCAP_STATEMENT(enqueue_job,
                 ENQUEUE_JOB(", max_run_time, start_by, concurrency_key", ", $9, $10, $11[1]"),
                 {TEXTOID, JSONBOID, TIMESTAMPTZOID, INT4OID, INT4OID, TEXTOID, TIMESTAMPTZOID,
                  OIDOID, INTERVALOID, TIMESTAMPTZOID, TEXTARRAYOID},
                 PlanKind::generic);

// The job_id of key KEY's latest succeeded or cancelled job in queue QUEUE (the highest id: one
// entry of jobs_dedupe_done) when it was enqueued at or after SINCE; no row otherwise.
#define LATEST_FINISHED_SINCE(QUEUE, KEY, SINCE)                                                   \
    "SELECT l.job_id FROM (SELECT j.job_id, j.enqueued_at FROM jobcap.jobs j"                      \
    "   WHERE j.queue = " QUEUE " AND j.dedupe_key = " KEY                                         \
    "     AND j.state IN ('succeeded', 'cancelled') ORDER BY j.job_id DESC LIMIT 1) l"             \
    " WHERE l.enqueued_at >= " SINCE

// enqueue_job's statement when a dedupe window ($12, or NULL) or replace ($13) is asked for;
// the key ($6) is never NULL here. recent: the key's latest finished job within the window; it
// stands for the key as a live holder does, so nothing is inserted, but a live holder comes
// first. upd (replace): the pending job holding the key takes the payload and run_at; a claim
// that locked it first leaves it running, and then it is returned unchanged as a running holder
// is. The retry loop covers what a snapshot misses, as for enqueue_job.
JOBCAP_STATEMENT(
    enqueue_job_dedupe,
    "WITH q AS (SELECT queue, notify FROM jobcap.queues"
    "           WHERE queue = $1 AND " JOBCAP_MAY_WORK("$8", "$1") "),"
    " recent AS (" LATEST_FINISHED_SINCE("$1", "$6", "$7 - $12") "),"
    " upd AS (UPDATE jobcap.jobs j SET payload = $2, run_at = $3 FROM q"
    "           WHERE $13 AND j.queue = q.queue AND j.dedupe_key = $6 AND j.state = 'pending'"
    "           RETURNING j.job_id),"
    " ins AS (INSERT INTO jobcap.jobs"
    "           (queue, payload, run_at, priority, max_attempts, dedupe_key, enqueued_at,"
    "            max_run_time, start_by, concurrency_key)"
    "         SELECT q.queue, $2, $3, $4, $5, $6, $7, $9, $10, $11[1] FROM q"
    "           WHERE NOT EXISTS (SELECT FROM recent) AND NOT EXISTS (SELECT FROM upd)"
    "         ON CONFLICT (queue, dedupe_key)"
    "           WHERE dedupe_key IS NOT NULL AND state IN ('pending', 'running', 'dead')"
    "         DO NOTHING RETURNING job_id)"
    " SELECT q.notify AND (EXISTS (SELECT FROM ins) OR EXISTS (SELECT FROM upd)),"
    "   coalesce((SELECT job_id FROM upd), (SELECT job_id FROM ins),"
    "        (SELECT j.job_id FROM jobcap.jobs j WHERE j.queue = $1"
    "           AND j.dedupe_key = $6 AND j.state IN ('pending', 'running', 'dead') LIMIT 1),"
    "        (SELECT job_id FROM recent)),"
    "   EXISTS (SELECT FROM ins)"
    " FROM q",
    {TEXTOID, JSONBOID, TIMESTAMPTZOID, INT4OID, INT4OID, TEXTOID, TIMESTAMPTZOID, OIDOID,
     INTERVALOID, TIMESTAMPTZOID, TEXTARRAYOID, INTERVALOID, BOOLOID},
    PlanKind::generic);

// After enqueue_job_dedupe inserted job $4 under a window ($3) for key $2 of queue $1: the
// statement's snapshot can predate the end of the job that held the key (its insert waited for
// that end, or it came just before), so the key's finished jobs are looked up again, in a new
// snapshot at READ COMMITTED; when one was enqueued within the window ($5 = the call's time),
// the new job is deleted (nobody saw it) and that one returned. Column 2: a live holder other
// than $4 in the snapshot, which only a snapshot that predates its end can show (REPEATABLE
// READ, SERIALIZABLE): a serialization failure.
JOBCAP_STATEMENT(
    recheck_dedupe_window,
    "WITH r AS (" LATEST_FINISHED_SINCE("$1", "$2", "$5 - $3") "),"
    " del AS (DELETE FROM jobcap.jobs j WHERE j.job_id = $4 AND EXISTS (SELECT FROM r))"
    " SELECT (SELECT job_id FROM r),"
    "   EXISTS (SELECT FROM jobcap.jobs j WHERE j.queue = $1 AND j.dedupe_key = $2"
    "           AND j.state IN ('pending', 'running', 'dead') AND j.job_id <> $4)",
    {TEXTOID, TEXTOID, INTERVALOID, INT8OID, TIMESTAMPTZOID}, PlanKind::generic);

// compat(0.2.0): the 0.2.0 schema's, without max_run_time and start_by.
JOBCAP_STATEMENT(enqueue_job_0_2, ENQUEUE_JOB("", ""),
                 {TEXTOID, JSONBOID, TIMESTAMPTZOID, INT4OID, INT4OID, TEXTOID, TIMESTAMPTZOID,
                  OIDOID},
                 PlanKind::generic);

// Many jobs, one statement: ids come back in the order of the payloads. $7 = caller. KEYS: the
// payloads unnested with their concurrency keys (0.3.0) or alone (0.2.0).
#define ENQUEUE_JOBS(DEADLINE_COLUMNS, DEADLINE_VALUES, KEYS)                                      \
    "WITH q AS (SELECT queue, notify FROM jobcap.queues"                                           \
    "           WHERE queue = $1 AND " JOBCAP_MAY_WORK("$7", "$1") "),"                            \
    " ins AS (INSERT INTO jobcap.jobs (queue, payload, run_at, priority, max_attempts, enqueued_at" \
    DEADLINE_COLUMNS ")"                                                                           \
    "         SELECT q.queue, p.payload, $3, $4, $5, $6" DEADLINE_VALUES                           \
    "           FROM q, " KEYS " ORDER BY p.n"                                 \
    "         RETURNING job_id)"                                                                   \
    " SELECT q.notify, coalesce((SELECT array_agg(job_id ORDER BY job_id) FROM ins), '{}')"        \
    " FROM q"

// $10: the concurrency keys (a text[] as long as the payloads, or NULL).
JOBCAP_STATEMENT(
    enqueue_jobs,
    ENQUEUE_JOBS(", max_run_time, start_by, concurrency_key", ", $8, $9, p.key",
                 "unnest($2::jsonb[], $10::text[]) WITH ORDINALITY AS p(payload, key, n)"),
    {TEXTOID, JSONBARRAYOID, TIMESTAMPTZOID, INT4OID, INT4OID, TIMESTAMPTZOID, OIDOID, INTERVALOID,
     TIMESTAMPTZOID, TEXTARRAYOID},
    PlanKind::generic);

// compat(0.2.0): the 0.2.0 schema's, without max_run_time, start_by and concurrency_key.
JOBCAP_STATEMENT(enqueue_jobs_0_2,
                 ENQUEUE_JOBS("", "", "unnest($2::jsonb[]) WITH ORDINALITY AS p(payload, n)"),
                 {TEXTOID, JSONBARRAYOID, TIMESTAMPTZOID, INT4OID, INT4OID, TIMESTAMPTZOID, OIDOID},
                 PlanKind::generic);

// Jobs that depend on others ($12, their ids; $11: pass their outputs): inserted waiting,
// pending (every one of them succeeded already) or cancelled (one is dead or cancelled: $13 is
// the reason, kept in the history), $10 the state and $14 how many have not succeeded. The
// columns of enqueue_jobs' INSERT, plus the state, the count and the deadlines ($8, $9). $7 =
// caller.
JOBCAP_STATEMENT(
    enqueue_dependents,
    "WITH q AS (SELECT queue, notify FROM jobcap.queues"
    "           WHERE queue = $1 AND " JOBCAP_MAY_WORK("$7", "$1") "),"
    " ins AS (INSERT INTO jobcap.jobs (queue, payload, run_at, priority, max_attempts, enqueued_at,"
    "           max_run_time, start_by, state, waiting_on, finished_at, concurrency_key)"
    "         SELECT q.queue, p.payload, $3, $4, $5, $6, $8, $9, $10::jobcap.job_state, $14,"
    "           CASE WHEN $10 = 'cancelled' THEN $6 END, p.key"
    "           FROM q, unnest($2::jsonb[], $15::text[]) WITH ORDINALITY AS p(payload, key, n)"
    "           ORDER BY p.n"
    "         RETURNING job_id, queue, attempts, fence, NULL::text AS worker),"
    " edges AS (INSERT INTO jobcap.job_dependencies (depends_on, job_id, pass_output)"
    "         SELECT d.id, i.job_id, $11 FROM ins i, unnest($12::bigint[]) AS d(id)),"
    " gone AS (SELECT * FROM ins WHERE $10 = 'cancelled'),"
    JOBCAP_HISTORY_CTES("gone", "'cancelled'", "$13", "$6")
    " SELECT q.notify AND $10 = 'pending',"
    "   coalesce((SELECT array_agg(job_id ORDER BY job_id) FROM ins), '{}')"
    " FROM q",
    {TEXTOID, JSONBARRAYOID, TIMESTAMPTZOID, INT4OID, INT4OID, TIMESTAMPTZOID, OIDOID,
     INTERVALOID, TIMESTAMPTZOID, TEXTOID, BOOLOID, INT8ARRAYOID, TEXTOID, INT4OID, TEXTARRAYOID},
    PlanKind::generic);

}  // namespace statements

namespace {

// At READ COMMITTED the insert's snapshot is taken after the queue lock (queue_lock.hpp), which
// drop_queue's excludes, so a queue it saw cannot be dropped under it. A REPEATABLE READ
// snapshot can predate a drop that committed since: check the queue in the latest state, as
// PostgreSQL's foreign keys do. Our queue lock now keeps any later drop waiting for us.
void check_queue_survived(const NameArg& queue)
{
    if (!IsolationUsesXactSnapshot())
        return;
    Params p;
    p.add(queue.datum);
    if (execute_fresh(statements::queue_exists, p, SPI_OK_SELECT) == 0)
        ereport(
            ERROR,
            (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
             errmsg(
                 "could not enqueue into queue \"%s\": it was dropped by a concurrent transaction",
                 queue.cstr),
             errhint("Retry the transaction.")));
}

// The enqueue of jobs that depend on others (the SQL statements only), inside an open SPI
// connection, after the queue lock: the jobs depended on locked and marked, then the new jobs
// inserted waiting, pending or cancelled with their edges (docs/workflows.md). payloads: a
// jsonb[]. Returns the new ids (an int8[] outside SPI's memory) and sets *notify.
Datum enqueue_with_dependencies(const Access& access, const char* function, const NameArg& queue,
                                Datum payloads, const EnqueueValues& v, const Dependencies& deps,
                                bool* notify)
{
    Datum parents = int8_array(deps.ids, deps.n);
    DependedOn on = lock_depended_on(access, deps.ids, deps.n);
    if (on.missing != 0) {
        if (!access.privileged)
            deny_job(function, on.missing);
        // On a Citus cluster the call runs on its queue's shard, where jobs of other queues
        // are not to be found.
        bool sharded = citus::loaded() && citus::distributed();
        ereport(ERROR, (errcode(ERRCODE_UNDEFINED_OBJECT),
                        errmsg("cannot depend on job %lld: it does not exist",
                               static_cast<long long>(on.missing)),
                        sharded ? errdetail("jobcap is distributed with Citus: a job can depend "
                                            "only on jobs of its own queue.")
                                : 0,
                        errhint("A job can depend only on jobs enqueued before it (so no cycle "
                                "can form).")));
    }
    if (on.denied != 0)
        deny_job(function, on.denied);
    int64 cause = on.cause;
    bool cause_dead = on.cause_dead;
    int waiting = on.waiting;
    const char* state = cause != 0 ? "cancelled" : waiting > 0 ? "waiting" : "pending";
    Params p;
    p.add(queue.datum).add(payloads);
    add_schedule(p, v);
    p.add(TimestampTzGetDatum(v.now)).add_caller(access);
    add_deadlines(p, v);
    p.add(CStringGetTextDatum(state)).add(BoolGetDatum(deps.pass_output)).add(parents);
    p.add(cause == 0 ? (Datum) 0
                     : CStringGetTextDatum(psprintf("job %lld, which it depends on, %s",
                                                    static_cast<long long>(cause),
                                                    cause_dead ? "is dead" : "was cancelled")),
          cause == 0);
    p.add(Int32GetDatum(waiting));
    add_keys(p, v);
    if (execute(statements::enqueue_dependents, p, SPI_OK_SELECT) == 0) {
        check_queue(access, function, queue.datum, queue.cstr);
        raise_unknown_queue(queue.cstr);  // created since the statement's snapshot
    }
    *notify = DatumGetBool(result_column(0, 1));
    Datum ids = SPI_datumTransfer(result_column(0, 2), false, -1);
    // Every job depended on has succeeded already: the outputs go in now.
    if (strcmp(state, "pending") == 0 && deps.pass_output) {
        ArrayType* a = DatumGetArrayTypeP(ids);
        pass_parent_outputs(reinterpret_cast<int64*>(ARR_DATA_PTR(a)),
                            ArrayGetNItems(ARR_NDIM(a), ARR_DIMS(a)));
    }
    return ids;
}

// enqueue_job's dedupe_window and dedupe (docs/flow_control.md#dedupe-windows).
struct DedupeMode {
    bool asked;  // a window or replace: enqueue_job_dedupe, with the two below as $12, $13
    bool no_window;
    Datum window;
    bool replace;
};

// Arguments at and at + 1, not passed by the 0.2.0 declaration. Both need a dedupe key.
DedupeMode read_dedupe(FunctionCallInfo fcinfo, int at, bool has_dedupe_key)
{
    DedupeMode d = {false, true, (Datum) 0, false};
    if (PG_NARGS() <= at + 1)  // compat(0.2.0)
        return d;
    d.window = arg_span(fcinfo, at, "dedupe_window", false, true, &d.no_window);
    const char* mode = text_to_cstring(DatumGetTextPP(arg_required(fcinfo, at + 1, "dedupe")));
    d.replace = strcmp(mode, "replace") == 0;
    if (!d.replace && strcmp(mode, "keep") != 0)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("dedupe must be 'keep' or 'replace', not \"%s\"", mode)));
    d.asked = !d.no_window || d.replace;
    if (d.asked && !has_dedupe_key)
        ereport(ERROR,
                (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                 errmsg(d.no_window ? "dedupe => 'replace' needs a dedupe_key"
                                    : "dedupe_window needs a dedupe_key"),
                 errhint("The window and replace apply to the jobs holding the same dedupe_key.")));
    return d;
}

// recheck_dedupe_window for job_id, which enqueue_job_dedupe inserted: the job to return, and
// *notify cleared when it is another.
int64 recheck_window(const NameArg& queue, Datum key, Datum window, int64 job_id, TimestampTz now,
                     bool* notify)
{
    Params p;
    p.add(queue.datum)
        .add(key)
        .add(window)
        .add(Int64GetDatum(job_id))
        .add(TimestampTzGetDatum(now));
    execute(statements::recheck_dedupe_window, p, SPI_OK_SELECT);
    if (DatumGetBool(result_column(0, 2)))
        ereport(ERROR,
                (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
                 errmsg("could not enqueue into queue \"%s\": the job holding its dedupe key ended "
                        "after this transaction's snapshot",
                        queue.cstr),
                 errdetail("Its dedupe_window asks whether that job was enqueued within it."),
                 errhint("Retry the transaction.")));
    bool none = false;
    Datum found = result_column(0, 1, &none);
    if (none)
        return job_id;
    *notify = false;
    return DatumGetInt64(found);
}

// enqueue_job's and enqueue_jobs' refusals for a job that depends on others.
void check_dependent(const Dependencies& deps, bool has_dedupe_key, const Datum* payloads, int n)
{
    if (deps.n == 0)
        return;
    if (has_dedupe_key)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("a job with depends_on cannot have a dedupe_key"),
                        errdetail("A waiting job holds no dedupe key, so two of them could become "
                                  "pending with the same one."),
                        errhint("Give the key to a job it depends on, or leave it out.")));
    if (deps.pass_output)
        check_objects(payloads, n);
}

}  // namespace
}  // namespace jobcap

using namespace jobcap;

JOBCAP_FUNCTION(enqueue_job, Duty::worker)
{
    NameArg queue = arg_queue(fcinfo, 0);
    Datum payload = arg_payload(fcinfo, 1);
    EnqueueValues v = read_schedule(fcinfo, 2);
    Params p;
    p.add(queue.datum).add(payload);
    add_schedule(p, v);
    if (PG_ARGISNULL(5)) {
        p.add((Datum) 0, true);
    } else {
        text* key = PG_GETARG_TEXT_PP(5);
        std::size_t len = VARSIZE_ANY_EXHDR(key);
        if (len == 0 || len > kMaxDedupeKey)
            ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                            errmsg("dedupe_key must be 1 to %d bytes, not %zu",
                                   static_cast<int>(kMaxDedupeKey), len)));
        p.add(PointerGetDatum(key));
    }
    p.add(TimestampTzGetDatum(v.now)).add_caller(access);
    Dependencies deps;
    read_workflow(fcinfo, kEnqueueJobWorkflow, &v, &deps);
    read_key(fcinfo, kEnqueueJobKey, &v);
    check_dependent(deps, !PG_ARGISNULL(5), &payload, 1);
    DedupeMode dedupe = read_dedupe(fcinfo, kEnqueueJobDedupe, !PG_ARGISNULL(5));

    lock_queue_for_insert(queue.datum);
    if (deps.n > 0) {
        bool notify = false;
        spi_open(access);
        Datum ids = enqueue_with_dependencies(
            access, function, queue,
            PointerGetDatum(construct_array(&payload, 1, JSONBOID, -1, false, TYPALIGN_INT)), v,
            deps, &notify);
        check_queue_survived(queue);
        spi_close(access);
        if (notify)
            Async_Notify("jobcap", queue.cstr);
        PG_RETURN_INT64(reinterpret_cast<int64*>(ARR_DATA_PTR(DatumGetArrayTypeP(ids)))[0]);
    }
    // A dedupe key needs the SQL statement's ON CONFLICT (speculative insertion).
    if (PG_ARGISNULL(5) && direct::usable(function, access, direct::Need::insert)) {
        v.lists_dedupe_key = true;
        int64 job_id = 0;
        bool notify = false;
        if (direct::enqueue(access, queue.datum, &payload, 1, v, &job_id, &notify) == 1) {
            if (notify)
                Async_Notify("jobcap", queue.cstr);
            PG_RETURN_INT64(job_id);
        }
    }
    spi_open(access);
    // compat(0.2.0): the 0.2.0 schema's statement, without max_run_time and start_by.
    bool deadlines = workflows_schema_exists();
    if (deadlines) {
        add_deadlines(p, v);
        add_keys(p, v);
    }
    if (dedupe.asked)
        p.add(dedupe.window, dedupe.no_window).add(BoolGetDatum(dedupe.replace));
    int64 job_id = 0;
    bool notify = false;
    Statement& statement = dedupe.asked ? statements::enqueue_job_dedupe
                           : deadlines  ? statements::enqueue_job
                                        : statements::enqueue_job_0_2;
    // A miss happens only when a job holding the key commits between the insert's conflict
    // check and the lookup; at READ COMMITTED the next try sees it.
    for (int attempt = 0; attempt < 3 && job_id == 0; ++attempt) {
        if (execute(statement, p, SPI_OK_SELECT) == 0) {
            // Raises unless the queue appeared since the statement's snapshot: then retry.
            check_queue(access, function, queue.datum, queue.cstr);
            continue;
        }
        bool missing = false;
        Datum id = result_column(0, 2, &missing);
        notify = DatumGetBool(result_column(0, 1));
        if (!missing)
            job_id = DatumGetInt64(id);
        if (job_id != 0 && !dedupe.no_window && DatumGetBool(result_column(0, 3)))
            job_id =
                recheck_window(queue, PG_GETARG_DATUM(5), dedupe.window, job_id, v.now, &notify);
    }
    if (job_id == 0)
        ereport(ERROR,
                (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
                 errmsg("could not enqueue into queue \"%s\": its dedupe key kept changing hands",
                        queue.cstr),
                 errhint("Retry the transaction.")));
    check_queue_survived(queue);
    spi_close(access);
    if (notify)
        Async_Notify("jobcap", queue.cstr);
    PG_RETURN_INT64(job_id);
}

JOBCAP_FUNCTION(enqueue_jobs, Duty::worker)
{
    NameArg queue = arg_queue(fcinfo, 0);
    Datum payloads_arg = arg_required(fcinfo, 1, "payloads");
    ArrayType* payloads = DatumGetArrayTypeP(payloads_arg);
    int count = ArrayGetNItems(ARR_NDIM(payloads), ARR_DIMS(payloads));
    if (count > kMaxEnqueueBatch)
        ereport(ERROR, (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
                        errmsg("cannot enqueue %d jobs in one call", count),
                        errhint("Enqueue at most %d jobs per call.", kMaxEnqueueBatch)));
    if (array_contains_nulls(payloads))
        ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
                        errmsg("payloads must not contain nulls")));
    Datum* elems = nullptr;
    int n = 0;
    deconstruct_array(payloads, JSONBOID, -1, false, TYPALIGN_INT, &elems, nullptr, &n);
    check_payload_sizes(elems, n);
    EnqueueValues v = read_schedule(fcinfo, 2);
    Params p;
    p.add(queue.datum).add(payloads_arg);
    add_schedule(p, v);
    p.add(TimestampTzGetDatum(v.now)).add_caller(access);
    Dependencies deps;
    read_workflow(fcinfo, kEnqueueJobsWorkflow, &v, &deps);
    read_keys(fcinfo, kEnqueueJobsKeys, n, &v);
    check_dependent(deps, false, elems, n);

    lock_queue_for_insert(queue.datum);
    if (deps.n > 0) {
        bool notify = false;
        spi_open(access);
        Datum ids =
            enqueue_with_dependencies(access, function, queue, payloads_arg, v, deps, &notify);
        check_queue_survived(queue);
        spi_close(access);
        if (notify && count > 0)
            Async_Notify("jobcap", queue.cstr);
        PG_RETURN_DATUM(ids);
    }
    if (direct::usable(function, access, direct::Need::insert)) {
        int64* ids = static_cast<int64*>(palloc(sizeof(int64) * Max(n, 1)));
        bool notify = false;
        if (direct::enqueue(access, queue.datum, elems, n, v, ids, &notify) == n) {
            if (notify && n > 0)
                Async_Notify("jobcap", queue.cstr);
            if (n == 0)
                PG_RETURN_ARRAYTYPE_P(construct_empty_array(INT8OID));
            // Sorted, as the statement's array_agg(job_id ORDER BY job_id): the payloads' order
            // for an ascending identity, reversed for a descending one.
            std::sort(ids, ids + n);
            Datum* boxed = static_cast<Datum*>(palloc(sizeof(Datum) * n));
            for (int i = 0; i < n; ++i)
                boxed[i] = Int64GetDatum(ids[i]);
            PG_RETURN_ARRAYTYPE_P(construct_array(boxed, n, INT8OID, sizeof(int64), FLOAT8PASSBYVAL,
                                                  TYPALIGN_DOUBLE));
        }
    }
    spi_open(access);
    // compat(0.2.0): the 0.2.0 schema's statement, without max_run_time and start_by.
    bool deadlines = workflows_schema_exists();
    if (deadlines) {
        add_deadlines(p, v);
        add_keys(p, v);
    }
    if (execute(deadlines ? statements::enqueue_jobs : statements::enqueue_jobs_0_2, p,
                SPI_OK_SELECT) == 0) {
        check_queue(access, function, queue.datum, queue.cstr);
        raise_unknown_queue(queue.cstr);  // created since the statement's snapshot
    }
    bool notify = DatumGetBool(result_column(0, 1)) && count > 0;
    Datum ids = SPI_datumTransfer(result_column(0, 2), false, -1);
    check_queue_survived(queue);
    spi_close(access);
    if (notify)
        Async_Notify("jobcap", queue.cstr);
    PG_RETURN_DATUM(ids);
}
