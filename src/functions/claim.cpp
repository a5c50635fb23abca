// claim_job and claim_job_by_id: the execution boundary. A job runs only after passing through
// one of these statements, and each is ONE statement that locks, counts and caps:
//   state -> running, attempts + 1, a new fence, lease set, only while attempts < the cap.
// However a job came to be pending (enqueue, reaper, requeue, a row inserted by hand), it cannot
// run past its cap, and the count is committed before any work starts. Should the claiming
// transaction roll back after all, the claimed jobs are noted (housekeeping/rollbacks.hpp) and,
// with jobcap preloaded, the reaper counts their attempts anyway; until it has, claims skip them.
//
// Queue controls are read inside the same statements: a paused queue hands out nothing, and a
// queue with max_running, rate_limit or max_running_per_key hands out only what fits. The common
// case (none) costs one one-time filter on the queue's row. A claim far below max_running,
// max_running_per_key and rate_limit, its only limits, runs as an open one's, in a shared turn
// (queue_lock.hpp), and charges a rate-limited queue's window in its slot's own row.
// Any other capped claim takes the turn exclusive (after the shared claims in flight), then the
// queue's row lock, counts the queue's running jobs (per concurrency key too) and reads its
// rate window (core/flow.hpp, spi/rates.hpp) with a fresh snapshot, claims at most what all
// allow, and charges the window's exclusive row with what it claimed, in its own transaction.
// Round-robin fairness is a capped queue's too: its claim reads and writes the queue's turn
// (jobcap.queue_turns) under the lock. The keyed queues' statements: functions/claim_keyed.cpp.
#include "spi/rates.hpp"
#include "housekeeping/rollbacks.hpp"
#include "functions/claim_sql.hpp"
#include "functions/hot_path.hpp"
#include "spi/access.hpp"
#include "spi/args.hpp"
#include "boundary.hpp"
#include "spi/errors.hpp"
#include "spi/plans.hpp"
#include "spi/queue_lock.hpp"
#include "spi/schema.hpp"
#include "spi/statements.hpp"
#include "spi/cap.hpp"
#include "core/flow.hpp"
#include "core/order.hpp"

