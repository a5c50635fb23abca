// The direct path's row primitives (src/direct/rows.cpp), shared by its operations (claim.cpp,
// settle.cpp, enqueue.cpp, history.cpp). Private to src/direct/.
#pragma once

#include "direct/shape.hpp"

#include "core/cap.hpp"

namespace jobcap::direct {

// Runs work as owner, restricted, as spi_open runs the SQL path's statements (spi/access.cpp).
// An error needs no cleanup: transaction and subtransaction abort restore the user.
template <typename Work>
void as_owner(Oid owner, const Work& work)
{
    Oid user = InvalidOid;
    int context = 0;
    GetUserIdAndSecContext(&user, &context);
    SetUserIdAndSecContext(owner,
                           context | SECURITY_LOCAL_USERID_CHANGE | SECURITY_RESTRICTED_OPERATION);
    work();
    SetUserIdAndSecContext(user, context);
}

// One call's work on jobcap.jobs: the table and every index open, a fresh snapshot (what SPI
// takes for each statement of a volatile function, after a command counter increment).
struct Op {
    Snapshot snapshot;
    CommandId cid;
    Relation rel;
    EState* estate;
    ResultRelInfo* result;
    TupleTableSlot* found;  // the version found or locked (a buffer slot)
    TupleTableSlot* next;   // the new version
    Datum* values;          // the new version's replaced columns (set(), then update())
    bool* nulls;
    bool* replace;
    Relation* opened;  // with cached indexes: those opened so far (indexes.oids' order)
};

// A new row of natts columns, every one its learnt default (learn_defaults) until set.
struct NewRow {
    Datum* values;
    bool* nulls;
    void set(AttrNumber column, Datum value, bool isnull)
    {
        values[column - 1] = value;
        nulls[column - 1] = isnull;
    }
};

// A queue's row as the statements read it (in op's snapshot).
struct QueueRow {
    bool paused;
    bool limited;  // max_running, rate_limit or max_running_per_key set, or not fifo
    // Whether a claim far enough below the queue's limits may take the shared turn
    // (direct/claim.cpp): its limits are max_running, max_running_per_key and rate_limit (fifo).
    // run_cap: the smaller of the first two (run_capped: either is set), far enough below which
    // no key's running jobs can reach either; rate_limit (0: none) and its period's slot width.
    bool shareable;
    bool run_capped;
    int32 run_cap;
    // Round-robin fairness its only control (no max_running, rate_limit or per-key limit): a
    // claim of one job may take the direct path's turn claim (turns.cpp).
    bool turns_only;
    ItemPointerData tid;  // the row's version read
    TransactionId xmin;   // and its inserter (with tid: the version, for rates.cpp's allowance)
    int32 rate_limit;
    int64 rate_slot_us;
    int32 cap;
    int64 epoch;
    Datum lease;  // copied
    bool notify;
    Datum backoff_base, backoff_max;  // copied
};

// A column of a job's version in slot (isnull may be nullptr for a column read as never NULL).
inline int64 int8_of(TupleTableSlot* slot, JobColumn c, bool* isnull = nullptr)
{
    bool n = false;
    Datum d = slot_getattr(slot, shape.job[c], &n);
    if (isnull != nullptr)
        *isnull = n;
    return n ? 0 : DatumGetInt64(d);
}
inline int32 int4_of(TupleTableSlot* slot, JobColumn c, bool* isnull = nullptr)
{
    bool n = false;
    Datum d = slot_getattr(slot, shape.job[c], &n);
    if (isnull != nullptr)
        *isnull = n;
    return n ? 0 : DatumGetInt32(d);
}
inline Oid state_of(TupleTableSlot* slot)
{
    bool n = false;
    Datum d = slot_getattr(slot, shape.job[kState], &n);
    return n ? InvalidOid : DatumGetObjectId(d);
}

// The cap of the job whose version is in slot, its queue's row being q (core/cap.hpp).
inline core::Cap cap_of_job(TupleTableSlot* slot, const QueueRow& q)
{
    core::CapInputs in;
    in.job_max_attempts = int4_of(slot, kMaxAttempts, &in.job_max_attempts_null);
    in.job_cap_epoch = int8_of(slot, kCapEpoch, &in.job_cap_epoch_null);
    in.queue_max_attempts = q.cap;
    in.queue_cap_epoch = q.epoch;
    return core::cap_of(in);
}

// Replaces column c in the next update().
inline void set(Op& op, JobColumn c, Datum value, bool isnull = false)
{
    int i = shape.job[c] - 1;
    op.values[i] = value;
    op.nulls[i] = isnull;
    op.replace[i] = true;
}

// Whether relid is one of jobcap.jobs' cached indexes; forgets them (shape.cpp's invalidation
// callback).
bool indexes_include(Oid relid);
void forget_indexes();

// The claim index's key for queue: hashtextextended(queue, 0), its first key's expression.
Datum queue_hash(Datum queue);

// Starts one call's work: a command counter increment and a fresh snapshot, jobcap.jobs opened
// with its indexes (learnt first when the cache was forgotten). cmd: the statement's command
// (UPDATE for the settles and claims, INSERT for enqueues, SELECT ... FOR NO KEY UPDATE for
// assert_fence): an UPDATE checks the replica identity of a published table when it starts,
// whether or not it then finds a row. end() closes what begin() opened; the table's lock stays
// to the end of the transaction, as a statement's.
void begin(Op& op, CmdType cmd = CMD_UPDATE);
void end(Op& op);

// A new snapshot for the rest of op's work (READ COMMITTED: the direct path's only level), for
// what must see every transaction that committed before a lock just taken.
void fresh_snapshot(Op& op);

// An index of jobcap.jobs, opened for this call.
Relation open_index(Op& op, Oid index);

// A new row of natts columns set to their defaults (palloc'd in the current memory context).
NewRow new_row(int natts, const Datum* defaults, const bool* default_nulls);

// At most this many indexes on jobcap.jobs are cached (rows.cpp); with more, the executor's
// ExecOpenIndices and ExecInsertIndexTuples insert the index entries.
constexpr int kMaxCachedIndexes = 32;

// For a run of new rows that differ only in the columns varying: the result of each partial
// index's predicate that reads none of them, learnt from the run's first row (1 passes, 0 not,
// -1 not known).
struct PredicateMemo {
    Bitmapset* varying;
    int8 passes[kMaxCachedIndexes];
};
PredicateMemo predicate_memo(const AttrNumber* varying, int n);

// ExecInsertIndexTuples for the cached indexes: the new version (slot) goes into each index
// whose predicate it passes (memo: the run's predicates known so far, or nullptr). After an
// update, an index none of whose columns it replaced is hinted as unchanged (bottom-up deletion
// of the old version's duplicates, as the executor hints); a new row's entries never are.
void insert_index_entries(Op& op, TupleTableSlot* slot, bool update, PredicateMemo* memo = nullptr);

// Reads queue's rows of jobcap.queue_rates (shape.rates) in op's snapshot into charge->window,
// the row of slot as the claim's own (its version at charge->tid), and returns the room they
// leave under q's rate limit at now (spi/rates.hpp). In direct/rates.cpp, as the next.
int32 read_rate_rows(Op& op, Datum queue, const QueueRow& q, int slot, TimestampTz now,
                     RateCharge* charge);

// Whether a shared claim of up to batch jobs of queue (its row q) at now is covered by what
// this backend's claims charged ahead (core::RateAllowance): charged in now's slot, under the
// version of the queue's row read, by a transaction that committed.
bool rate_allowance_covers(Datum queue, const QueueRow& q, TimestampTz now, int batch);

// After a shared claim of up to batch jobs of a rate-limited queue took claimed: spends the
// allowance that covered it, or writes charge's own row of the window charged with them and,
// when it took all batch, with the claims this backend is expected to make in the rest of the
// slot (core::rate_charge_ahead), usable once this transaction commits. The row: the version
// read updated (HOT when it fits), or new.
void settle_rate_charge(Op& op, Datum queue, const QueueRow& q, TimestampTz now, RateCharge& charge,
                        int claimed, int batch);

// A claim's test of a job's version (claim.cpp), the claim statements' WHERE: pending, of queue,
// due at now, below its cap (*cap), not past a start_by it was never claimed by, not one of the
// jobs whose rolled-back claim is not counted yet (skipped).
struct Claimable {
    Datum queue;
    TimestampTz now;
    const QueueRow* q;
    const int64* skipped;
    int nskip;
    bool operator()(TupleTableSlot* slot, core::Cap* cap) const;
};
Claimable claimable(const ClaimCall& call, const QueueRow& q, TimestampTz now);

// Claims the job whose version op.found holds (locked by this transaction, passed Claimable):
// running, attempts + 1, a new fence, the lease to expires, the worker, claimed at now; into out.
void claim_found(Op& op, const ClaimCall& call, Datum lease, Datum expires, TimestampTz now,
                 const core::Cap& cap, Claimed* out);

// A round-robin queue's claim of up to kSharedClaimBatch jobs (turns.cpp), q read in op's
// snapshot (turns_only): the SQL path's claim_job_turns, under the same locks. Returns how many
// it claimed into out, or -1 without claiming when the SQL path must decide (the queue changed
// while the claim waited for its turn).
int claim_in_turn(Op& op, const Access& access, const ClaimCall& call, QueueRow* q, Claimed* out);

// A scan of queue's rows in a plainly written table (queue_rates, queue_turns) through pkey,
// whose first key is the queue column, in op's snapshot. The table is opened with its write's
// lock, taken now and held to commit, so no index, trigger or constraint can come between the
// read and the write (CREATE INDEX and CREATE TRIGGER wait for it); one that came before it
// forgets the shape, whose invalidation is read here: begin() is false then (nothing to end),
// and the claim goes to the SQL path. next() skips another queue's rows (equal under the
// index's collation, not the database's) and rows whose queue is NULL.
struct QueueRows {
    bool begin(Op& op, Oid table, Oid pkey, AttrNumber column, Datum queue);
    HeapTuple next();
    void end();
    Relation rel;
    TupleDesc desc;
    SysScanDesc scan;
    AttrNumber column;
    Datum queue;
};

// The SQL path's upsert of a row of rel (queue_rates, queue_turns: vetted by shape.cpp's
// written_plainly) without the executor: row (a virtual slot of rel) written over the version
// read at tid when found (HOT when it fits), else inserted; then, unless the update was HOT, its
// entry in pkey, the table's one index, whose nkeys columns are key. The version read must be
// the latest: the caller holds what keeps other writers out (a turn, a slot).
void write_plainly(Op& op, Relation rel, Oid pkey, bool found, ItemPointerData tid,
                   TupleTableSlot* row, Datum* key, int nkeys);

// Whether caller may work queue: privileged, or a grant of the queue names a role whose
// privileges the caller has (JOBCAP_MAY_WORK in access.hpp, the same rule in C).
bool may_work(const Access& access, Datum queue, Snapshot snapshot);

// Reads queue's row: false when there is none (or it has a NULL where the table says NOT NULL:
// a row the direct path does not interpret; the SQL path then decides).
bool read_queue(Op& op, Datum queue, QueueRow* row);

// Finds job_id's version visible to the snapshot (through the primary key), checks that it is
// (fence, running) of a queue the caller may work, locks its latest version FOR NO KEY UPDATE
// (waiting, as UPDATE does) and checks the same on it (the statement's EvalPlanQual). True with
// the locked version in op.found. same_queue: fail_job's statement joins the queue's row its
// scan read, so a job moved to another queue meanwhile matches no row.
bool lock_current(Op& op, const Access& access, int64 job_id, int64 fence, bool same_queue = false);

// Writes the new version of the row in op.found (locked by this transaction) with the columns
// set() replaced, and its index entries unless the update was HOT. Leaves the new version in
// op.next.
void update(Op& op);

}  // namespace jobcap::direct
