// create_queue, alter_queue, drop_queue, pause_queue, resume_queue.
#include "spi/access.hpp"
#include "spi/args.hpp"
#include "boundary.hpp"
#include "spi/errors.hpp"
#include "jobcap.hpp"
#include "spi/plans.hpp"
#include "spi/queue_lock.hpp"
#include "spi/rates.hpp"
#include "spi/schema.hpp"
#include "housekeeping/workflows.hpp"
#include "core/flow.hpp"

namespace jobcap {
namespace {

// $7 = max_running: NULL or 0 for no limit. $8 = max_snoozes, $9 = max_run_time (NULL or 0: no
// limit). $10 = rate_limit (NULL or 0: no limit), $11 = rate_period. $12 = max_running_per_key
// (NULL or 0: no limit), $13 = fairness.
JOBCAP_STATEMENT(
    insert_queue,
    "INSERT INTO jobcap.queues (queue, max_attempts, lease, backoff_base, backoff_max, notify,"
    "   max_running, max_snoozes, max_run_time, rate_limit, rate_period, max_running_per_key,"
    "   fairness)"
    " VALUES ($1, $2, $3, $4, $5, $6, nullif($7, 0), $8, nullif($9, interval '0'),"
    "   nullif($10, 0), $11, nullif($12, 0), $13)"
    " ON CONFLICT (queue) DO NOTHING",
    {TEXTOID, INT4OID, INTERVALOID, INTERVALOID, INTERVALOID, BOOLOID, INT4OID, INT4OID,
     INTERVALOID, INT4OID, INTERVALOID, INT4OID, TEXTOID});

// compat(0.2.0): the same on the 0.2.0 schema (no max_snoozes, max_run_time), for its
// seven-argument declarations.
JOBCAP_STATEMENT(
    insert_queue_0_2,
    "INSERT INTO jobcap.queues (queue, max_attempts, lease, backoff_base, backoff_max, notify,"
    "   max_running)"
    " VALUES ($1, $2, $3, $4, $5, $6, nullif($7, 0)) ON CONFLICT (queue) DO NOTHING",
    {TEXTOID, INT4OID, INTERVALOID, INTERVALOID, INTERVALOID, BOOLOID, INT4OID});

// compat(0.1.0): the same on the 0.1.0 schema (no max_running), for its six-argument
// declarations.
JOBCAP_STATEMENT(
    insert_queue_0_1,
    "INSERT INTO jobcap.queues (queue, max_attempts, lease, backoff_base, backoff_max, notify)"
    " VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (queue) DO NOTHING",
    {TEXTOID, INT4OID, INTERVALOID, INTERVALOID, INTERVALOID, BOOLOID});

// alter_queue checks the merged backoff settings under this row lock, then writes them.
JOBCAP_STATEMENT(lock_queue,
                 "SELECT backoff_base, backoff_max FROM jobcap.queues WHERE queue = $1 FOR UPDATE",
                 {TEXTOID});

// A lower max_attempts binds every job of the queue at once and ends the budgets requeue_job
// granted before it: cap_epoch counts the lowerings (src/spi/cap.hpp).
#define UPDATE_QUEUE(WORKFLOW_SET)                                                                 \
    "UPDATE jobcap.queues SET max_attempts = coalesce($2, max_attempts),"                          \
    " cap_epoch = cap_epoch + (coalesce($2, max_attempts) < max_attempts)::int,"                   \
    " lease = coalesce($3, lease), backoff_base = coalesce($4, backoff_base),"                     \
    " backoff_max = coalesce($5, backoff_max), notify = coalesce($6, notify),"                     \
    " max_running = CASE WHEN $7 IS NULL THEN max_running ELSE nullif($7, 0) END" WORKFLOW_SET     \
    " WHERE queue = $1"

// $8 = max_snoozes, $9 = max_run_time (0: no limit), $10 = rate_limit (0: no limit),
// $11 = rate_period, $12 = max_running_per_key (0: no limit), $13 = fairness; NULL keeps any.
JOBCAP_STATEMENT(update_queue,
                 UPDATE_QUEUE(", max_snoozes = coalesce($8, max_snoozes),"
                              " max_run_time = CASE WHEN $9 IS NULL THEN max_run_time"
                              "   ELSE nullif($9, interval '0') END,"
                              " rate_limit = CASE WHEN $10 IS NULL THEN rate_limit"
                              "   ELSE nullif($10, 0) END,"
                              " rate_period = coalesce($11, rate_period),"
                              " max_running_per_key = CASE WHEN $12 IS NULL"
                              "   THEN max_running_per_key ELSE nullif($12, 0) END,"
                              " fairness = coalesce($13, fairness)"),
                 {TEXTOID, INT4OID, INTERVALOID, INTERVALOID, INTERVALOID, BOOLOID, INT4OID,
                  INT4OID, INTERVALOID, INT4OID, INTERVALOID, INT4OID, TEXTOID});

// compat(0.2.0): update_queue's.
JOBCAP_STATEMENT(update_queue_0_2, UPDATE_QUEUE(""),
                 {TEXTOID, INT4OID, INTERVALOID, INTERVALOID, INTERVALOID, BOOLOID, INT4OID});

// compat(0.1.0): update_queue's.
JOBCAP_STATEMENT(update_queue_0_1,
                 "UPDATE jobcap.queues SET max_attempts = coalesce($2, max_attempts),"
                 " lease = coalesce($3, lease), backoff_base = coalesce($4, backoff_base),"
                 " backoff_max = coalesce($5, backoff_max), notify = coalesce($6, notify)"
                 " WHERE queue = $1",
                 {TEXTOID, INT4OID, INTERVALOID, INTERVALOID, INTERVALOID, BOOLOID});

// pause_queue and resume_queue: the flag as it was, under the row lock (a capped queue's claim
// in flight holds it, or its claim turn: the change waits for that claim to commit).
JOBCAP_STATEMENT(lock_paused, "SELECT paused FROM jobcap.queues WHERE queue = $1 FOR NO KEY UPDATE",
                 {TEXTOID});

JOBCAP_STATEMENT(set_paused, "UPDATE jobcap.queues SET paused = $2 WHERE queue = $1",
                 {TEXTOID, BOOLOID});

// drop_queue locks only what belongs to the queue, in this order, each to commit: the queue row
// (an alter_queue or another drop of it waits), every job of the queue (settles, claims and
// requeues of those jobs wait or skip them; a worker holding assert_fence's lock on one is
// waited for here, before the queue lock, so its own enqueue into the queue cannot deadlock
// with the drop), then the queue lock (queue_lock.hpp: waits for transactions that inserted
// jobs into it; later inserts wait for the drop and then find no queue), then the jobs again,
// with a snapshot taken after the queue lock: those inserted in between. After that no job of
// the queue can appear or change, so the check and the deletes see every job there will be.
// Claims, enqueues and settles on other queues never wait for a drop.
JOBCAP_STATEMENT(lock_queue_row, "SELECT FROM jobcap.queues WHERE queue = $1 FOR UPDATE",
                 {TEXTOID});

JOBCAP_STATEMENT(lock_queue_jobs,
                 "SELECT count(*) FILTER (WHERE state IN ('pending', 'running')) > 0"
                 "  FROM (SELECT state FROM jobcap.jobs WHERE queue = $1 FOR UPDATE) j",
                 {TEXTOID});

// On the 0.3.0 schema the queue's jobs' edges go with them, and the jobs of other queues that
// waited for one of them are cancelled (cancel_dependents, with the ids this returns).
JOBCAP_STATEMENT(delete_queue,
                 "WITH jobs AS (DELETE FROM jobcap.jobs WHERE queue = $1"
                 "   RETURNING job_id, waiting_on IS NOT NULL AS dependent, has_dependents),"
                 " history AS (DELETE FROM jobcap.job_errors WHERE queue = $1),"
                 " edges AS (DELETE FROM jobcap.job_dependencies d"
                 "   WHERE d.job_id = ANY (ARRAY(SELECT job_id FROM jobs WHERE dependent))),"
                 " rates AS (DELETE FROM jobcap.queue_rates WHERE queue = $1),"
                 " turns AS (DELETE FROM jobcap.queue_turns WHERE queue = $1),"
                 " queue AS (DELETE FROM jobcap.queues WHERE queue = $1)"
                 " SELECT coalesce(array_agg(job_id) FILTER (WHERE has_dependents), '{}')"
                 "   FROM jobs",
                 {TEXTOID});

// compat(0.2.0): the 0.2.0 schema's, which has no edges.
JOBCAP_STATEMENT(delete_queue_0_2,
                 "WITH jobs AS (DELETE FROM jobcap.jobs WHERE queue = $1),"
                 " history AS (DELETE FROM jobcap.job_errors WHERE queue = $1)"
                 " DELETE FROM jobcap.queues WHERE queue = $1",
                 {TEXTOID});

// The queue (argument 0) and the six settings shared by create_queue and alter_queue
// (arguments 1..6), each optional (no_*: NULL, alter_queue keeps the current value).
struct QueueSettings {
    NameArg queue;
    int32 max_attempts;
    bool no_max_attempts;
    Datum lease, backoff_base, backoff_max, notify;
    bool no_lease, no_backoff_base, no_backoff_max, no_notify;
    bool has_max_running;  // compat(0.1.0): the 0.1.0 declarations have no max_running
    int32 max_running;     // 0: no limit
    bool no_max_running;
    bool has_workflow;  // compat(0.2.0): the 0.2.0 declarations have neither of these two
    int32 max_snoozes;
    bool no_max_snoozes;
    Datum max_run_time;  // a zero interval: no limit
    bool no_max_run_time;
    int32 rate_limit;  // 0: no limit
    bool no_rate_limit;
    Datum rate_period;
    bool no_rate_period;
    int32 max_running_per_key;  // 0: no limit
    bool no_max_running_per_key;
    Datum fairness;  // 'fifo' or 'round_robin'
    bool no_fairness;
};

// The positions of max_snoozes and max_run_time in create_queue and alter_queue, after the
// 0.2.0 parameters (docs/workflows.md).
constexpr int kQueueWorkflow = 7;
// The positions of rate_limit and rate_period, after the workflow parameters
// (docs/flow_control.md). The 0.3.0 declarations have all four.
constexpr int kQueueFlow = kQueueWorkflow + 2;
// The positions of max_running_per_key and fairness, after rate_limit and rate_period
// (docs/flow_control.md). The 0.3.0 declarations have all six.
constexpr int kQueueKeys = kQueueFlow + 2;

// With `required`, every setting but the cap must be given (create_queue's defaults are in its
// signature) and a missing cap is jobcap.default_max_attempts.
QueueSettings read_queue_settings(FunctionCallInfo fcinfo, bool required)
{
    QueueSettings q = {};
    q.queue = arg_queue(fcinfo, 0);
    q.max_attempts = guc_default_max_attempts;
    q.no_max_attempts =
        !arg_count_opt(fcinfo, 1, "max_attempts", core::kMaxAttempts, &q.max_attempts) && !required;
    auto check_given = [&](const char* what, bool is_null) {
        if (is_null && required)
            raise_problem(core::check_not_null(what, true));
    };
    q.lease = arg_span(fcinfo, 2, "lease", false, true, &q.no_lease);
    check_given("lease", q.no_lease);
    q.backoff_base = arg_span(fcinfo, 3, "backoff_base", true, true, &q.no_backoff_base);
    check_given("backoff_base", q.no_backoff_base);
    q.backoff_max = arg_span(fcinfo, 4, "backoff_max", true, true, &q.no_backoff_max);
    check_given("backoff_max", q.no_backoff_max);
    q.no_notify = PG_ARGISNULL(5);
    q.notify = q.no_notify ? (Datum) 0 : PG_GETARG_DATUM(5);
    check_given("notify", q.no_notify);
    // compat(0.1.0): max_running is new in 0.2.0; the 0.1.0 declarations pass six arguments
    // and run on the 0.1.0 schema (insert_queue_0_1, update_queue_0_1).
    q.has_max_running = PG_NARGS() >= 7;
    if (!q.has_max_running)
        return q;
    q.no_max_running = PG_ARGISNULL(6);
    q.max_running = q.no_max_running ? 0 : PG_GETARG_INT32(6);
    if (q.max_running < 0 || q.max_running > core::kMaxRunning)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("max_running must be between 0 and %d, not %d",
                               static_cast<int>(core::kMaxRunning), q.max_running),
                        errhint("0 (or NULL when creating the queue) means no limit.")));
    // compat(0.2.0): max_snoozes, max_run_time, rate_limit and rate_period are new in 0.3.0; the
    // 0.2.0 declarations pass seven arguments and run on the 0.2.0 schema (insert_queue_0_2,
    // update_queue_0_2); the 0.3.0 ones pass all thirteen (with max_running_per_key and
    // fairness).
    q.has_workflow = PG_NARGS() >= kQueueKeys + 2;
    if (!q.has_workflow)
        return q;
    q.no_max_snoozes = PG_ARGISNULL(kQueueWorkflow);
    check_given("max_snoozes", q.no_max_snoozes);
    q.max_snoozes = q.no_max_snoozes ? 0 : PG_GETARG_INT32(kQueueWorkflow);
    if (q.max_snoozes < 0 || q.max_snoozes > core::kMaxSnoozes)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("max_snoozes must be between 0 and %d, not %d",
                               static_cast<int>(core::kMaxSnoozes), q.max_snoozes),
                        errhint("0 makes every snooze count as an attempt.")));
    q.max_run_time =
        arg_span(fcinfo, kQueueWorkflow + 1, "max_run_time", true, true, &q.no_max_run_time);
    q.no_rate_limit = PG_ARGISNULL(kQueueFlow);
    q.rate_limit = q.no_rate_limit ? 0 : PG_GETARG_INT32(kQueueFlow);
    if (q.rate_limit < 0 || q.rate_limit > core::kMaxRateLimit)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("rate_limit must be between 0 and %d, not %d",
                               static_cast<int>(core::kMaxRateLimit), q.rate_limit),
                        errhint("0 (or NULL when creating the queue) means no limit.")));
    q.rate_period = arg_span(fcinfo, kQueueFlow + 1, "rate_period", false, true, &q.no_rate_period);
    check_given("rate_period", q.no_rate_period);
    q.no_max_running_per_key = PG_ARGISNULL(kQueueKeys);
    q.max_running_per_key = q.no_max_running_per_key ? 0 : PG_GETARG_INT32(kQueueKeys);
    if (q.max_running_per_key < 0 || q.max_running_per_key > core::kMaxRunning)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("max_running_per_key must be between 0 and %d, not %d",
                               static_cast<int>(core::kMaxRunning), q.max_running_per_key),
                        errhint("0 (or NULL when creating the queue) means no limit.")));
    q.no_fairness = PG_ARGISNULL(kQueueKeys + 1);
    check_given("fairness", q.no_fairness);
    if (!q.no_fairness) {
        q.fairness = PG_GETARG_DATUM(kQueueKeys + 1);
        char* f = TextDatumGetCString(q.fairness);
        if (strcmp(f, "fifo") != 0 && strcmp(f, "round_robin") != 0)
            ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                            errmsg("fairness must be 'fifo' or 'round_robin', not \"%s\"", f),
                            errdetail("'fifo' hands due jobs out by priority, run_at and id; "
                                      "'round_robin' takes concurrency keys in turn first.")));
    }
    return q;
}