namespace jobcap {
namespace statements {

#define CLAIM_BATCH(KEY, GATE, PAUSED, CAP_BY, CAP, START_BY)                                      \
    "WITH cohort AS MATERIALIZED ("                                                                \
    "  SELECT j.job_id FROM jobcap.jobs j"                                                         \
    "   WHERE " KEY "j.queue = $4 AND j.state = 'pending' AND j.run_at <= $1" START_BY             \
    "     AND " JOBCAP_MAY_WORK(                                                                   \
        "$6", "$4") " AND " GATE " AND j.attempts < " CAP_BY                                       \
                    " AND j.job_id <> ALL ($7)"                                                    \
                    "   ORDER BY j.priority, j.run_at, j.job_id"                                   \
                    "   LIMIT $5"                                                                  \
                    "   FOR NO KEY UPDATE OF j SKIP LOCKED)" CLAIM_THE_COHORT(PAUSED START_BY,     \
                                                                              CAP)

JOBCAP_STATEMENT(claim_job,
                 CLAIM_BATCH(BY_QUEUE_KEY, QUEUE_OPEN("$4"), " AND NOT q.paused",
                             JOBCAP_CAP_BY("$4"), JOBCAP_CAP, START_BY_DUE),
                 {TIMESTAMPTZOID, TEXTOID, INTERVALOID, TEXTOID, INT4OID, OIDOID, INT8ARRAYOID},
                 PlanKind::steered);

// The same for a capped queue, run under its row lock with $5 = what fits.
JOBCAP_STATEMENT(claim_job_capped,
                 CLAIM_BATCH(BY_QUEUE_KEY, QUEUE_NOT_PAUSED("$4"), " AND NOT q.paused",
                             JOBCAP_CAP_BY("$4"), JOBCAP_CAP, START_BY_DUE),
                 {TIMESTAMPTZOID, TEXTOID, INTERVALOID, TEXTOID, INT4OID, OIDOID, INT8ARRAYOID},
                 PlanKind::steered);

// compat(0.2.0): the two on the 0.2.0 schema, without start_by.
JOBCAP_STATEMENT(claim_job_0_2,
                 CLAIM_BATCH(BY_QUEUE_KEY, QUEUE_OPEN_0_2("$4"), " AND NOT q.paused",
                             JOBCAP_CAP_BY("$4"), JOBCAP_CAP, ""),
                 {TIMESTAMPTZOID, TEXTOID, INTERVALOID, TEXTOID, INT4OID, OIDOID, INT8ARRAYOID},
                 PlanKind::steered);
// compat(0.2.0): the capped one.
JOBCAP_STATEMENT(claim_job_capped_0_2,
                 CLAIM_BATCH(BY_QUEUE_KEY, QUEUE_NOT_PAUSED("$4"), " AND NOT q.paused",
                             JOBCAP_CAP_BY("$4"), JOBCAP_CAP, ""),
                 {TIMESTAMPTZOID, TEXTOID, INTERVALOID, TEXTOID, INT4OID, OIDOID, INT8ARRAYOID},
                 PlanKind::steered);

// $4 = job_id, $5 = caller (NULL: privileged), $6 = jobs whose rolled-back claim is not counted.
#define CLAIM_ONE(GATE, PAUSED, CAP_BY, CAP, START_BY)                                             \
    "WITH cohort AS MATERIALIZED ("                                                                \
    "  SELECT j.job_id FROM jobcap.jobs j"                                                         \
    "   WHERE j.job_id = $4 AND j.state = 'pending' AND j.run_at <= $1" START_BY                   \
    "     AND j.job_id <> ALL ($6) AND j.attempts < " CAP_BY " AND " JOBCAP_MAY_WORK(              \
        "$5", "j.queue") " AND " GATE                                                              \
                         "   FOR NO KEY UPDATE OF j SKIP LOCKED)" CLAIM_THE_COHORT(                \
                             PAUSED START_BY, CAP)

JOBCAP_STATEMENT(claim_job_by_id,
                 CLAIM_ONE(QUEUE_OPEN("j.queue"), " AND NOT q.paused", JOBCAP_CAP_BY("j.queue"),
                           JOBCAP_CAP, START_BY_DUE),
                 {TIMESTAMPTZOID, TEXTOID, INTERVALOID, INT8OID, OIDOID, INT8ARRAYOID},
                 PlanKind::steered);

JOBCAP_STATEMENT(claim_job_by_id_capped,
                 CLAIM_ONE(QUEUE_NOT_PAUSED("j.queue"), " AND NOT q.paused",
                           JOBCAP_CAP_BY("j.queue"), JOBCAP_CAP, START_BY_DUE),
                 {TIMESTAMPTZOID, TEXTOID, INTERVALOID, INT8OID, OIDOID, INT8ARRAYOID},
                 PlanKind::steered);

// The same for a keyed queue: $7 = max_running_per_key (NULL: none), $8 and $9 = the running
// jobs per key (as claim_job_keyed's $9 and $10): a job of a key at its limit is not claimed.
#define KEY_HAS_ROOM                                                                               \
    " AND (j.concurrency_key IS NULL OR $7::int4 IS NULL OR coalesce((SELECT u.n"                  \
    "   FROM unnest($8::text[], $9::int4[]) AS u(k, n) WHERE u.k = j.concurrency_key), 0) < $7)"
JOBCAP_STATEMENT(claim_job_by_id_keyed,
                 CLAIM_ONE(QUEUE_NOT_PAUSED("j.queue") KEY_HAS_ROOM, " AND NOT q.paused",
                           JOBCAP_CAP_BY("j.queue"), JOBCAP_CAP, START_BY_DUE),
                 {TIMESTAMPTZOID, TEXTOID, INTERVALOID, INT8OID, OIDOID, INT8ARRAYOID, INT4OID,
                  TEXTARRAYOID, INT4ARRAYOID},
                 PlanKind::steered);

// compat(0.2.0): the two on the 0.2.0 schema, without start_by.
JOBCAP_STATEMENT(claim_job_by_id_0_2,
                 CLAIM_ONE(QUEUE_OPEN_0_2("j.queue"), " AND NOT q.paused", JOBCAP_CAP_BY("j.queue"),
                           JOBCAP_CAP, ""),
                 {TIMESTAMPTZOID, TEXTOID, INTERVALOID, INT8OID, OIDOID, INT8ARRAYOID},
                 PlanKind::steered);
// compat(0.2.0): the capped one.
JOBCAP_STATEMENT(claim_job_by_id_capped_0_2,
                 CLAIM_ONE(QUEUE_NOT_PAUSED("j.queue"), " AND NOT q.paused",
                           JOBCAP_CAP_BY("j.queue"), JOBCAP_CAP, ""),
                 {TIMESTAMPTZOID, TEXTOID, INTERVALOID, INT8OID, OIDOID, INT8ARRAYOID},
                 PlanKind::steered);

// compat(0.1.0): the claims of the 0.1.0 schema (no queue controls yet), between installing
// this library and ALTER EXTENSION jobcap UPDATE (spi/schema.hpp).
JOBCAP_STATEMENT(claim_job_0_1,
                 CLAIM_BATCH("", "true", "", JOBCAP_CAP_BY_0_1("$4"), JOBCAP_CAP_0_1, ""),
                 {TIMESTAMPTZOID, TEXTOID, INTERVALOID, TEXTOID, INT4OID, OIDOID, INT8ARRAYOID},
                 PlanKind::steered);
// compat(0.1.0): claim_job_by_id's.
JOBCAP_STATEMENT(claim_job_by_id_0_1,
                 CLAIM_ONE("true", "", JOBCAP_CAP_BY_0_1("j.queue"), JOBCAP_CAP_0_1, ""),
                 {TIMESTAMPTZOID, TEXTOID, INTERVALOID, INT8OID, OIDOID, INT8ARRAYOID},
                 PlanKind::steered);

// A capped queue's claims take its claim turn exclusive (spi/queue_lock.hpp), then its row lock
// (both held to commit; pause_queue and alter_queue take them too), then count its running
// jobs with a fresh snapshot: every claim that went before, shared ones too, has committed, and
// its jobs are counted. Every running job holds its slot, a lease that expired too, until it
// settles or the reaper takes it back: a heartbeat can revive an expired lease. $1 = queue.
JOBCAP_STATEMENT(lock_capped_queue,
                 "SELECT q.paused, q.max_running, q.rate_limit, q.rate_period,"
                 "   q.max_running_per_key, q.fairness = 'round_robin' FROM jobcap.queues q"
                 " WHERE q.queue = $1 FOR NO KEY UPDATE OF q",
                 {TEXTOID});

// compat(0.2.0): the 0.2.0 schema's, without a rate limit, per-key limit or fairness.
JOBCAP_STATEMENT(lock_capped_queue_0_2,
                 "SELECT q.paused, q.max_running, NULL::int4, NULL::interval, NULL::int4, false"
                 " FROM jobcap.queues q WHERE q.queue = $1 FOR NO KEY UPDATE OF q",
                 {TEXTOID});

// A keyed queue's running jobs per concurrency key (keys, counts; NULL for none), read under its
// row lock with a fresh snapshot, as count_running.
JOBCAP_STATEMENT(count_running_keys,
                 "SELECT array_agg(c.k), array_agg(c.n) FROM (SELECT j.concurrency_key,"
                 "   count(*)::int4 FROM jobcap.jobs j WHERE j.state = 'running'"
                 "   AND hashtextextended(j.queue, 0) = hashtextextended($1, 0) AND j.queue = $1"
                 "   AND j.concurrency_key IS NOT NULL GROUP BY 1) AS c(k, n)",
                 {TEXTOID});

// A round-robin queue's turn, read under its row lock with a fresh snapshot. $1 = queue.
JOBCAP_STATEMENT(read_turn, "SELECT t.last_key FROM jobcap.queue_turns t WHERE t.queue = $1",
                 {TEXTOID});

JOBCAP_STATEMENT(count_running,
                 "SELECT count(*)::int4 FROM jobcap.jobs j WHERE j.state = 'running'"
                 "   AND hashtextextended(j.queue, 0) = hashtextextended($1, 0) AND j.queue = $1",
                 {TEXTOID});

// After a claim of queue $1 found nothing: the queue's controls (paused; a cap, NULL when it has
// none), and whether the caller ($2) may work it. No row: no such queue.
#define QUEUE_CONTROLS(CAPPED)                                                                     \
    "SELECT q.paused, " CAPPED ", " JOBCAP_MAY_WORK("$2", "$1") " FROM jobcap.queues q"             \
                                                              " WHERE q.queue = $1"
#define CAPPED_BY                                                                                  \
    "coalesce(q.max_running, q.rate_limit, q.max_running_per_key,"                                 \
    "  CASE WHEN q.fairness <> 'fifo' THEN 0 END)"
JOBCAP_STATEMENT(queue_controls, QUEUE_CONTROLS(CAPPED_BY), {TEXTOID, OIDOID}, PlanKind::generic);
// compat(0.2.0): the 0.2.0 schema's, without a rate limit.
JOBCAP_STATEMENT(queue_controls_0_2, QUEUE_CONTROLS("q.max_running"), {TEXTOID, OIDOID},
                 PlanKind::generic);

// After claim_job_by_id found nothing (and check_job passed): the job's queue and its controls.
#define JOB_QUEUE_CONTROLS(CAPPED)                                                                 \
    "SELECT q.queue, q.paused, " CAPPED                                                            \
    " FROM jobcap.jobs j"                                                                          \
    "  JOIN jobcap.queues q ON q.queue = j.queue WHERE j.job_id = $1"
JOBCAP_STATEMENT(job_queue_controls, JOB_QUEUE_CONTROLS(CAPPED_BY), {INT8OID});
// compat(0.2.0): the 0.2.0 schema's, without a rate limit.
JOBCAP_STATEMENT(job_queue_controls_0_2, JOB_QUEUE_CONTROLS("q.max_running"), {INT8OID});

}  // namespace statements

namespace {

// A capped queue's room and, for a rate-limited one, the window its claim charges.
struct Room {
    TimestampTz now;  // the claim's time, read under the turn
    int32 room;       // how many more jobs the queue may start now; -1: no cap (any more)
    bool rated;       // a rate limit applies: charge window's own row with what the claim took
    RateRows window;
    bool keyed, round_robin;  // a per-key limit or round-robin: claim_job_keyed claims
    int32 per_key;            // 0: none
    Datum keys, counts;       // the running jobs per key ((Datum) 0: none)
    bool no_turn;             // round-robin: no turn written yet
    Datum last_key;           // round-robin: the key the last claim ended on
};

// How many more jobs queue may start now, under its row lock (taken here, held to commit):
// 0 when it is paused, full or out of rate; -1 when it has no cap (any more). A keyed queue's
// (max_running_per_key or round-robin) also brings its running jobs per key and its turn.
// flow: the schema has rate limits and keys (compat(0.2.0): not the 0.2.0 one).
Room capped_room(Datum queue, bool flow)
{
    Room r = {};
    Params p;
    p.add(queue);
    take_exclusive_claim_turn(queue);
    if (execute(flow ? statements::lock_capped_queue : statements::lock_capped_queue_0_2, p,
                SPI_OK_SELECT) == 0)
        return r;
    // The claim's time, read once it holds the turn and the row: every charge of the rate window
    // was made by a claim whose clock was read before it committed, so before this (the direct
    // path's clock_after_snapshot); a time read before the wait would have the window charge its
    // jobs in a later slot than their claimed_at.
    r.now = GetCurrentTimestamp();
    TimestampTz now = r.now;
    if (DatumGetBool(result_column(0, 1)))
        return r;
    bool uncapped = false, unrated = false, unkeyed = false;
    int32 cap = DatumGetInt32(result_column(0, 2, &uncapped));
    int32 limit = DatumGetInt32(result_column(0, 3, &unrated));
    int64 slot_us = unrated ? 0 : core::rate_slot_us(rate_period_usec(result_column(0, 4)));
    r.per_key = DatumGetInt32(result_column(0, 5, &unkeyed));  // 0 for NULL: no per-key limit
    r.round_robin = DatumGetBool(result_column(0, 6));
    r.keyed = r.per_key > 0 || r.round_robin;
    r.room = -1;
    if (!uncapped) {
        execute_fresh(statements::count_running, p, SPI_OK_SELECT);
        int32 running = DatumGetInt32(result_column(0, 1));
        r.room = running >= cap ? 0 : cap - running;
    }
    if (!unrated && r.room != 0) {
        r.rated = true;
        int32 rate_room = read_rate_window(queue, slot_us, now, limit, &r.window);
        r.room = r.room < 0 ? rate_room : Min(r.room, rate_room);
    }
    if (r.per_key > 0 && r.room != 0) {
        execute_fresh(statements::count_running_keys, p, SPI_OK_SELECT);
        bool none = false;  // (Datum) 0 for NULL: no key has running jobs
        r.keys = result_column(0, 1, &none);
        r.counts = result_column(0, 2, &none);
    }
    r.no_turn = true;
    if (r.round_robin && r.room != 0 &&
        execute_fresh(statements::read_turn, p, SPI_OK_SELECT) > 0) {
        r.no_turn = false;
        r.last_key = result_column(0, 1);
    }
    return r;
}

// The keyed claims' per-key parameters: max_running_per_key, the running jobs per key.
void add_key_room(Params& p, const Room& r)
{
    p.add(Int32GetDatum(r.per_key), r.per_key == 0);
    p.add(r.keys, r.keys == (Datum) 0).add(r.counts, r.keys == (Datum) 0);
}

// Charges the rate-limited queue's window with the jobs its claim took: after the claimed rows
// were read, since the statement replaces SPI's result.
void charge_room(Room& r, Datum queue, uint64 rows)
{
    if (r.rated && (rows > 0 || r.window.moved))
        charge_rate_window(r.window, queue, -1, rows);
}

// claim_job's statement parameters for call, claiming at most batch: now, worker, lease, queue,
// batch, caller, uncounted jobs.
Params claim_params(const ClaimCall& call, int32 batch, const Access& access, TimestampTz now)
{
    Params p;
    p.add(TimestampTzGetDatum(now)).add(call.worker.datum).add(call.lease, call.no_lease);
    p.add(call.queue.datum).add(Int32GetDatum(batch)).add_caller(access);
    p.add(call.uncounted);
    return p;
}

// claim_job and complete_and_claim on the SQL path: the claim of call.queue. Returns how many
// rows SPI_tuptable holds; raises for a queue that does not exist or is not the caller's.
// *room: what the caller charges once it has read them (charge_room).
uint64 claim_from_queue(const Access& access, const char* function, const ClaimCall& call,
                        Room* room)
{
    *room = Room{};
    const NameArg& queue = call.queue;
    Params claim = claim_params(call, call.batch, access, call.now);
    // compat(0.1.0): the 0.1.0 schema's claim, without queue controls.
    if (!queues_paused_column_exists()) {
        uint64 rows = execute(statements::claim_job_0_1, claim, SPI_OK_UPDATE_RETURNING);
        if (rows == 0)
            check_queue(access, function, queue.datum, queue.cstr);
        return rows;
    }
    // compat(0.2.0): the 0.2.0 schema's claims, without start_by and rate limits.
    bool deadlines = workflows_schema_exists();
    bool flow = flow_schema_exists();
    Statement& open_claim = deadlines && flow ? statements::claim_job : statements::claim_job_0_2;
    Statement& capped_claim =
        deadlines ? statements::claim_job_capped : statements::claim_job_capped_0_2;
    uint64 rows = execute(open_claim, claim, SPI_OK_UPDATE_RETURNING);
    if (rows > 0)
        return rows;
    Params check;
    check.add(queue.datum).add_caller(access);
    if (execute(flow ? statements::queue_controls : statements::queue_controls_0_2, check,
                SPI_OK_SELECT) == 0) {
        check_queue(access, function, queue.datum, queue.cstr);
        return 0;
    }
    if (!DatumGetBool(result_column(0, 3)))
        deny_queue(function, queue.cstr);
    bool uncapped = false;
    result_column(0, 2, &uncapped);
    if (DatumGetBool(result_column(0, 1)) || uncapped)
        return 0;
    *room = capped_room(queue.datum, flow);
    if (room->room < 0 && !room->keyed)  // the cap was lifted meanwhile
        return execute(open_claim, claim, SPI_OK_UPDATE_RETURNING);
    if (room->room == 0)
        return 0;
    int32 batch = room->room < 0 ? call.batch : Min(call.batch, room->room);
    if (!room->keyed)
        return execute(capped_claim, claim_params(call, batch, access, room->now),
                       SPI_OK_UPDATE_RETURNING);
    Params keyed = claim_params(call, batch, access, room->now);
    add_key_room(keyed, *room);
    if (!room->round_robin)
        return execute(statements::claim_job_keyed, keyed, SPI_OK_UPDATE_RETURNING);
    keyed.add(room->last_key, room->no_turn);
    return execute(statements::claim_job_turns, keyed, SPI_OK_SELECT);
}

// A claim must commit before the work, or the attempt it counted rolls back with the work and
// the job can loop without a count. Inside a savepoint or an exception block it always would:
// refuse there.
void refuse_claim_in_subtransaction(const char* function)
{
    refuse_subtransaction(function,
                          "A savepoint or exception block that rolls back would undo the claim, "
                          "and the attempt it counted.",
                          "Claim in its own transaction and commit it before doing the work.");
}

// Copies the claimed rows into the function's result, in claim order (the UPDATE returns them
// in the order it met them; columns 7 and 8 are priority and run_at).
void return_claimed(FunctionCallInfo fcinfo, uint64 rows)
{
    ReturnSetInfo* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
    core::ClaimKey* keys =
        static_cast<core::ClaimKey*>(palloc(sizeof(core::ClaimKey) * (rows + 1)));
    for (uint64 r = 0; r < rows; ++r)
        keys[r] = {DatumGetInt32(result_column(r, 7)), DatumGetTimestampTz(result_column(r, 8)),
                   DatumGetInt64(result_column(r, 1)), static_cast<uint32>(r)};
    core::sort_claim_order(keys, rows);
    for (uint64 i = 0; i < rows; ++i) {
        Datum values[6];
        bool nulls[6] = {false, false, false, false, false, false};
        for (int c = 0; c < 6; ++c)
            values[c] = result_column(keys[i].row, c + 1);
        tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
    }
    pfree(keys);
}

// The batch claim on the direct path (direct/direct.hpp): claims, notes and returns the jobs in
// claim order. False, with nothing claimed, when the SQL path must decide (the direct path is
// off or not usable here; the queue is missing, paused, capped or not the caller's).
bool claim_directly(FunctionCallInfo fcinfo, const Access& access, const char* function,
                    const ClaimCall& call)
{
    if (!direct::usable(function, access, direct::Need::claim))
        return false;
    direct::Claimed* jobs =
        static_cast<direct::Claimed*>(palloc(sizeof(direct::Claimed) * call.batch));
    direct::RateCharge charge;
    int n = direct::claim(access, call, jobs, &charge);
    if (n < 0) {
        pfree(jobs);
        return false;
    }
    ReturnSetInfo* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
    for (int i = 0; i < n; ++i) {
        const direct::Claimed& j = jobs[i];
        note_claim(j.job_id, j.fence, call.worker.cstr);
        Datum values[6] = {Int64GetDatum(j.job_id),
                           Int64GetDatum(j.fence),
                           Int32GetDatum(j.attempts),
                           Int32GetDatum(j.cap),
                           j.payload,
                           TimestampTzGetDatum(j.lease_expires_at)};
        bool nulls[6] = {false, false, false, j.no_cap, j.payload == (Datum) 0, false};
        tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
    }
    pfree(jobs);
    return true;
}

// claim_job and complete_and_claim: the batch claim's arguments (queue, worker, batch, lease at
// arguments first..first+3), read before anything runs.
ClaimCall read_claim(FunctionCallInfo fcinfo, int first, TimestampTz now)
{
    ClaimCall c = {};
    c.queue = arg_queue(fcinfo, first);
    c.worker = arg_worker(fcinfo, first + 1);
    c.batch = arg_count(fcinfo, first + 2, "batch", core::kMaxBatch);
    c.lease = arg_span(fcinfo, first + 3, "lease", false, true, &c.no_lease);
    c.now = now;
    c.uncounted = uncounted_rolled_back_jobs();
    return c;
}

// The batch claim with the SQL statements, inside the open SPI connection: notes the claimed
// jobs (housekeeping/rollbacks.hpp), returns them in claim order and closes the connection.
Datum claim_with_statements(FunctionCallInfo fcinfo, Access& access, const char* function,
                            const ClaimCall& c)
{
    Room room;
    uint64 rows = claim_from_queue(access, function, c, &room);
    note_claims(rows, c.worker.cstr);
    return_claimed(fcinfo, rows);
    charge_room(room, c.queue.datum, rows);
    spi_close(access);
    return (Datum) 0;
}

// The batch claim on the direct path, or else with the SQL statements.
Datum claim_and_return(FunctionCallInfo fcinfo, Access& access, const char* function,
                       const ClaimCall& c)
{
    if (claim_directly(fcinfo, access, function, c))
        return (Datum) 0;
    spi_open(access);
    return claim_with_statements(fcinfo, access, function, c);
}

}  // namespace
}  // namespace jobcap

