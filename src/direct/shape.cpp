// The direct path's knowledge of jobcap's tables (shape.hpp): learnt under the tables' locks on
// first use, vetted (vet.hpp), kept per backend and forgotten when the relcache entry of one of
// them is invalidated; and usable(), which decides per call whether the direct path serves it.
#include "direct/shape.hpp"

#include "direct/rows.hpp"
#include "direct/vet.hpp"
#include "jobcap.hpp"
#include "spi/citus.hpp"

namespace jobcap::direct {

Shape shape;
MemoryContext shape_context = nullptr;
uint64 invalidations = 0;

namespace {

// The names of the columns of shape.hpp's enums.
const char* const kJobColumnNames[kJobColumns] = {
    "job_id",       "queue",       "state",   "priority",         "run_at", "attempts",
    "max_attempts", "fence",       "lease",   "lease_expires_at", "worker", "first_claimed_at",
    "claimed_at",   "finished_at", "payload", "cap_epoch",        "output", "dedupe_key",
    "enqueued_at"};
// Their types: the direct path writes Datums of exactly these (state: jobcap.job_state, checked
// by its labels). A column a DBA changed sends every call to the SQL path.
const Oid kJobColumnTypes[kJobColumns] = {
    INT8OID,  TEXTOID,     InvalidOid,     INT4OID, TIMESTAMPTZOID, INT4OID,        INT4OID,
    INT8OID,  INTERVALOID, TIMESTAMPTZOID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID,
    JSONBOID, INT8OID,     JSONBOID,       TEXTOID, TIMESTAMPTZOID};
const char* const kQueueColumnNames[kQueueColumns] = {"queue",  "max_attempts", "lease",
                                                      "paused", "max_running",  "cap_epoch",
                                                      "notify", "backoff_base", "backoff_max"};
const Oid kQueueColumnTypes[kQueueColumns] = {TEXTOID, INT4OID, INTERVALOID, BOOLOID,    INT4OID,
                                              INT8OID, BOOLOID, INTERVALOID, INTERVALOID};
// jobcap.job_errors, the history fail_job and crash_job add to (and prune).
const char* const kErrorColumnNames[kErrorColumns] = {"seq",  "job_id", "queue", "attempt", "fence",
                                                      "kind", "worker", "error", "at"};
const Oid kErrorColumnTypes[kErrorColumns] = {INT8OID, INT8OID, TEXTOID, INT4OID,       INT8OID,
                                              TEXTOID, TEXTOID, TEXTOID, TIMESTAMPTZOID};

bool callback_registered = false;

// The relcache callback: a change to one of the tables or to an index the shape names (REINDEX
// CONCURRENTLY swaps an index for a new one of the same name and drops the old one; the
// invalidations it sends name the indexes) or to jobs' indexes forgets the shape.
void forget_shape(Datum, Oid relid)
{
    bool ours = relid == InvalidOid || relid == shape.jobs || relid == shape.queues ||
                relid == shape.grants || relid == shape.errors || relid == shape.jobs_pkey ||
                relid == shape.jobs_claim || relid == shape.jobs_running ||
                relid == shape.queues_pkey || relid == shape.grants_pkey ||
                relid == shape.errors_by_job || relid == shape.rates || relid == shape.rates_pkey ||
                relid == shape.turns || relid == shape.turns_pkey || indexes_include(relid);
    if (ours) {
        shape.known = false;
        forget_indexes();
        ++invalidations;
    }
}

// For enqueueing: the INSERT of the SQL path lists queue, payload, run_at, priority,
// max_attempts and enqueued_at (and dedupe_key, for enqueue_job); job_id must be an identity
// column.
bool learn_job_defaults(Relation jobs, Shape& s)
{
    s.identity = identity_of(jobs, s.job[kJobId]);
    if (!OidIsValid(s.identity))
        return false;
    // compat(0.2.0): start_by and max_run_time are listed on the 0.3.0 schema (InvalidAttrNumber,
    // which matches no column, on the 0.2.0 one).
    const AttrNumber listed[] = {s.job[kJobId],      s.job[kQueue],    s.job[kPayload],
                                 s.job[kRunAt],      s.job[kPriority], s.job[kMaxAttempts],
                                 s.job[kEnqueuedAt], s.start_by,       s.max_run_time,
                                 s.concurrency_key};
    TupleDesc desc = RelationGetDescr(jobs);
    // enqueue_job lists dedupe_key (NULL without a key) and max_attempts (NULL: the queue's).
    return learn_defaults(jobs, listed, lengthof(listed), &s.defaults, &s.default_nulls) &&
           may_hold(TupleDescAttr(desc, s.job[kDedupeKey] - 1), true) &&
           may_hold(TupleDescAttr(desc, s.job[kMaxAttempts] - 1), true) &&
           (s.start_by == InvalidAttrNumber ||
            may_hold(TupleDescAttr(desc, s.start_by - 1), true)) &&
           (s.max_run_time == InvalidAttrNumber ||
            may_hold(TupleDescAttr(desc, s.max_run_time - 1), true)) &&
           (s.concurrency_key == InvalidAttrNumber ||
            may_hold(TupleDescAttr(desc, s.concurrency_key - 1), true));
}

// For failing: job_errors as the history statements write it (see Shape::failable).
bool learn_errors(Shape& s)
{
    s.errors_by_job = get_relname_relid("job_errors_job", get_namespace_oid("jobcap", true));
    if (!OidIsValid(s.errors) || !OidIsValid(s.errors_by_job))
        return false;
    Relation errors = table_open(s.errors, AccessShareLock);
    TupleDesc desc = RelationGetDescr(errors);
    bool ok = errors->trigdesc == nullptr && !errors->rd_rel->relrowsecurity &&
              errors->rd_rules == nullptr && errors->rd_rel->relkind == RELKIND_RELATION &&
              !errors->rd_rel->relispartition && !errors->rd_rel->relhassubclass &&
              errors->rd_rel->relam == HEAP_TABLE_AM_OID &&
              (desc->constr == nullptr || (!desc->constr->has_generated_stored &&
                                           !jobcap_has_generated_virtual(desc->constr)));
    for (int c = 0; ok && c < kErrorColumns; ++c) {
        s.error[c] = column(desc, kErrorColumnNames[c], kErrorColumnTypes[c]);
        ok = s.error[c] != InvalidAttrNumber;
        if (ok) {
            Form_pg_attribute a = TupleDescAttr(desc, s.error[c] - 1);
            ok = a->atttypmod == -1 &&
                 (!OidIsValid(a->attcollation) || a->attcollation == DEFAULT_COLLATION_OID);
        }
    }
    for (int i = 0; ok && desc->constr != nullptr && i < desc->constr->num_check; ++i)
        ok = !not_plain(static_cast<Node*>(stringToNode(desc->constr->check[i].ccbin)), nullptr);
    if (ok) {
        List* oids = RelationGetIndexList(errors);
        ListCell* lc;
        foreach (lc, oids) {
            Relation index = index_open(lfirst_oid(lc), AccessShareLock);
            ok = ok && plain_index(index, InvalidAttrNumber) && index->rd_index->indimmediate;
            index_close(index, AccessShareLock);
        }
        list_free(oids);
    }
    AttrNumber by_job[2] = {s.error[kEJobId], s.error[kESeq]};
    ok = ok && index_on(s.errors_by_job, s.errors, by_job, 2);
    s.errors_identity = ok ? identity_of(errors, s.error[kESeq]) : InvalidOid;
    ok = ok && OidIsValid(s.errors_identity) &&
         learn_defaults(errors, s.error, kErrorColumns, &s.error_defaults, &s.error_default_nulls);
    table_close(errors, AccessShareLock);
    return ok;
}

// Whether rel (queue_rates, queue_turns) may be written without the executor: nothing it would
// run, pkey its one index (and the replica identity), no column but the n NOT NULL ones of
// columns, of the database's collation where they have one.
bool written_plainly(Relation rel, Oid pkey, const AttrNumber* columns, int n)
{
    TupleDesc desc = RelationGetDescr(rel);
    List* indexes = RelationGetIndexList(rel);
    TupleConstr* constr = desc->constr;
    bool ok = rel->trigdesc == nullptr && !rel->rd_rel->relrowsecurity &&
              rel->rd_rules == nullptr && rel->rd_rel->relkind == RELKIND_RELATION &&
              !rel->rd_rel->relispartition && !rel->rd_rel->relhassubclass &&
              rel->rd_rel->relam == HEAP_TABLE_AM_OID &&
              rel->rd_rel->relreplident == REPLICA_IDENTITY_DEFAULT &&
              (constr == nullptr || (constr->num_check == 0 && !constr->has_generated_stored &&
                                     !jobcap_has_generated_virtual(constr))) &&
              list_length(indexes) == 1 && linitial_oid(indexes) == pkey;
    list_free(indexes);
    int live = 0;
    for (int a = 0; a < desc->natts; ++a)
        live += TupleDescAttr(desc, a)->attisdropped ? 0 : 1;
    ok = ok && live == n;
    for (int i = 0; ok && i < n; ++i) {
        ok = columns[i] != InvalidAttrNumber;
        if (ok) {
            Form_pg_attribute att = TupleDescAttr(desc, columns[i] - 1);
            ok = att->attnotnull && att->atttypmod == -1 &&
                 (!OidIsValid(att->attcollation) || att->attcollation == DEFAULT_COLLATION_OID);
        }
    }
    return ok;
}

// jobcap.queue_rates as the shared claims read and write it (s.rates invalid otherwise:
// compat(0.2.0), or a table changed by hand, whose rate-limited claims go to the SQL path).
void learn_rates(Shape& s, Oid nsp)
{
    s.rates = get_relname_relid("queue_rates", nsp);
    s.rates_pkey = get_relname_relid("queue_rates_pkey", nsp);
    if (!s.direct || !OidIsValid(s.rates) || !OidIsValid(s.rates_pkey)) {
        s.rates = InvalidOid;
        return;
    }
    Relation rates = table_open(s.rates, AccessShareLock);
    TupleDesc desc = RelationGetDescr(rates);
    s.rate_queue = column(desc, "queue", TEXTOID);
    s.rate_slot = column(desc, "slot", INT4OID);
    s.rate_slot_us = column(desc, "slot_us", INT8OID);
    s.rate_newest = column(desc, "newest", INT8OID);
    s.rate_counts = column(desc, "counts", INT4ARRAYOID);
    // Written without the executor (direct/rates.cpp).
    const AttrNumber columns[] = {s.rate_queue, s.rate_slot, s.rate_slot_us, s.rate_newest,
                                  s.rate_counts};
    bool ok = written_plainly(rates, s.rates_pkey, columns, lengthof(columns));
    table_close(rates, AccessShareLock);
    AttrNumber key[2] = {s.rate_queue, s.rate_slot};
    if (!ok || !index_on(s.rates_pkey, s.rates, key, 2))
        s.rates = InvalidOid;
}

// jobs_keys and jobcap.queue_turns as a round-robin claim of one job reads and writes them
// (turns.cpp; s.turns invalid otherwise: compat(0.2.0), or changed by hand).
void learn_turns(Shape& s, Oid nsp)
{
    s.jobs_keys = get_relname_relid("jobs_keys", nsp);
    s.turns = get_relname_relid("queue_turns", nsp);
    s.turns_pkey = get_relname_relid("queue_turns_pkey", nsp);
    // The claim index's shape with the key after the queue's hash, and only jobs with a key.
    AttrNumber keys[5] = {0, s.concurrency_key, s.job[kPriority], s.job[kRunAt], s.job[kJobId]};
    if (!s.direct || s.concurrency_key == InvalidAttrNumber || !OidIsValid(s.jobs_keys) ||
        !OidIsValid(s.turns) || !OidIsValid(s.turns_pkey) ||
        !index_on(s.jobs_keys, s.jobs, keys, 5, s.job[kState], s.pending, s.job[kQueue],
                  s.concurrency_key)) {
        s.turns = InvalidOid;
        return;
    }
    // The statement orders keys under the column's collation, the walk under the index's:
    // both must be the database's.
    Oid type = InvalidOid, collation = InvalidOid;
    int32 typmod = -1;
    get_atttypetypmodcoll(s.jobs, s.concurrency_key, &type, &typmod, &collation);
    if (collation != DEFAULT_COLLATION_OID) {
        s.turns = InvalidOid;
        return;
    }
    Relation turns = table_open(s.turns, AccessShareLock);
    TupleDesc desc = RelationGetDescr(turns);
    s.turn_queue = column(desc, "queue", TEXTOID);
    s.turn_last_key = column(desc, "last_key", TEXTOID);
    const AttrNumber columns[] = {s.turn_queue, s.turn_last_key};
    bool ok = written_plainly(turns, s.turns_pkey, columns, lengthof(columns));
    table_close(turns, AccessShareLock);
    AttrNumber key[1] = {s.turn_queue};
    if (!ok || !index_on(s.turns_pkey, s.turns, key, 1))
        s.turns = InvalidOid;
}

// Learns the shape; returns false when jobcap's tables are not there (nothing is kept then).
bool learn_shape()
{
    Shape s = {};
    if (shape_context == nullptr)
        shape_context = AllocSetContextCreate(CacheMemoryContext, "jobcap direct path shape",
                                              ALLOCSET_SMALL_SIZES);
    else
        MemoryContextReset(shape_context);
    shape.defaults = nullptr;  // in shape_context
    shape.default_nulls = nullptr;
    shape.error_defaults = nullptr;
    shape.error_default_nulls = nullptr;
    Oid nsp = get_namespace_oid("jobcap", true);
    if (!OidIsValid(nsp))
        return false;
    s.jobs = get_relname_relid("jobs", nsp);
    s.jobs_pkey = get_relname_relid("jobs_pkey", nsp);
    s.jobs_claim = get_relname_relid("jobs_claim", nsp);
    s.jobs_running = get_relname_relid("jobs_running", nsp);
    s.queues = get_relname_relid("queues", nsp);
    s.queues_pkey = get_relname_relid("queues_pkey", nsp);
    s.grants = get_relname_relid("queue_grants", nsp);
    s.grants_pkey = get_relname_relid("queue_grants_pkey", nsp);
    s.fences = get_relname_relid("fences", nsp);
    if (!OidIsValid(s.jobs) || !OidIsValid(s.queues) || !OidIsValid(s.grants) ||
        !OidIsValid(s.fences))
        return false;
    s.direct = OidIsValid(s.jobs_pkey) && OidIsValid(s.jobs_claim) && OidIsValid(s.queues_pkey) &&
               OidIsValid(s.grants_pkey);

    Relation jobs = table_open(s.jobs, AccessShareLock);
    TupleDesc desc = RelationGetDescr(jobs);
    for (int c = 0; c < kJobColumns; ++c) {
        s.job[c] = column(desc, kJobColumnNames[c], kJobColumnTypes[c]);
        s.direct = s.direct && s.job[c] != InvalidAttrNumber;
    }
    s.direct = s.direct && !executor_needed(jobs, s.job);
    // compat(0.2.0): the workflow columns, absent on the 0.2.0 schema.
    struct {
        AttrNumber* attr;
        const char* name;
        Oid type;
    } workflow[] = {{&s.has_dependents, "has_dependents", BOOLOID},
                    {&s.start_by, "start_by", TIMESTAMPTZOID},
                    {&s.max_run_time, "max_run_time", INTERVALOID},
                    {&s.concurrency_key, "concurrency_key", TEXTOID}};
    for (auto& w : workflow) {
        *w.attr = column(desc, w.name, w.type);
        if (*w.attr == InvalidAttrNumber && column(desc, w.name, InvalidOid) != InvalidAttrNumber)
            s.direct = false;  // there, of another type
        else if (*w.attr != InvalidAttrNumber)
            s.direct = s.direct && TupleDescAttr(desc, *w.attr - 1)->atttypmod == -1;
    }
    // Columns read as never NULL must be NOT NULL; none may carry a typmod (the direct path
    // stores values as they come, where the executor would coerce them) or compare under a
    // collation other than the database's (the SQL statements would use it).
    const JobColumn never_null[] = {kJobId, kQueue, kState, kRunAt, kAttempts, kFence, kPayload};
    for (JobColumn c : never_null)
        s.direct = s.direct && TupleDescAttr(desc, s.job[c] - 1)->attnotnull;
    for (int c = 0; s.direct && c < kJobColumns; ++c) {
        Form_pg_attribute a = TupleDescAttr(desc, s.job[c] - 1);
        s.direct = a->atttypmod == -1 &&
                   (!OidIsValid(a->attcollation) || a->attcollation == DEFAULT_COLLATION_OID);
    }
    if (s.direct) {
        List* oids = RelationGetIndexList(jobs);
        ListCell* lc;
        foreach (lc, oids) {
            Relation index = index_open(lfirst_oid(lc), AccessShareLock);
            s.direct = s.direct && plain_index(index, s.job[kQueue]);
            index_close(index, AccessShareLock);
        }
        list_free(oids);
    }
    if (s.direct) {
        Oid type = TupleDescAttr(desc, s.job[kState] - 1)->atttypid;
        s.pending = state_value(type, "pending");
        s.running = state_value(type, "running");
        s.succeeded = state_value(type, "succeeded");
        s.dead = state_value(type, "dead");
        s.direct = OidIsValid(s.pending) && OidIsValid(s.running) && OidIsValid(s.succeeded) &&
                   OidIsValid(s.dead);
    }
    s.insertable = s.direct ? Learnt::unknown : Learnt::no;
    table_close(jobs, AccessShareLock);

    Relation queues = table_open(s.queues, AccessShareLock);
    // compat(0.2.0): rate_limit, absent on the 0.2.0 schema.
    s.queue_rate_limit = column(RelationGetDescr(queues), "rate_limit", INT4OID);
    if (s.queue_rate_limit == InvalidAttrNumber &&
        column(RelationGetDescr(queues), "rate_limit", InvalidOid) != InvalidAttrNumber)
        s.direct = false;  // there, of another type
    s.queue_rate_period = column(RelationGetDescr(queues), "rate_period", INTERVALOID);
    if (s.queue_rate_period != InvalidAttrNumber &&
        !TupleDescAttr(RelationGetDescr(queues), s.queue_rate_period - 1)->attnotnull)
        s.queue_rate_period = InvalidAttrNumber;
    // compat(0.2.0): max_running_per_key and fairness, absent on the 0.2.0 schema.
    s.queue_per_key = column(RelationGetDescr(queues), "max_running_per_key", INT4OID);
    s.queue_fairness = column(RelationGetDescr(queues), "fairness", TEXTOID);
    if ((s.queue_per_key == InvalidAttrNumber &&
         column(RelationGetDescr(queues), "max_running_per_key", InvalidOid) !=
             InvalidAttrNumber) ||
        (s.queue_fairness == InvalidAttrNumber &&
         column(RelationGetDescr(queues), "fairness", InvalidOid) != InvalidAttrNumber))
        s.direct = false;  // there, of another type
    for (int c = 0; c < kQueueColumns; ++c) {
        s.queue[c] = column(RelationGetDescr(queues), kQueueColumnNames[c], kQueueColumnTypes[c]);
        s.direct = s.direct && s.queue[c] != InvalidAttrNumber;
        if (s.direct) {
            Form_pg_attribute a = TupleDescAttr(RelationGetDescr(queues), s.queue[c] - 1);
            // max_running is the one that may be NULL (no limit).
            s.direct = (a->attnotnull || c == kQMaxRunning) && a->atttypmod == -1 &&
                       (!OidIsValid(a->attcollation) || a->attcollation == DEFAULT_COLLATION_OID);
        }
    }
    table_close(queues, AccessShareLock);
    Relation grants = table_open(s.grants, AccessShareLock);
    s.grant_queue = column(RelationGetDescr(grants), "queue", TEXTOID);
    s.grant_grantee = column(RelationGetDescr(grants), "grantee", TEXTOID);
    table_close(grants, AccessShareLock);

    if (s.direct) {
        AttrNumber pkey[1] = {s.job[kJobId]};
        // The claim index: hashtextextended(queue, 0) (an expression, 0), priority, run_at, job_id.
        AttrNumber claim[4] = {0, s.job[kPriority], s.job[kRunAt], s.job[kJobId]};
        AttrNumber qkey[1] = {s.queue[kQQueue]};
        AttrNumber gkey[1] = {s.grant_queue};
        s.direct =
            s.grant_queue != InvalidAttrNumber && index_on(s.jobs_pkey, s.jobs, pkey, 1) &&
            index_on(s.jobs_claim, s.jobs, claim, 4, s.job[kState], s.pending, s.job[kQueue]) &&
            index_on(s.queues_pkey, s.queues, qkey, 1) &&
            index_on(s.grants_pkey, s.grants, gkey, 1) && s.grant_grantee != InvalidAttrNumber;
    }
    AttrNumber by_queue[2] = {0, s.job[kJobId]};  // hashtextextended(queue, 0), job_id
    AttrNumber by_id[1] = {s.job[kJobId]};        // compat(0.2.0): job_id
    s.running_by_queue =
        s.direct && OidIsValid(s.jobs_running) &&
        index_on(s.jobs_running, s.jobs, by_queue, 2, s.job[kState], s.running, s.job[kQueue]);
    if (!s.direct || !OidIsValid(s.jobs_running) ||
        (!s.running_by_queue &&
         !index_on(s.jobs_running, s.jobs, by_id, 1, s.job[kState], s.running)))
        s.jobs_running = InvalidOid;
    learn_rates(s, nsp);
    learn_turns(s, nsp);
    s.errors = get_relname_relid("job_errors", nsp);
    s.failable = s.direct && OidIsValid(s.errors) ? Learnt::unknown : Learnt::no;
    s.known = true;
    shape = s;
    return true;
}

// Learns what an enqueue or a failure needs, once per shape, under the tables' locks (usable).
// An invalidation meanwhile leaves it unknown (and the shape forgotten): the SQL path serves.
bool learn_need(Need need)
{
    Learnt& state = need == Need::insert ? shape.insertable : shape.failable;
    if (state == Learnt::unknown) {
        uint64 seen = invalidations;
        bool ok = false;
        if (need == Need::insert) {
            Relation jobs = table_open(shape.jobs, AccessShareLock);
            ok = learn_job_defaults(jobs, shape);
            table_close(jobs, AccessShareLock);
        } else {
            ok = learn_errors(shape);
        }
        if (invalidations != seen || !shape.known)
            return false;
        state = ok ? Learnt::yes : Learnt::no;
    }
    return state == Learnt::yes;
}

}  // namespace

bool usable(const char* function, const Access& access, Need need)
{
    const char* why = nullptr;
    if (guc_hot_path != kHotPathDirect) {
        why = "jobcap.hot_path is sql";
    } else if (IsolationUsesXactSnapshot()) {
        why = "the transaction is REPEATABLE READ or SERIALIZABLE";
    } else if (XactReadOnly || RecoveryInProgress()) {
        why = "the transaction is read-only";  // the SQL path raises what UPDATE raises
    } else if (citus::loaded() && citus::distributed()) {
        // Its rows are in shards, and jobcap.jobs on this node is an empty shell.
        why = "jobcap.jobs is distributed with Citus";
    } else {
        if (!callback_registered) {
            CacheRegisterRelcacheCallback(forget_shape, (Datum) 0);
            callback_registered = true;
        }
        // The shape is trusted only under the locks of every table the call reads, taken as the
        // statement takes them (jobs first, as UPDATE; the others as its scans): locking accepts
        // the invalidations of every change committed before it (a trigger created since this
        // transaction began, an index REINDEX CONCURRENTLY swapped), and no change to a table
        // that would make what is remembered of it wrong commits before this transaction ends
        // (REINDEX CONCURRENTLY and DROP INDEX CONCURRENTLY wait for every transaction holding a
        // lock on the table before they drop an index). An invalidation arriving while the
        // shape is learned (opening a table accepts them too) means what was learned may be
        // stale: learn again.
        for (int tries = 0; tries < 3; ++tries) {
            if (!shape.known) {
                uint64 seen = invalidations;
                if (!learn_shape())
                    break;
                if (invalidations != seen) {
                    shape.known = false;
                    continue;
                }
            }
            if (!shape.direct)
                break;
            LockRelationOid(shape.jobs, RowExclusiveLock);
            if (need == Need::fail && shape.known && OidIsValid(shape.errors))
                LockRelationOid(shape.errors, RowExclusiveLock);  // its shape likewise
            // Read through their primary keys: a claim, an enqueue and a failure read the queue's
            // row; every call but a privileged caller's reads the grants (may_work), so only
            // those lock them: a lock taken costs every call of the hot path.
            if (need != Need::update && shape.known)
                LockRelationOid(shape.queues, AccessShareLock);
            if (shape.known && !access.privileged)
                LockRelationOid(shape.grants, AccessShareLock);
            if (shape.known)
                break;
        }
        if (!shape.known || !shape.direct)
            why =
                "jobcap.jobs has triggers, rules, row security, constraints or generated "
                "columns, or is not as jobcap 0.2.0 made it";
        else if (need == Need::fail && !learn_need(need))
            why =
                "jobcap.job_errors has triggers, rules, row security, constraints, defaults or "
                "indexes the direct path does not write as the executor would";
        else if (need == Need::insert && !learn_need(need))
            why =
                "a column of jobcap.jobs has a default other than a constant, or is NOT NULL "
                "where an enqueue leaves it NULL";
    }
    // Tests read these (client_min_messages = debug2) to know which path served a call.
    if (why != nullptr)
        elog(DEBUG2, "jobcap: %s takes the SQL path: %s", function, why);
    else
        elog(DEBUG2, "jobcap: %s takes the direct path", function);
    return why == nullptr;
}

Datum succeeded_state()
{
    return ObjectIdGetDatum(shape.succeeded);
}

}  // namespace jobcap::direct
