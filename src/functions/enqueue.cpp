// enqueue_job and enqueue_jobs: one INSERT that also checks the queue and resolves a dedupe key;
// on the direct path (direct/enqueue.cpp) when it may serve the call and no dedupe key is given.
#include "spi/access.hpp"
#include "spi/args.hpp"
#include "boundary.hpp"
#include "spi/errors.hpp"
#include "jobcap.hpp"
#include "spi/plans.hpp"
#include "spi/queue_lock.hpp"
#include "spi/statements.hpp"
#include "direct/direct.hpp"

#include <algorithm>

namespace jobcap {
namespace {
constexpr std::size_t kMaxDedupeKey = 1024;
constexpr int kMaxEnqueueBatch = 100000;

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
JOBCAP_STATEMENT(enqueue_job, "WITH q AS (SELECT queue, notify FROM jobcap.queues"
    "           WHERE queue = $1 AND " JOBCAP_MAY_WORK("$8", "$1") "),"
    " ins AS (INSERT INTO jobcap.jobs"
    "           (queue, payload, run_at, priority, max_attempts, dedupe_key, enqueued_at)"
    "         SELECT q.queue, $2, $3, $4, $5, $6, $7 FROM q"
    "         ON CONFLICT (queue, dedupe_key)"
    "           WHERE dedupe_key IS NOT NULL AND state IN ('pending', 'running', 'dead')"
    "         DO NOTHING RETURNING job_id)"
    " SELECT q.notify AND EXISTS (SELECT FROM ins), coalesce((SELECT job_id FROM ins),"
    "        (SELECT j.job_id FROM jobcap.jobs j WHERE $6 IS NOT NULL AND j.queue = $1"
    "           AND j.dedupe_key = $6 AND j.state IN ('pending', 'running', 'dead') LIMIT 1))"
    " FROM q",
    {TEXTOID, JSONBOID, TIMESTAMPTZOID, INT4OID, INT4OID, TEXTOID, TIMESTAMPTZOID, OIDOID}, PlanKind::generic);

// Many jobs, one statement: ids come back in the order of the payloads. $7 = caller.
JOBCAP_STATEMENT(enqueue_jobs, "WITH q AS (SELECT queue, notify FROM jobcap.queues"
    "           WHERE queue = $1 AND " JOBCAP_MAY_WORK("$7", "$1") "),"
    " ins AS (INSERT INTO jobcap.jobs (queue, payload, run_at, priority, max_attempts, enqueued_at)"
    "         SELECT q.queue, p.payload, $3, $4, $5, $6"
    "           FROM q, unnest($2::jsonb[]) WITH ORDINALITY AS p(payload, n) ORDER BY p.n"
    "         RETURNING job_id)"
    " SELECT q.notify, coalesce((SELECT array_agg(job_id ORDER BY job_id) FROM ins), '{}')"
    " FROM q",
    {TEXTOID, JSONBARRAYOID, TIMESTAMPTZOID, INT4OID, INT4OID, TIMESTAMPTZOID, OIDOID}, PlanKind::generic);

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

    lock_queue_for_insert(queue.datum);
    // A dedupe key needs the SQL statement's ON CONFLICT (speculative insertion).
    if (PG_ARGISNULL(5) && direct::usable(function, direct::Need::insert)) {
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
    int64 job_id = 0;
    bool notify = false;
    // A miss happens only when a job holding the key commits between the insert's conflict
    // check and the lookup; at READ COMMITTED the next try sees it.
    for (int attempt = 0; attempt < 3 && job_id == 0; ++attempt) {
        if (execute(statements::enqueue_job, p, SPI_OK_SELECT) == 0) {
            // Raises unless the queue appeared since the statement's snapshot: then retry.
            check_queue(access, function, queue.datum, queue.cstr);
            continue;
        }
        bool missing = false;
        Datum id = result_column(0, 2, &missing);
        notify = DatumGetBool(result_column(0, 1));
        if (!missing)
            job_id = DatumGetInt64(id);
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

    lock_queue_for_insert(queue.datum);
    if (direct::usable(function, direct::Need::insert)) {
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
    if (execute(statements::enqueue_jobs, p, SPI_OK_SELECT) == 0) {
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