// The parameters of insert_queue and update_queue (and of their 0.1.0 variants), in order.
Params queue_settings_params(const QueueSettings& q)
{
    Params p;
    p.add(q.queue.datum).add(Int32GetDatum(q.max_attempts), q.no_max_attempts);
    p.add(q.lease, q.no_lease).add(q.backoff_base, q.no_backoff_base);
    p.add(q.backoff_max, q.no_backoff_max).add(q.notify, q.no_notify);
    if (q.has_max_running)
        p.add(Int32GetDatum(q.max_running), q.no_max_running);
    if (q.has_workflow) {
        p.add(Int32GetDatum(q.max_snoozes), q.no_max_snoozes);
        p.add(q.max_run_time, q.no_max_run_time);
        p.add(Int32GetDatum(q.rate_limit), q.no_rate_limit);
        p.add(q.rate_period, q.no_rate_period);
        p.add(Int32GetDatum(q.max_running_per_key), q.no_max_running_per_key);
        p.add(q.fairness, q.no_fairness);
    }
    return p;
}

// pause_queue and resume_queue: sets the flag; false when it was set already.
bool set_queue_paused(Access& access, NameArg queue, bool paused)
{
    Params p;
    p.add(queue.datum).add(BoolGetDatum(paused));
    Params q;
    q.add(queue.datum);
    spi_open(access);
    take_exclusive_claim_turn(queue.datum);
    if (execute(lock_paused, q, SPI_OK_SELECT) == 0)
        raise_unknown_queue(queue.cstr);
    bool changed = DatumGetBool(result_column(0, 1)) != paused;
    if (changed)
        execute(set_paused, p, SPI_OK_UPDATE);
    spi_close(access);
    return changed;
}