using namespace jobcap;

JOBCAP_FUNCTION(claim_job, Duty::worker)
{
    ClaimCall c = read_claim(fcinfo, 0, GetCurrentTimestamp());
    refuse_claim_in_subtransaction(function);
    InitMaterializedSRF(fcinfo, 0);
    reserve_claims(c.batch);
    return claim_and_return(fcinfo, access, function, c);
}

// One commit per job instead of two: the previous job's completion (the same compare-and-swap
// as complete_job) and the next claim run in the caller's one transaction. A stale fence raises
// JC001 before anything is claimed. output is kept with the completed job as complete_job keeps
// it.
JOBCAP_FUNCTION(complete_and_claim, Duty::worker)
{
    CompleteCall done = {};
    done.job.job_id = arg_job_id(fcinfo, 0);
    done.job.fence = arg_fence(fcinfo, 1);
    done.job.now = GetCurrentTimestamp();
    ClaimCall c = read_claim(fcinfo, 2, done.job.now);
    refuse_claim_in_subtransaction(function);
    InitMaterializedSRF(fcinfo, 0);

    // compat(0.1.0): the 0.1.0 declaration (six arguments) runs on the 0.1.0 schema, which has
    // no output column yet.
    bool schema_0_1 = PG_NARGS() < 7;
    done.no_output = schema_0_1 || PG_ARGISNULL(6);
    done.output = done.no_output ? (Datum) 0 : kept_output(PG_GETARG_DATUM(6));
    reserve_claims(c.batch);
    bool dependents = false;
    if (!schema_0_1 &&
        served_directly(access, function, direct::Need::update, [&](FencedCall* stale) {
            *stale = done.job;
            return direct::complete(access, done, &dependents);
        })) {
        release_after_direct(access, &done.job.job_id, dependents ? 1 : 0, done.job.now);
        return claim_and_return(fcinfo, access, function, c);
    }
    spi_open(access);
    complete_with_statements(access, function, done, schema_0_1);
    return claim_with_statements(fcinfo, access, function, c);
}