void check_backoff(Datum base, Datum max)
{
    core::Problem p = core::check_backoff_order(span_of(DatumGetIntervalP(base)),
                                                span_of(DatumGetIntervalP(max)));
    if (p)
        raise_problem(p);
}

}  // namespace
}  // namespace jobcap

using namespace jobcap;

JOBCAP_FUNCTION(create_queue, Duty::operator_)
{
    QueueSettings q = read_queue_settings(fcinfo, true);
    check_backoff(q.backoff_base, q.backoff_max);

    spi_open(access);
    lock_queue_for_create(q.queue.datum);
    // compat(0.1.0): the 0.1.0 declaration's insert, without max_running. compat(0.2.0): the
    // 0.2.0 declaration's, without max_snoozes and max_run_time.
    Statement& insert = q.has_workflow      ? insert_queue
                        : q.has_max_running ? insert_queue_0_2
                                            : insert_queue_0_1;
    if (execute(insert, queue_settings_params(q), SPI_OK_INSERT) == 0)
        ereport(ERROR, (errcode(ERRCODE_DUPLICATE_OBJECT),
                        errmsg("queue \"%s\" already exists", q.queue.cstr),
                        errhint("Change its settings with jobcap.alter_queue.")));
    spi_close(access);
    PG_RETURN_VOID();
}

JOBCAP_FUNCTION(alter_queue, Duty::operator_)
{
    QueueSettings q = read_queue_settings(fcinfo, false);
    Params lock;
    lock.add(q.queue.datum);

    spi_open(access);
    take_exclusive_claim_turn(q.queue.datum);
    if (execute(lock_queue, lock, SPI_OK_SELECT) == 0)
        raise_unknown_queue(q.queue.cstr);
    check_backoff(q.no_backoff_base ? result_column(0, 1) : q.backoff_base,
                  q.no_backoff_max ? result_column(0, 2) : q.backoff_max);
    // compat(0.1.0): the 0.1.0 declaration's update, without max_running. compat(0.2.0): the
    // 0.2.0 declaration's, without max_snoozes and max_run_time.
    Statement& update = q.has_workflow      ? update_queue
                        : q.has_max_running ? update_queue_0_2
                                            : update_queue_0_1;
    execute(update, queue_settings_params(q), SPI_OK_UPDATE);
    if (q.has_workflow && !q.no_rate_period)
        fold_rate_window(q.queue.datum, core::rate_slot_us(rate_period_usec(q.rate_period)),
                         GetCurrentTimestamp());
    spi_close(access);
    PG_RETURN_VOID();
}

JOBCAP_FUNCTION(drop_queue, Duty::operator_)
{
    NameArg queue = arg_queue(fcinfo, 0);
    bool force = DatumGetBool(arg_required(fcinfo, 1, "force"));
    if (IsolationUsesXactSnapshot())
        ereport(
            ERROR,
            (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
             errmsg("cannot drop a queue in a REPEATABLE READ or SERIALIZABLE transaction"),
             errdetail("Jobs enqueued after this transaction's snapshot would survive the queue."),
             errhint("Run jobcap.drop_queue at READ COMMITTED.")));
    Params p;
    p.add(queue.datum);

    spi_open(access);
    if (execute(lock_queue_row, p, SPI_OK_SELECT) == 0)
        raise_unknown_queue(queue.cstr);
    execute(lock_queue_jobs, p, SPI_OK_SELECT);
    lock_queue_for_drop(queue.datum);
    execute(lock_queue_jobs, p, SPI_OK_SELECT);
    if (DatumGetBool(result_column(0, 1)) && !force)
        ereport(
            ERROR,
            (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
             errmsg("queue \"%s\" has pending or running jobs", queue.cstr),
             errhint(
                 "Wait for them to finish, cancel them, or drop the queue with force => true.")));
    // compat(0.2.0): the 0.2.0 schema's, without edges.
    if (!workflows_schema_exists()) {
        execute(delete_queue_0_2, p, SPI_OK_DELETE);
    } else {
        execute(delete_queue, p, SPI_OK_SELECT);
        ArrayType* a = DatumGetArrayTypePCopy(result_column(0, 1));
        cancel_dependents(reinterpret_cast<int64*>(ARR_DATA_PTR(a)),
                          ArrayGetNItems(ARR_NDIM(a), ARR_DIMS(a)), GetCurrentTimestamp());
    }
    spi_close(access);
    PG_RETURN_VOID();
}

// A paused queue hands out nothing (every claim reads the flag in the statement that claims);
// running jobs settle normally and enqueue still works.
JOBCAP_FUNCTION(pause_queue, Duty::operator_)
{
    NameArg queue = arg_queue(fcinfo, 0);
    PG_RETURN_BOOL(set_queue_paused(access, queue, true));
}

JOBCAP_FUNCTION(resume_queue, Duty::operator_)
{
    NameArg queue = arg_queue(fcinfo, 0);
    PG_RETURN_BOOL(set_queue_paused(access, queue, false));
}