JOBCAP_FUNCTION(claim_job_by_id, Duty::worker)
{
    int64 job_id = arg_job_id(fcinfo, 0);
    NameArg worker = arg_worker(fcinfo, 1);
    bool no_lease = false;
    Datum lease = arg_span(fcinfo, 2, "lease", false, true, &no_lease);
    refuse_claim_in_subtransaction(function);
    InitMaterializedSRF(fcinfo, 0);

    Datum uncounted = uncounted_rolled_back_jobs();
    auto params_at = [&](TimestampTz now) {
        Params p;
        p.add(TimestampTzGetDatum(now)).add(worker.datum).add(lease, no_lease);
        p.add(Int64GetDatum(job_id)).add_caller(access).add(uncounted);
        return p;
    };
    Params p = params_at(GetCurrentTimestamp());
    reserve_claims(1);
    spi_open(access);
    // compat(0.1.0): the 0.1.0 schema's claim, without queue controls.
    bool controls = queues_paused_column_exists();
    // compat(0.2.0): the 0.2.0 schema's claims, without start_by and rate limits.
    bool deadlines = workflows_schema_exists();
    bool flow = flow_schema_exists();
    Statement& open_claim =
        deadlines && flow ? statements::claim_job_by_id : statements::claim_job_by_id_0_2;
    Statement& capped_claim =
        deadlines ? statements::claim_job_by_id_capped : statements::claim_job_by_id_capped_0_2;
    uint64 rows = execute(controls ? open_claim : statements::claim_job_by_id_0_1, p,
                          SPI_OK_UPDATE_RETURNING);
    Room room = {};
    Datum queue = (Datum) 0;
    if (rows == 0 && !controls) {
        check_job(access, function, job_id);
    } else if (rows == 0) {
        check_job(access, function, job_id);
        // Not claimed: not claimable, its queue paused, or its queue capped (then try again
        // under the queue's row lock when there is room).
        Params id;
        id.add(Int64GetDatum(job_id));
        if (execute(flow ? statements::job_queue_controls : statements::job_queue_controls_0_2, id,
                    SPI_OK_SELECT) > 0) {
            bool uncapped = false;
            queue = result_column(0, 1);
            result_column(0, 3, &uncapped);
            if (!DatumGetBool(result_column(0, 2)) && !uncapped) {
                room = capped_room(queue, flow);
                Params capped = params_at(room.now);
                if (room.room != 0 && room.keyed) {
                    add_key_room(capped, room);
                    rows =
                        execute(statements::claim_job_by_id_keyed, capped, SPI_OK_UPDATE_RETURNING);
                } else if (room.room != 0) {
                    rows = execute(room.room < 0 ? open_claim : capped_claim, capped,
                                   SPI_OK_UPDATE_RETURNING);
                }
            }
        }
    }
    note_claims(rows, worker.cstr);
    return_claimed(fcinfo, rows);
    charge_room(room, queue, rows);
    spi_close(access);
    return (Datum) 0;
}
