// The direct path: see jobs.hpp. Every function here runs inside jobcap::enter (boundary.hpp),
// so an error is a PostgreSQL error and transaction abort releases what was opened (relations,
// the registered snapshot, the pushed active snapshot, slots, the executor state's memory).
// Frames hold plain data only.
#define JOBCAP_DIRECT_PATH  // compat.hpp's shims for this file
extern "C" {
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/relation.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xlog.h"
#include "catalog/index.h"
#include "catalog/namespace.h"
#include "catalog/pg_am_d.h"
#include "catalog/pg_class.h"
#include "catalog/pg_collation_d.h"
#include "catalog/pg_enum.h"
#include "catalog/pg_index.h"
#include "catalog/pg_language.h"
#include "catalog/pg_proc.h"
#include "commands/sequence.h"
#include "executor/executor.h"
#include "access/transam.h"
#include "nodes/execnodes.h"
#include "nodes/nodeFuncs.h"
#include "optimizer/optimizer.h"
#include "rewrite/rewriteHandler.h"
#include "storage/lmgr.h"
#include "utils/acl.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/syscache.h"
}

#include "direct/jobs.hpp"

#include "core/backoff.hpp"
#include "core/rules.hpp"
#include "jobcap.hpp"
#include "spi/errors.hpp"

namespace jobcap::direct {
namespace {

// The columns the direct path reads or writes, found by name (column order is not part of the
// tables' contract: an upgraded database and a fresh one may differ).
enum JobColumn {
    kJobId,
    kQueue,
    kState,
    kPriority,
    kRunAt,
    kAttempts,
    kMaxAttempts,
    kFence,
    kLease,
    kLeaseExpiresAt,
    kWorker,
    kFirstClaimedAt,
    kClaimedAt,
    kFinishedAt,
    kPayload,
    kCapEpoch,
    kOutput,
    kDedupeKey,
    kEnqueuedAt,
    kJobColumns
};
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
enum QueueColumn {
    kQQueue,
    kQMaxAttempts,
    kQLease,
    kQPaused,
    kQMaxRunning,
    kQCapEpoch,
    kQNotify,
    kQBackoffBase,
    kQBackoffMax,
    kQueueColumns
};
const char* const kQueueColumnNames[kQueueColumns] = {"queue",  "max_attempts", "lease",
                                                      "paused", "max_running",  "cap_epoch",
                                                      "notify", "backoff_base", "backoff_max"};
const Oid kQueueColumnTypes[kQueueColumns] = {TEXTOID, INT4OID, INTERVALOID, BOOLOID,    INT4OID,
                                              INT8OID, BOOLOID, INTERVALOID, INTERVALOID};
// jobcap.job_errors, the history fail_job and crash_job add to (and prune).
enum ErrorColumn {
    kESeq,
    kEJobId,
    kEQueue,
    kEAttempt,
    kEFence,
    kEKind,
    kEWorker,
    kEError,
    kEAt,
    kErrorColumns
};
const char* const kErrorColumnNames[kErrorColumns] = {"seq",  "job_id", "queue", "attempt", "fence",
                                                      "kind", "worker", "error", "at"};
const Oid kErrorColumnTypes[kErrorColumns] = {INT8OID, INT8OID, TEXTOID, INT4OID,       INT8OID,
                                              TEXTOID, TEXTOID, TEXTOID, TIMESTAMPTZOID};

enum class Learnt : uint8 { unknown, yes, no };

// What the direct path knows of the installed tables. Learned on first use and forgotten when
// the relcache entry of one of them is invalidated (ALTER TABLE, CREATE TRIGGER, CREATE INDEX,
// ALTER EXTENSION jobcap UPDATE, DROP EXTENSION, ...).
struct Shape {
    bool known;
    bool direct;  // 0.2.0 columns present, no triggers, no row security, indexes as expected
    Oid jobs, jobs_pkey, jobs_claim, queues, queues_pkey, grants, grants_pkey, fences;
    AttrNumber job[kJobColumns];
    AttrNumber queue[kQueueColumns];
    AttrNumber grant_queue, grant_grantee;
    Oid pending, running, succeeded, dead;  // jobs.state's enum values
    // Enqueueing (insertable): every column the INSERT of the SQL path leaves to its default
    // has none (NULL, on a nullable column) or a constant one, kept in defaults (shape_context);
    // job_id is an identity column whose sequence is identity. Learnt on the first enqueue
    // (learn_need), so that a default that cannot be computed fails enqueues only, as on the
    // SQL path.
    Learnt insertable;
    Oid identity;
    int natts;
    Datum* defaults;
    bool* default_nulls;
    // Failing (failable): job_errors has no triggers, rules or row security, CHECK constraints
    // of built-in functions only (the direct path evaluates them as the executor does), seq an
    // identity column, constant defaults elsewhere, and its index on (job_id, seq). Learnt on
    // the first failure.
    Learnt failable;
    Oid errors, errors_by_job, errors_identity;
    AttrNumber error[kErrorColumns];
    Datum* error_defaults;
    bool* error_default_nulls;
};
Shape shape;
MemoryContext shape_context = nullptr;
uint64 invalidations = 0;
bool callback_registered = false;

// The indexes of jobcap.jobs, each IndexInfo built once (with its predicate's and expressions'
// evaluation states) in a context of its own instead of once per statement, as
// ExecOpenIndices does. Used when every index is a btree with immediate uniqueness and no
// exclusion constraint (jobcap's own are): the direct path then evaluates each predicate first
// and opens and inserts into only the indexes the new version belongs in. Otherwise (an index a
// DBA added of another kind) ExecOpenIndices and ExecInsertIndexTuples do it all, per call.
constexpr int kMaxCachedIndexes = 32;
struct Indexes {
    bool valid;
    bool cached;
    int count;
    Oid oids[kMaxCachedIndexes];
    IndexInfo* infos[kMaxCachedIndexes];
};
Indexes indexes;
MemoryContext index_context = nullptr;

void forget_shape(Datum, Oid relid)
{
    bool ours = relid == InvalidOid || relid == shape.jobs || relid == shape.queues ||
                relid == shape.grants || relid == shape.errors;
    for (int i = 0; !ours && i < indexes.count; ++i)
        ours = relid == indexes.oids[i];
    if (ours) {
        shape.known = false;
        indexes.valid = false;
        ++invalidations;
    }
}

// Whether node is hashtextextended(queue, 0) under the database's collation (queue: the
// column's number), the claim index's first key: the one index expression the direct path
// evaluates itself (a key of fixed width, where one of variable width would make every
// comparison walk the entry). Queues whose names share a hash would share a run of the index;
// a claim compares the name.
bool is_queue_hash(const Node* node, AttrNumber queue)
{
    if (node == nullptr || !IsA(node, FuncExpr) || queue == InvalidAttrNumber)
        return false;
    const FuncExpr* f = castNode(FuncExpr, node);
    if (f->funcid != F_HASHTEXTEXTENDED || f->inputcollid != DEFAULT_COLLATION_OID ||
        list_length(f->args) != 2)
        return false;
    const Node* arg = static_cast<Node*>(linitial(f->args));
    const Node* seed = static_cast<Node*>(lsecond(f->args));
    // The seed as stored (int8(0), the parser's cast of an integer) or folded (the relcache's).
    bool cast = IsA(seed, FuncExpr) && castNode(FuncExpr, seed)->funcid == F_INT8_INT4 &&
                list_length(castNode(FuncExpr, seed)->args) == 1;
    if (cast)
        seed = static_cast<Node*>(linitial(castNode(FuncExpr, seed)->args));
    if (!IsA(arg, Var) || castNode(Var, arg)->varattno != queue ||
        castNode(Var, arg)->varlevelsup != 0 || !IsA(seed, Const))
        return false;
    const Const* c = castNode(Const, seed);
    return !c->constisnull && c->consttype == (cast ? INT4OID : INT8OID) &&
           (cast ? DatumGetInt32(c->constvalue) : DatumGetInt64(c->constvalue)) == 0;
}

// Whether exprs (an index's expressions) are that one expression alone.
bool exprs_are_queue_hash(const List* exprs, AttrNumber queue)
{
    return list_length(exprs) == 1 && is_queue_hash(static_cast<Node*>(linitial(exprs)), queue);
}

// Whether stored (pg_index.indexprs) is the claim index's hashtextextended(queue, 0) alone
// (is_queue_hash).
bool stored_exprs_are_queue_hash(Datum stored, AttrNumber queue)
{
    char* str = TextDatumGetCString(stored);
    Node* tree = static_cast<Node*>(stringToNode(str));
    pfree(str);
    return tree != nullptr && IsA(tree, List) && exprs_are_queue_hash(castNode(List, tree), queue);
}

// The claim index's key for queue (the value is_queue_hash's expression gives its rows).
Datum queue_hash(Datum queue)
{
    return DirectFunctionCall2Coll(hashtextextended, DEFAULT_COLLATION_OID, queue,
                                   Int64GetDatum(0));
}

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

// Learns the indexes of jobs (locked by the caller: the set cannot change before the end of
// the transaction).
void learn_indexes(Relation jobs)
{
    if (index_context == nullptr)
        index_context = AllocSetContextCreate(CacheMemoryContext, "jobcap direct path indexes",
                                              ALLOCSET_SMALL_SIZES);
    else
        MemoryContextReset(index_context);
    indexes.valid = false;
    indexes.count = 0;
    uint64 seen = invalidations;
    List* oids = RelationGetIndexList(jobs);
    bool cached = list_length(oids) <= kMaxCachedIndexes;
    ListCell* lc;
    foreach (lc, oids) {
        if (!cached)
            break;
        Relation index = index_open(lfirst_oid(lc), AccessShareLock);
        MemoryContext caller = MemoryContextSwitchTo(index_context);
        IndexInfo* info = BuildIndexInfo(index);
        // Compiled as the tables' owner, whom the SQL path's statements run as: compiling checks
        // EXECUTE on each function for the current user, and what is compiled here serves every
        // later caller of this backend.
        bool hashed = exprs_are_queue_hash(info->ii_Expressions, shape.job[kQueue]);
        as_owner(jobs->rd_rel->relowner, [&] {
            // Only plain predicates of built-in operators get here (plain_index in learn_shape):
            // compiled as the relcache keeps them (constants folded, operator functions set),
            // with nothing that caches per query (no hashed ScalarArrayOpExpr: the planner's).
            if (info->ii_Predicate != NIL)
                info->ii_PredicateState = ExecInitQual(info->ii_Predicate, nullptr);
            // The claim index's hashtextextended(queue, 0), compiled once as its predicate
            // (FormIndexDatum evaluates it in the call's per-tuple context). Any other
            // expression: see below.
            if (hashed)
                info->ii_ExpressionsState = ExecInitExprList(info->ii_Expressions, nullptr);
        });
        MemoryContextSwitchTo(caller);
        cached = index->rd_rel->relam == BTREE_AM_OID && index->rd_index->indimmediate &&
                 info->ii_ExclusionOps == nullptr && (info->ii_Expressions == NIL || hashed);
        indexes.oids[indexes.count] = RelationGetRelid(index);
        indexes.infos[indexes.count++] = info;
        index_close(index, AccessShareLock);
    }
    list_free(oids);
    indexes.cached = cached;
    // An invalidation that arrived meanwhile: use what was learned now (the table's lock keeps
    // the set of indexes), learn again next time.
    indexes.valid = invalidations == seen;
}

AttrNumber column(TupleDesc desc, const char* name, Oid type)
{
    for (int i = 0; i < desc->natts; ++i) {
        Form_pg_attribute a = TupleDescAttr(desc, i);
        if (!a->attisdropped && strcmp(NameStr(a->attname), name) == 0)
            return type == InvalidOid || a->atttypid == type ? static_cast<AttrNumber>(i + 1)
                                                             : InvalidAttrNumber;
    }
    return InvalidAttrNumber;
}

// Whether the executor would do more for an UPDATE of rel than the direct path does: fire
// triggers, apply row security or rules, check constraints (a partition's too), compute
// generated columns; or whether rel is not a heap. The
// direct path writes NULL only into lease_expires_at and output: NOT NULL there would be a check.
bool executor_needed(Relation rel, const AttrNumber* job)
{
    TupleDesc desc = RelationGetDescr(rel);
    TupleConstr* constr = desc->constr;
    return rel->trigdesc != nullptr || rel->rd_rel->relrowsecurity || rel->rd_rules != nullptr ||
           rel->rd_rel->relkind != RELKIND_RELATION || rel->rd_rel->relispartition ||
           rel->rd_rel->relhassubclass || rel->rd_rel->relam != HEAP_TABLE_AM_OID ||
           (constr != nullptr && (constr->num_check > 0 || constr->has_generated_stored ||
                                  jobcap_has_generated_virtual(constr))) ||
           TupleDescAttr(desc, job[kLeaseExpiresAt] - 1)->attnotnull ||
           TupleDescAttr(desc, job[kOutput] - 1)->attnotnull;
}

// Whether stored (pg_index.indpred) is exactly "column = value" for an enum column: the claim
// index's "state = 'pending'".
bool predicate_is(Datum stored, AttrNumber column, Oid value)
{
    Node* n = static_cast<Node*>(stringToNode(TextDatumGetCString(stored)));
    if (IsA(n, List) && list_length(castNode(List, n)) == 1)
        n = static_cast<Node*>(linitial(castNode(List, n)));
    if (!IsA(n, OpExpr))
        return false;
    OpExpr* op = castNode(OpExpr, n);
    if (list_length(op->args) != 2 || get_opcode(op->opno) != F_ENUM_EQ)
        return false;
    Node* left = static_cast<Node*>(linitial(op->args));
    Node* right = static_cast<Node*>(lsecond(op->args));
    return IsA(left, Var) && castNode(Var, left)->varattno == column && IsA(right, Const) &&
           !castNode(Const, right)->constisnull &&
           DatumGetObjectId(castNode(Const, right)->constvalue) == value;
}

// Whether index idx is on table rel with exactly these leading key columns, and no predicate
// but (when column is valid) "column = value": an index the direct path scans must hold every
// row the statement's scan would find.
bool index_on(Oid idx, Oid rel, const AttrNumber* keys, int nkeys,
              AttrNumber column = InvalidAttrNumber, Oid value = InvalidOid,
              AttrNumber hashed = InvalidAttrNumber)
{
    HeapTuple t = SearchSysCache1(INDEXRELID, ObjectIdGetDatum(idx));
    if (!HeapTupleIsValid(t))
        return false;
    Form_pg_index index = reinterpret_cast<Form_pg_index>(GETSTRUCT(t));
    bool ok = index->indrelid == rel && index->indnkeyatts >= nkeys && index->indisvalid &&
              index->indisready && !index->indcheckxmin;
    bool isnull = false;
    Datum pred = SysCacheGetAttr(INDEXRELID, t, Anum_pg_index_indpred, &isnull);
    ok =
        ok && (column == InvalidAttrNumber ? isnull : !isnull && predicate_is(pred, column, value));
    // No expression, or (hashed: the queue column's number) hashtextextended(queue, 0) as the
    // first key (keys[0] = 0, an expression's indkey).
    Datum exprs = SysCacheGetAttr(INDEXRELID, t, Anum_pg_index_indexprs, &isnull);
    ok = ok &&
         (isnull || (hashed != InvalidAttrNumber && stored_exprs_are_queue_hash(exprs, hashed)));
    Datum options = SysCacheGetAttr(INDEXRELID, t, Anum_pg_index_indoption, &isnull);
    int2vector* option = isnull ? nullptr : reinterpret_cast<int2vector*>(DatumGetPointer(options));
    for (int i = 0; ok && i < nkeys; ++i)
        ok = (keys[i] != InvalidAttrNumber || (i == 0 && hashed != InvalidAttrNumber)) &&
             index->indkey.values[i] == keys[i] &&
             (option == nullptr || option->values[i] == 0);  // ascending, nulls last
    // Keys compared under the columns' collation, the database's (learn_shape requires it of
    // the columns): under another (a case-insensitive one) a scan for one queue's key would
    // find another queue's row.
    Datum collations = SysCacheGetAttr(INDEXRELID, t, Anum_pg_index_indcollation, &isnull);
    const oidvector* collation =
        isnull ? nullptr : reinterpret_cast<const oidvector*>(DatumGetPointer(collations));
    for (int i = 0; ok && i < nkeys; ++i)
        ok = collation != nullptr &&
             (!OidIsValid(collation->values[i]) || collation->values[i] == DEFAULT_COLLATION_OID);
    ReleaseSysCache(t);
    if (ok) {
        t = SearchSysCache1(RELOID, ObjectIdGetDatum(idx));
        ok = HeapTupleIsValid(t) &&
             reinterpret_cast<Form_pg_class>(GETSTRUCT(t))->relam == BTREE_AM_OID;
        if (HeapTupleIsValid(t))
            ReleaseSysCache(t);
    }
    return ok;
}

Oid state_value(Oid type, const char* label)
{
    return GetSysCacheOid2(ENUMTYPOIDNAME, Anum_pg_enum_oid, ObjectIdGetDatum(type),
                           CStringGetDatum(label));
}

// Whether values of type t are compared, hashed and copied by PostgreSQL's own code only: a
// built-in type, an enum (compared by its labels' order), or an array of such. A range, a
// composite, a domain or a base type a DBA made carries functions of theirs (a range's subtype
// comparison, a domain's constraints) that built-in operators on it would call.
bool plain_type(Oid t)
{
    if (t < FirstNormalObjectId)
        return true;
    if (type_is_enum(t))
        return true;
    Oid element = get_element_type(t);
    return OidIsValid(element) && plain_type(element);
}

// Whether a built-in function reaches no code but its own: written in C, immutable (no SQL run
// from a text argument, as query_to_xml does), and taking no polymorphic argument and none that
// names other objects whose functions it would call (satisfies_hash_partition takes a table's
// oid and "any", and calls the table's hash support functions).
bool plain_function(const Form_pg_proc proc)
{
    if (proc->prolang != INTERNALlanguageId || proc->provolatile != PROVOLATILE_IMMUTABLE ||
        OidIsValid(proc->provariadic))
        return false;
    for (int i = 0; i < proc->pronargs; ++i) {
        // A polymorphic argument (anyarray, anyrange, record, ...) makes the function call the
        // operators of whatever type it gets, which a DBA may have written (array_eq calls the
        // element type's default operator class). Enums compare by their labels' order only.
        Oid arg = proc->proargtypes.values[i];
        if (arg != ANYENUMOID && get_typtype(arg) == TYPTYPE_PSEUDO)
            return false;
        switch (arg) {
        case ANYOID:
        case INTERNALOID:
        case CSTRINGOID:
        case OIDOID:
        case REGCLASSOID:
        case REGTYPEOID:
        case REGPROCOID:
        case REGPROCEDUREOID:
        case REGOPEROID:
        case REGOPERATOROID:
        case REGCONFIGOID:
        case REGDICTIONARYOID:
        case REGNAMESPACEOID:
        case REGROLEOID:
        case REGCOLLATIONOID:
            return false;
        default:
            break;
        }
    }
    return true;
}

// Whether node (a stored index predicate, a CHECK constraint, a column default) uses only
// built-in operators and functions written in C, on plain types (no SQL or PL function, nothing
// resolved by name, nothing run as the caller but PostgreSQL's own code), in the node kinds such
// expressions are made of. Returns true at the first node that is not (an
// expression_tree_walker callback).
bool not_plain(Node* node, void*)
{
    if (node == nullptr)
        return false;
    switch (nodeTag(node)) {
    case T_Var:
    case T_Const:
    case T_BoolExpr:
    case T_NullTest:
    case T_BooleanTest:
    case T_RelabelType:
    case T_List:
        break;
    case T_FuncExpr:
    case T_OpExpr:
    case T_ScalarArrayOpExpr: {
        Oid opno = IsA(node, OpExpr)              ? castNode(OpExpr, node)->opno
                   : IsA(node, ScalarArrayOpExpr) ? castNode(ScalarArrayOpExpr, node)->opno
                                                  : InvalidOid;
        Oid fn = IsA(node, FuncExpr) ? castNode(FuncExpr, node)->funcid : get_opcode(opno);
        if (opno >= FirstNormalObjectId || fn >= FirstNormalObjectId || !OidIsValid(fn))
            return true;
        HeapTuple t = SearchSysCache1(PROCOID, ObjectIdGetDatum(fn));
        bool plain =
            HeapTupleIsValid(t) && plain_function(reinterpret_cast<Form_pg_proc>(GETSTRUCT(t)));
        if (HeapTupleIsValid(t))
            ReleaseSysCache(t);
        if (!plain)
            return true;
        break;
    }
    default:
        return true;
    }
    if (!IsA(node, List) && !plain_type(exprType(node)))
        return true;
    return expression_tree_walker(node, JOBCAP_TREE_WALKER(not_plain), nullptr);
}

// Whether index (of jobs) is one the direct path may write: no expression but the claim index's
// hashtextextended(queue, 0) (queue: the column's number, or none), and a predicate, if
// any, of plain nodes only. Read from pg_index's stored trees, not through the relcache (which
// would fold the predicate and inline SQL functions under the caller's search_path). Anything
// else (an index on a function, a predicate calling one) sends every call to the SQL path,
// whose statements evaluate it as the tables' owner under the pinned search_path.
bool plain_index(Relation index, AttrNumber queue)
{
    // The access method and every key's operator class and type built in: their support
    // functions (a btree's comparison) are PostgreSQL's own.
    if (index->rd_rel->relam >= FirstNormalObjectId)
        return false;
    for (int k = 0; k < IndexRelationGetNumberOfAttributes(index); ++k) {
        Form_pg_attribute a = TupleDescAttr(RelationGetDescr(index), k);
        if (!plain_type(a->atttypid))
            return false;
    }
    bool isnull = false;
    Datum classes =
        SysCacheGetAttr(INDEXRELID, index->rd_indextuple, Anum_pg_index_indclass, &isnull);
    if (isnull)
        return false;
    const oidvector* opclass = reinterpret_cast<const oidvector*>(DatumGetPointer(classes));
    for (int k = 0; k < opclass->dim1; ++k)
        if (opclass->values[k] >= FirstNormalObjectId)
            return false;
    Datum exprs =
        SysCacheGetAttr(INDEXRELID, index->rd_indextuple, Anum_pg_index_indexprs, &isnull);
    if (!isnull && !stored_exprs_are_queue_hash(exprs, queue))
        return false;
    Datum pred = SysCacheGetAttr(INDEXRELID, index->rd_indextuple, Anum_pg_index_indpred, &isnull);
    if (isnull)
        return true;
    char* stored = TextDatumGetCString(pred);
    Node* tree = static_cast<Node*>(stringToNode(stored));
    bool plain = !not_plain(tree, nullptr);
    pfree(stored);
    return plain;
}

// Whether a column written by enqueue may hold value (NULL: none) as its type and constraints
// stand: only NOT NULL is checked (CHECK constraints send every call to the SQL path).
bool may_hold(Form_pg_attribute a, bool isnull)
{
    return !isnull || !a->attnotnull;
}

// The sequence of rel's identity column col, or InvalidOid when col is not one.
Oid identity_of(Relation rel, AttrNumber col)
{
    if (TupleDescAttr(RelationGetDescr(rel), col - 1)->attidentity == '\0')
        return InvalidOid;
    Node* identity = build_column_default(rel, col);
    return identity != nullptr && IsA(identity, NextValueExpr)
               ? castNode(NextValueExpr, identity)->seqid
               : InvalidOid;
}

// The values an INSERT into rel gives the columns it does not list (listed: n column numbers),
// as its rewriter and planner would (build_column_default, constants folded), allocated in
// shape_context. Each default must fold to a constant of built-in functions only (a DBA's
// DEFAULT now() or a function of their own sends the call to the SQL path); a column left
// NULL must be nullable. False otherwise.
bool learn_defaults(Relation rel, const AttrNumber* listed, int n, Datum** defaults, bool** nulls)
{
    TupleDesc desc = RelationGetDescr(rel);
    *defaults =
        static_cast<Datum*>(MemoryContextAllocZero(shape_context, sizeof(Datum) * desc->natts));
    *nulls = static_cast<bool*>(MemoryContextAllocZero(shape_context, sizeof(bool) * desc->natts));
    for (int i = 0; i < desc->natts; ++i) {
        Form_pg_attribute a = TupleDescAttr(desc, i);
        (*nulls)[i] = true;
        if (a->attisdropped)
            continue;
        bool is_listed = false;
        for (int k = 0; k < n; ++k)
            is_listed = is_listed || listed[k] == i + 1;
        if (is_listed)
            continue;
        // A domain's constraints are checked by the executor's coercion: the SQL path's.
        if (get_typtype(a->atttypid) == TYPTYPE_DOMAIN)
            return false;
        // The column's default, or its type's (build_column_default, as the rewriter).
        Node* expr = build_column_default(rel, i + 1);
        if (expr != nullptr) {
            if (not_plain(expr, nullptr))
                return false;
            expr = eval_const_expressions(nullptr, expr);
            if (!IsA(expr, Const))
                return false;
            Const* value = castNode(Const, expr);
            (*nulls)[i] = value->constisnull;
            if (!value->constisnull) {
                MemoryContext caller = MemoryContextSwitchTo(shape_context);
                (*defaults)[i] = datumCopy(value->constvalue, a->attbyval, a->attlen);
                MemoryContextSwitchTo(caller);
            }
        }
        if (!may_hold(a, (*nulls)[i]))
            return false;
    }
    return true;
}

// For enqueueing: the INSERT of the SQL path lists queue, payload, run_at, priority,
// max_attempts and enqueued_at (and dedupe_key, for enqueue_job); job_id must be an identity
// column.
bool learn_job_defaults(Relation jobs, Shape& s)
{
    s.identity = identity_of(jobs, s.job[kJobId]);
    if (!OidIsValid(s.identity))
        return false;
    const AttrNumber listed[] = {s.job[kJobId],     s.job[kQueue],    s.job[kPayload],
                                 s.job[kRunAt],     s.job[kPriority], s.job[kMaxAttempts],
                                 s.job[kEnqueuedAt]};
    TupleDesc desc = RelationGetDescr(jobs);
    // enqueue_job lists dedupe_key (NULL without a key) and max_attempts (NULL: the queue's).
    return learn_defaults(jobs, listed, lengthof(listed), &s.defaults, &s.default_nulls) &&
           may_hold(TupleDescAttr(desc, s.job[kDedupeKey] - 1), true) &&
           may_hold(TupleDescAttr(desc, s.job[kMaxAttempts] - 1), true);
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
    s.errors = get_relname_relid("job_errors", nsp);
    s.failable = s.direct && OidIsValid(s.errors) ? Learnt::unknown : Learnt::no;
    s.known = true;
    shape = s;
    return true;
}

// An equality key on a text column, compared under the index's collation (a btree is ordered
// by it: a key under another collation could descend to the wrong leaf).
void text_key(ScanKey key, Relation index, AttrNumber index_column, Datum value)
{
    ScanKeyEntryInitialize(key, 0, index_column, BTEqualStrategyNumber, InvalidOid,
                           index->rd_indcollation[index_column - 1], F_TEXTEQ, value);
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

// cmd: the statement's command (UPDATE for the settles and claims, INSERT for enqueues, SELECT
// ... FOR NO KEY UPDATE for assert_fence): an UPDATE checks the replica identity of a published
// table when it starts, whether or not it then finds a row.
void begin(Op& op, CmdType cmd = CMD_UPDATE)
{
    CommandCounterIncrement();
    op.snapshot = RegisterSnapshot(GetTransactionSnapshot());
    PushActiveSnapshot(op.snapshot);
    op.cid = GetCurrentCommandId(true);
    op.rel = table_open(shape.jobs, RowExclusiveLock);
    if (cmd != CMD_SELECT)
        CheckCmdReplicaIdentity(op.rel, cmd);
    op.estate = CreateExecutorState();
    op.result = makeNode(ResultRelInfo);
    // No range table entry (index 0): nothing here needs one (no triggers, no permissions
    // checked by the executor, no generated columns).
    InitResultRelInfo(op.result, op.rel, 0, nullptr, 0);
    if (!indexes.valid)
        learn_indexes(op.rel);
    op.opened = nullptr;
    if (indexes.cached)
        op.opened = static_cast<Relation*>(palloc0(sizeof(Relation) * indexes.count));
    else
        ExecOpenIndices(op.result, false);
    op.found = table_slot_create(op.rel, nullptr);
    op.next = MakeSingleTupleTableSlot(RelationGetDescr(op.rel), &TTSOpsHeapTuple);
    int natts = RelationGetDescr(op.rel)->natts;
    op.values = static_cast<Datum*>(palloc0(sizeof(Datum) * natts));
    op.nulls = static_cast<bool*>(palloc0(sizeof(bool) * natts));
    op.replace = static_cast<bool*>(palloc0(sizeof(bool) * natts));
}

void end(Op& op)
{
    pfree(op.values);
    pfree(op.nulls);
    pfree(op.replace);
    ExecDropSingleTupleTableSlot(op.found);
    ExecDropSingleTupleTableSlot(op.next);
    if (op.opened == nullptr) {
        ExecCloseIndices(op.result);
    } else {
        // As ExecCloseIndices: the index locks go, the table's stays.
        for (int i = 0; i < indexes.count; ++i)
            if (op.opened[i] != nullptr)
                index_close(op.opened[i], RowExclusiveLock);
        pfree(op.opened);
    }
    FreeExecutorState(op.estate);
    table_close(op.rel, NoLock);  // the lock is held to the end of the transaction, as UPDATE's
    PopActiveSnapshot();
    UnregisterSnapshot(op.snapshot);
}

// Index i of indexes (cached), opened on first use in this call.
Relation cached_index(Op& op, int i)
{
    if (op.opened[i] == nullptr)
        op.opened[i] = index_open(indexes.oids[i], RowExclusiveLock);
    return op.opened[i];
}

Relation open_index(Op& op, Oid index)
{
    if (op.opened != nullptr) {
        for (int i = 0; i < indexes.count; ++i)
            if (indexes.oids[i] == index)
                return cached_index(op, i);
    } else {
        for (int i = 0; i < op.result->ri_NumIndices; ++i)
            if (RelationGetRelid(op.result->ri_IndexRelationDescs[i]) == index)
                return op.result->ri_IndexRelationDescs[i];
    }
    elog(ERROR, "jobcap: index %u of jobcap.jobs is not open", index);
}

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
NewRow new_row(int natts, const Datum* defaults, const bool* default_nulls)
{
    NewRow row = {static_cast<Datum*>(palloc(sizeof(Datum) * natts)),
                  static_cast<bool*>(palloc(sizeof(bool) * natts))};
    memcpy(row.values, defaults, sizeof(Datum) * natts);
    memcpy(row.nulls, default_nulls, sizeof(bool) * natts);
    return row;
}

// ExecInsertIndexTuples for the cached indexes: the new version (slot) goes into each index
// whose predicate it passes. After an update, an index none of whose columns it replaced is
// hinted as unchanged (bottom-up deletion of the old version's duplicates, as the executor
// hints); a new row's entries never are.
void insert_index_entries(Op& op, TupleTableSlot* slot, bool update)
{
    ExprContext* econtext = GetPerTupleExprContext(op.estate);
    econtext->ecxt_scantuple = slot;
    for (int i = 0; i < indexes.count; ++i) {
        IndexInfo* info = indexes.infos[i];
        if (!info->ii_ReadyForInserts)
            continue;
        if (info->ii_Predicate != NIL && !ExecQual(info->ii_PredicateState, econtext))
            continue;
        bool unchanged = update && info->ii_Expressions == NIL;
        for (int k = 0; unchanged && k < info->ii_NumIndexAttrs; ++k) {
            AttrNumber a = info->ii_IndexAttrNumbers[k];
            unchanged = a > 0 && !op.replace[a - 1];
        }
        Datum values[INDEX_MAX_KEYS];
        bool isnull[INDEX_MAX_KEYS];
        FormIndexDatum(info, slot, op.estate, values, isnull);
        index_insert(cached_index(op, i), values, isnull, &slot->tts_tid, op.rel,
                     info->ii_Unique ? UNIQUE_CHECK_YES : UNIQUE_CHECK_NO, unchanged, info);
    }
    ResetExprContext(econtext);
}

int64 int8_of(TupleTableSlot* slot, JobColumn c, bool* isnull = nullptr)
{
    bool n = false;
    Datum d = slot_getattr(slot, shape.job[c], &n);
    if (isnull != nullptr)
        *isnull = n;
    return n ? 0 : DatumGetInt64(d);
}
int32 int4_of(TupleTableSlot* slot, JobColumn c, bool* isnull = nullptr)
{
    bool n = false;
    Datum d = slot_getattr(slot, shape.job[c], &n);
    if (isnull != nullptr)
        *isnull = n;
    return n ? 0 : DatumGetInt32(d);
}
Oid state_of(TupleTableSlot* slot)
{
    bool n = false;
    Datum d = slot_getattr(slot, shape.job[kState], &n);
    return n ? InvalidOid : DatumGetObjectId(d);
}

// Whether caller may work queue: privileged, or a grant of the queue names a role whose
// privileges the caller has (JOBCAP_MAY_WORK in access.hpp, the same rule in C).
bool may_work(const Access& access, Datum queue, Snapshot snapshot)
{
    if (access.privileged)
        return true;
    Relation grants = table_open(shape.grants, AccessShareLock);
    Relation index = index_open(shape.grants_pkey, AccessShareLock);
    ScanKeyData key;
    text_key(&key, index, 1, queue);
    index_close(index, NoLock);
    key.sk_attno = shape.grant_queue;  // systable_beginscan maps table columns to the index's
    SysScanDesc scan = systable_beginscan(grants, shape.grants_pkey, true, snapshot, 1, &key);
    bool may = false;
    for (HeapTuple t; !may && HeapTupleIsValid(t = systable_getnext(scan));) {
        bool isnull = false;
        Datum granted = heap_getattr(t, shape.grant_queue, RelationGetDescr(grants), &isnull);
        if (isnull ||
            !DatumGetBool(DirectFunctionCall2Coll(texteq, DEFAULT_COLLATION_OID, granted, queue)))
            continue;  // as the statements compare it
        Datum grantee = heap_getattr(t, shape.grant_grantee, RelationGetDescr(grants), &isnull);
        if (isnull)
            continue;
        Oid role = get_role_oid(TextDatumGetCString(grantee), true);
        may = OidIsValid(role) && has_privs_of_role(access.caller, role);
    }
    systable_endscan(scan);
    table_close(grants, NoLock);  // as a statement's locks: held to the end of the transaction
    return may;
}

// A queue's row as the statements read it (in op's snapshot).
struct QueueRow {
    bool paused;
    bool limited;  // max_running set
    int32 cap;
    int64 epoch;
    Datum lease;  // copied
    bool notify;
    Datum backoff_base, backoff_max;  // copied
};

// Reads queue's row: false when there is none (or it has a NULL where the table says NOT NULL:
// a row the direct path does not interpret; the SQL path then decides).
bool read_queue(Op& op, Datum queue, QueueRow* row)
{
    Relation queues = table_open(shape.queues, AccessShareLock);
    Relation index = index_open(shape.queues_pkey, AccessShareLock);
    ScanKeyData key;
    text_key(&key, index, 1, queue);
    index_close(index, NoLock);
    key.sk_attno = shape.queue[kQQueue];
    SysScanDesc scan = systable_beginscan(queues, shape.queues_pkey, true, op.snapshot, 1, &key);
    HeapTuple q = systable_getnext(scan);
    bool found = HeapTupleIsValid(q);
    if (found) {  // the row's own queue, as the statements compare it
        bool isnull = false;
        Datum name = heap_getattr(q, shape.queue[kQQueue], RelationGetDescr(queues), &isnull);
        found = !isnull &&
                DatumGetBool(DirectFunctionCall2Coll(texteq, DEFAULT_COLLATION_OID, name, queue));
    }
    *row = QueueRow{};
    if (found) {
        TupleDesc desc = RelationGetDescr(queues);
        bool n[6] = {};
        row->paused = DatumGetBool(heap_getattr(q, shape.queue[kQPaused], desc, &n[0]));
        heap_getattr(q, shape.queue[kQMaxRunning], desc, &row->limited);
        row->limited = !row->limited;
        row->cap = DatumGetInt32(heap_getattr(q, shape.queue[kQMaxAttempts], desc, &n[1]));
        row->epoch = DatumGetInt64(heap_getattr(q, shape.queue[kQCapEpoch], desc, &n[2]));
        Datum lease = heap_getattr(q, shape.queue[kQLease], desc, &n[3]);
        row->lease = n[3] ? (Datum) 0 : datumCopy(lease, false, 16);
        row->notify = DatumGetBool(heap_getattr(q, shape.queue[kQNotify], desc, &n[4]));
        bool nb = false, nm = false;
        Datum base = heap_getattr(q, shape.queue[kQBackoffBase], desc, &nb);
        Datum max = heap_getattr(q, shape.queue[kQBackoffMax], desc, &nm);
        row->backoff_base = nb ? (Datum) 0 : datumCopy(base, false, 16);
        row->backoff_max = nm ? (Datum) 0 : datumCopy(max, false, 16);
        found = !n[0] && !n[1] && !n[2] && !n[3] && !n[4] && !nb && !nm;
    }
    systable_endscan(scan);
    table_close(queues, NoLock);  // as a statement's locks: held to the end of the transaction
    return found;
}

// Finds job_id's version visible to the snapshot (through the primary key), checks that it is
// (fence, running) of a queue the caller may work, locks its latest version FOR NO KEY UPDATE
// (waiting, as UPDATE does) and checks the same on it (the statement's EvalPlanQual). True with
// the locked version in op.found.
bool lock_current(Op& op, const Access& access, int64 job_id, int64 fence, bool same_queue = false)
{
    Relation index = open_index(op, shape.jobs_pkey);
    ScanKeyData key;
    ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_INT8EQ, Int64GetDatum(job_id));
    IndexScanDesc scan = jobcap_index_beginscan(op.rel, index, op.snapshot, 1, 0);
    index_rescan(scan, &key, 1, nullptr, 0);
    bool seen = index_getnext_slot(scan, ForwardScanDirection, op.found);
    index_endscan(scan);
    if (!seen || int8_of(op.found, kFence) != fence || state_of(op.found) != shape.running)
        return false;
    bool isnull = false;
    Datum queue = slot_getattr(op.found, shape.job[kQueue], &isnull);
    if (isnull || !may_work(access, queue, op.snapshot))
        return false;
    queue = datumCopy(queue, false, -1);  // the slot's buffer tuple is replaced by the lock

    ItemPointerData tid = op.found->tts_tid;
    TM_FailureData failure;
    TM_Result r =
        table_tuple_lock(op.rel, &tid, op.snapshot, op.found, op.cid, LockTupleNoKeyExclusive,
                         LockWaitBlock, TUPLE_LOCK_FLAG_FIND_LAST_VERSION, &failure);
    if (r != TM_Ok)
        return false;  // deleted meanwhile, or changed by this very command
    if (int8_of(op.found, kFence) != fence || state_of(op.found) != shape.running)
        return false;
    // The statement's grant check is part of its WHERE clause: EvalPlanQual evaluates it on the
    // latest version too, whose queue a DBA may have changed meanwhile. fail_job's statement
    // also joins the queue's row as its scan read it: a job moved to another queue matches none.
    Datum latest = slot_getattr(op.found, shape.job[kQueue], &isnull);
    bool same = !isnull &&
                DatumGetBool(DirectFunctionCall2Coll(texteq, DEFAULT_COLLATION_OID, latest, queue));
    if (same_queue)
        return same;
    return !isnull && (access.privileged || same || may_work(access, latest, op.snapshot));
}

// Replaces column c in the next update().
void set(Op& op, JobColumn c, Datum value, bool isnull = false)
{
    int i = shape.job[c] - 1;
    op.values[i] = value;
    op.nulls[i] = isnull;
    op.replace[i] = true;
}

// Writes the new version of the row in op.found (locked by this transaction) with the columns
// set() replaced, and its index entries unless the update was HOT. Leaves the new version in
// op.next.
void update(Op& op)
{
    TupleDesc desc = RelationGetDescr(op.rel);
    bool should_free = false;
    HeapTuple old = ExecFetchSlotHeapTuple(op.found, false, &should_free);
    HeapTuple fresh = heap_modify_tuple(old, desc, op.values, op.nulls, op.replace);
    if (should_free)
        heap_freetuple(old);
    ItemPointerData tid = op.found->tts_tid;
    ExecStoreHeapTuple(fresh, op.next, true);
    JobcapUpdateIndexes how;
    simple_table_tuple_update(op.rel, &tid, op.next, op.snapshot, &how);
    // Not HOT: entries for the new version. (With only btrees cached there is no summarizing
    // index: "summarizing only" would insert nothing.)
    if (op.opened != nullptr && jobcap_update_needs_all_indexes(how))
        insert_index_entries(op, op.next, true);
    else if (op.opened == nullptr && jobcap_update_needs_indexes(how) &&
             op.result->ri_NumIndices > 0)
        jobcap_insert_index_tuples(op.result, op.next, op.estate, how);
    memset(op.replace, 0, sizeof(bool) * desc->natts);
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

bool usable(const char* function, Need need)
{
    const char* why = nullptr;
    if (guc_hot_path != kHotPathDirect) {
        why = "jobcap.hot_path is sql";
    } else if (IsolationUsesXactSnapshot()) {
        why = "the transaction is REPEATABLE READ or SERIALIZABLE";
    } else if (XactReadOnly || RecoveryInProgress()) {
        why = "the transaction is read-only";  // the SQL path raises what UPDATE raises
    } else {
        if (!callback_registered) {
            CacheRegisterRelcacheCallback(forget_shape, (Datum) 0);
            callback_registered = true;
        }
        // The shape is trusted only under the table's lock, taken as UPDATE takes it: locking
        // accepts the invalidations of every change committed before it (a trigger created
        // since this transaction began), and no change to the table commits before this
        // transaction ends. An invalidation arriving while the shape is learned (opening a table
        // accepts them too) means what was learned may be stale: learn again.
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

namespace {
// complete on an open Op.
bool complete_in(Op& op, const Access& access, int64 job_id, int64 fence, TimestampTz now,
                 Datum output, bool no_output)
{
    if (!lock_current(op, access, job_id, fence))
        return false;
    set(op, kState, ObjectIdGetDatum(shape.succeeded));
    set(op, kFinishedAt, TimestampTzGetDatum(now));
    set(op, kLeaseExpiresAt, (Datum) 0, true);
    set(op, kOutput, output, no_output);
    update(op);
    return true;
}
}  // namespace

bool complete(const Access& access, int64 job_id, int64 fence, TimestampTz now, Datum output,
              bool no_output)
{
    Op op;
    begin(op);
    bool done = complete_in(op, access, job_id, fence, now, output, no_output);
    end(op);
    return done;
}

int complete_many(const Access& access, const int64* job_ids, const int64* fences,
                  const Datum* outputs, const bool* no_outputs, int n, TimestampTz now,
                  int* settled)
{
    Op op;
    begin(op);
    *settled = 0;
    int failed = -1;
    for (int i = 0; i < n && failed < 0; ++i) {
        // A pair listed twice is settled once (the SQL path's UPDATE ... FROM joins it twice
        // and updates the row once).
        bool again = false;
        for (int k = 0; k < i && !again; ++k)
            again = job_ids[k] == job_ids[i] && fences[k] == fences[i];
        if (again)
            continue;
        if (complete_in(op, access, job_ids[i], fences[i], now,
                        outputs == nullptr ? (Datum) 0 : outputs[i],
                        outputs == nullptr || no_outputs[i]))
            ++*settled;
        else
            failed = i;
    }
    end(op);
    return failed;
}

bool heartbeat(const Access& access, int64 job_id, int64 fence, Datum extend, bool no_extend,
               TimestampTz now, TimestampTz* expires)
{
    Op op;
    begin(op);
    bool done = lock_current(op, access, job_id, fence);
    if (done) {
        // greatest(lease_expires_at, now + coalesce(extend, lease)): NULLs are ignored.
        bool no_lease = false, no_expiry = false;
        Datum lease = no_extend ? slot_getattr(op.found, shape.job[kLease], &no_lease) : extend;
        Datum expiry = slot_getattr(op.found, shape.job[kLeaseExpiresAt], &no_expiry);
        TimestampTz until = no_expiry ? 0 : DatumGetTimestampTz(expiry);
        if (!no_lease) {
            TimestampTz pushed = DatumGetTimestampTz(
                DirectFunctionCall2(timestamptz_pl_interval, TimestampTzGetDatum(now), lease));
            if (no_expiry || pushed > until)
                until = pushed;
            no_expiry = false;
        }
        // Only a row edited by hand has neither: say so rather than call a current fence stale.
        if (no_expiry)
            ereport(ERROR,
                    (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                     errmsg("job %lld has no lease to extend", static_cast<long long>(job_id)),
                     errhint("Give it one with heartbeat's extend argument.")));
        set(op, kLeaseExpiresAt, TimestampTzGetDatum(until));
        update(op);
        *expires = until;
    }
    end(op);
    return done;
}

bool assert_fence(const Access& access, int64 job_id, int64 fence)
{
    Op op;
    begin(op, CMD_SELECT);
    bool done = lock_current(op, access, job_id, fence);
    end(op);
    return done;
}

int claim(const Access& access, Datum queue, Datum worker, Datum lease, bool no_lease, int32 batch,
          Datum uncounted, TimestampTz now, Claimed* out)
{
    Op op;
    begin(op);

    // The queue's settings, as the statement's one-time filter and InitPlans read them.
    QueueRow q;
    bool open = read_queue(op, queue, &q) && !q.paused && !q.limited;
    int32 queue_cap = q.cap;
    int64 queue_epoch = q.epoch;
    Datum queue_lease = q.lease;
    if (!open || !may_work(access, queue, op.snapshot)) {
        end(op);
        elog(DEBUG2,
             "jobcap: the claim goes to the SQL path: the queue is missing, paused, "
             "capped or not the caller's");
        return -1;
    }
    Datum granted_lease = no_lease ? queue_lease : lease;
    Datum expires =
        DirectFunctionCall2(timestamptz_pl_interval, TimestampTzGetDatum(now), granted_lease);

    ArrayType* skip = DatumGetArrayTypeP(uncounted);
    int nskip = ArrayGetNItems(ARR_NDIM(skip), ARR_DIMS(skip));
    const int64* skipped = reinterpret_cast<const int64*>(ARR_DATA_PTR(skip));

    // The statement's cohort: pending, due, below its cap, not skipped; then locked with SKIP
    // LOCKED and checked again on the locked version.
    auto eligible = [&](TupleTableSlot* slot, int32* cap, bool* no_cap) -> bool {
        if (state_of(slot) != shape.pending)
            return false;
        bool isnull = false;
        Datum q2 = slot_getattr(slot, shape.job[kQueue], &isnull);
        if (isnull ||
            !DatumGetBool(DirectFunctionCall2Coll(texteq, DEFAULT_COLLATION_OID, q2, queue)))
            return false;
        Datum run_at = slot_getattr(slot, shape.job[kRunAt], &isnull);
        if (isnull || DatumGetTimestampTz(run_at) > now)
            return false;
        bool own_null = false, epoch_null = false;
        int32 own = int4_of(slot, kMaxAttempts, &own_null);
        int64 epoch = int8_of(slot, kCapEpoch, &epoch_null);
        // JOBCAP_CAP_OF (spi/cap.hpp): the job's own cap while its budget's epoch is the
        // queue's, else the lower of its own and the queue's.
        if (!epoch_null && epoch == queue_epoch) {
            *cap = own;
            *no_cap = own_null;
        } else {
            *cap = own_null ? queue_cap : Min(own, queue_cap);
            *no_cap = false;
        }
        if (*no_cap || int4_of(slot, kAttempts) >= *cap)
            return false;
        int64 id = int8_of(slot, kJobId);
        for (int i = 0; i < nskip; ++i)
            if (skipped[i] == id)
                return false;
        return true;
    };

    // The claim index's first key is the queue's hash: queues whose names share it share a run
    // of the index, and eligible() compares the name.
    Relation index = open_index(op, shape.jobs_claim);
    ScanKeyData key;
    ScanKeyEntryInitialize(&key, 0, 1, BTEqualStrategyNumber, InvalidOid, InvalidOid, F_INT8EQ,
                           queue_hash(queue));
    IndexScanDesc scan = jobcap_index_beginscan(op.rel, index, op.snapshot, 1, 0);
    index_rescan(scan, &key, 1, nullptr, 0);
    TupleTableSlot* seen = table_slot_create(op.rel, nullptr);
    int claimed = 0;
    while (claimed < batch && index_getnext_slot(scan, ForwardScanDirection, seen)) {
        int32 cap = 0;
        bool no_cap = false;
        if (!eligible(seen, &cap, &no_cap))
            continue;
        ItemPointerData tid = seen->tts_tid;
        TM_FailureData failure;
        TM_Result r =
            table_tuple_lock(op.rel, &tid, op.snapshot, op.found, op.cid, LockTupleNoKeyExclusive,
                             LockWaitSkip, TUPLE_LOCK_FLAG_FIND_LAST_VERSION, &failure);
        if (r != TM_Ok || !eligible(op.found, &cap, &no_cap))
            continue;  // locked by another (SKIP LOCKED), gone, or no longer claimable

        bool first_null = false;
        slot_getattr(op.found, shape.job[kFirstClaimedAt], &first_null);
        int32 attempts = int4_of(op.found, kAttempts) + 1;
        int64 fence = nextval_internal(shape.fences, false);
        set(op, kState, ObjectIdGetDatum(shape.running));
        set(op, kAttempts, Int32GetDatum(attempts));
        set(op, kFence, Int64GetDatum(fence));
        set(op, kLease, granted_lease);
        set(op, kLeaseExpiresAt, expires);
        set(op, kWorker, worker);
        set(op, kClaimedAt, TimestampTzGetDatum(now));
        if (first_null)
            set(op, kFirstClaimedAt, TimestampTzGetDatum(now));
        update(op);

        Claimed& c = out[claimed++];
        c.job_id = int8_of(op.next, kJobId);
        c.fence = fence;
        c.attempts = attempts;
        c.cap = cap;
        c.no_cap = no_cap;
        c.lease_expires_at = DatumGetTimestampTz(expires);
        bool isnull = false;
        Datum payload = slot_getattr(op.next, shape.job[kPayload], &isnull);
        c.payload = isnull ? (Datum) 0 : datumCopy(payload, false, -1);
    }
    index_endscan(scan);
    ExecDropSingleTupleTableSlot(seen);
    end(op);
    return claimed;
}

int enqueue(const Access& access, Datum queue, const Datum* payloads, int n, const EnqueueValues& v,
            int64* ids, bool* notify)
{
    Op op;
    begin(op, CMD_INSERT);
    QueueRow q;
    if (!read_queue(op, queue, &q) || !may_work(access, queue, op.snapshot)) {
        end(op);
        elog(DEBUG2,
             "jobcap: the enqueue goes to the SQL path: the queue is missing or not the "
             "caller's");
        return -1;
    }
    *notify = q.notify;

    // Every column as the SQL path's INSERT sets it: listed ones from the call, the rest their
    // (constant) defaults.
    TupleDesc desc = RelationGetDescr(op.rel);
    NewRow row = new_row(desc->natts, shape.defaults, shape.default_nulls);
    auto put = [&](JobColumn c, Datum value, bool isnull) {
        row.set(shape.job[c], value, isnull);
    };
    put(kQueue, queue, false);
    put(kRunAt, TimestampTzGetDatum(v.run_at), false);
    put(kPriority, Int32GetDatum(v.priority), false);
    put(kMaxAttempts, Int32GetDatum(v.max_attempts), v.no_max_attempts);
    put(kEnqueuedAt, TimestampTzGetDatum(v.now), false);
    if (v.lists_dedupe_key)
        put(kDedupeKey, (Datum) 0, true);

    // In chunks, as COPY FROM buffers its rows: one heap_multi_insert per chunk (one WAL record
    // per page instead of one per row), then each row's index entries, in payload order.
    constexpr int kChunk = 1000;
    int chunk = Min(n, kChunk);
    TupleTableSlot** slots =
        static_cast<TupleTableSlot**>(palloc(sizeof(TupleTableSlot*) * Max(chunk, 1)));
    for (int i = 0; i < chunk; ++i)
        slots[i] = MakeSingleTupleTableSlot(desc, &TTSOpsHeapTuple);
    MemoryContext rows =
        AllocSetContextCreate(CurrentMemoryContext, "jobcap enqueue rows", ALLOCSET_DEFAULT_SIZES);
    for (int first = 0; first < n; first += chunk) {
        int count = Min(chunk, n - first);
        MemoryContext caller = MemoryContextSwitchTo(rows);
        for (int i = 0; i < count; ++i) {
            int64 id = nextval_internal(shape.identity, false);
            ids[first + i] = id;
            put(kJobId, Int64GetDatum(id), false);
            put(kPayload, payloads[first + i], false);
            ExecStoreHeapTuple(heap_form_tuple(desc, row.values, row.nulls), slots[i], true);
        }
        table_multi_insert(op.rel, slots, count, op.cid, 0, nullptr);
        MemoryContextSwitchTo(caller);
        for (int i = 0; i < count; ++i) {
            if (op.opened != nullptr)
                insert_index_entries(op, slots[i], false);
            else if (op.result->ri_NumIndices > 0)
                jobcap_insert_index_tuples_new(op.result, slots[i], op.estate);
            ResetExprContext(GetPerTupleExprContext(op.estate));
            ExecClearTuple(slots[i]);
        }
        MemoryContextReset(rows);
    }
    MemoryContextDelete(rows);
    for (int i = 0; i < chunk; ++i)
        ExecDropSingleTupleTableSlot(slots[i]);
    pfree(slots);
    pfree(row.values);
    pfree(row.nulls);
    end(op);
    return n;
}

namespace {

// jobcap.backoff(attempt, base, max) (functions/backoff.cpp) for a queue's stored spans, which
// it checks as its arguments.
Datum backoff(int32 attempt, Datum base, Datum max)
{
    auto span = [](Datum d) {
        const Interval* iv = DatumGetIntervalP(d);
        core::Span s;
        s.months = iv->month;
        s.days = iv->day;
        s.usec = iv->time;
        return s;
    };
    core::Span b = span(base), m = span(max);
    if (core::Problem p = core::check_span("backoff_base", b, true, false))
        raise_problem(p);
    if (core::Problem p = core::check_span("backoff_max", m, true, false))
        raise_problem(p);
    Interval* delay = static_cast<Interval*>(palloc0(sizeof(Interval)));
    delay->time = core::backoff_delay(attempt, core::span_usec(b), core::span_usec(m),
                                      pg_prng_double(&pg_global_prng_state));
    return IntervalPGetDatum(delay);
}

// The history of a failed attempt (JOBCAP_HISTORY_CTES in spi/history.hpp): the job's history
// cut to its newest jobcap.error_history - 1 rows, then a row for the job's new version in
// op.next (unless jobcap.error_history is 0) — in the order the statement's ModifyTable nodes
// run its two CTEs (what logical decoding shows), with the same outcome: the statement's DELETE
// does not see its INSERT's row either.
void add_history(Op& op, Relation errors, const Access& access, const char* kind, Datum error,
                 bool no_error, TimestampTz at)
{
    TupleDesc desc = RelationGetDescr(errors);
    ResultRelInfo* result = makeNode(ResultRelInfo);
    InitResultRelInfo(result, errors, 0, nullptr, 0);
    ExecOpenIndices(result, false);
    int64 job_id = int8_of(op.next, kJobId);
    // DELETE ... WHERE job_id = $job AND seq <= (the seq of the job's row at OFFSET
    // greatest(error_history - 1, 0), newest first): the rows from that position on, newest first.
    int keep = Max(guc_error_history - 1, 0);
    Relation index = index_open(shape.errors_by_job, RowExclusiveLock);
    ScanKeyData key;
    ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_INT8EQ, Int64GetDatum(job_id));
    IndexScanDesc scan = jobcap_index_beginscan(errors, index, op.snapshot, 1, 0);
    index_rescan(scan, &key, 1, nullptr, 0);
    TupleTableSlot* seen = table_slot_create(errors, nullptr);
    int64 bound = 0;  // the subquery's seq: rows of the job up to it go
    for (int position = 0; index_getnext_slot(scan, BackwardScanDirection, seen); ++position) {
        if (position < keep)
            continue;
        bool isnull = false;
        Datum seq = slot_getattr(seen, shape.error[kESeq], &isnull);
        if (position == keep)
            bound = isnull ? 0 : DatumGetInt64(seq);
        ItemPointerData tid = seen->tts_tid;
        TM_FailureData failure;
        TM_Result r = table_tuple_delete(errors, &tid, op.cid, op.snapshot, InvalidSnapshot, true,
                                         &failure, false);
        if (r == TM_Updated) {
            // Changed by another transaction that committed (a DBA editing a row): as the
            // statement's EvalPlanQual, its latest version, locked, goes if it still matches.
            r = table_tuple_lock(errors, &tid, op.snapshot, seen, op.cid, LockTupleExclusive,
                                 LockWaitBlock, TUPLE_LOCK_FLAG_FIND_LAST_VERSION, &failure);
            if (r == TM_Ok) {
                bool n1 = false, n2 = false;
                Datum job = slot_getattr(seen, shape.error[kEJobId], &n1);
                Datum latest = slot_getattr(seen, shape.error[kESeq], &n2);
                if (!n1 && !n2 && DatumGetInt64(job) == job_id && DatumGetInt64(latest) <= bound) {
                    tid = seen->tts_tid;
                    r = table_tuple_delete(errors, &tid, op.cid, op.snapshot, InvalidSnapshot, true,
                                           &failure, false);
                }
            }
        }
        // Anything else: deleted meanwhile (retention, a requeue's cleanup), which the
        // statement's DELETE skips too, or the latest version no longer the job's.
        if (r != TM_Ok && r != TM_Deleted && r != TM_Updated)
            elog(ERROR, "jobcap: history row of job %lld could not be pruned (%d)",
                 static_cast<long long>(job_id), static_cast<int>(r));
    }
    index_endscan(scan);
    ExecDropSingleTupleTableSlot(seen);
    index_close(index, NoLock);

    if (guc_error_history > 0) {
        NewRow row = new_row(desc->natts, shape.error_defaults, shape.error_default_nulls);
        auto put = [&](ErrorColumn c, Datum value, bool isnull) {
            row.set(shape.error[c], value, isnull);
        };
        auto copy = [&](ErrorColumn c, JobColumn from) {
            bool isnull = false;
            put(c, slot_getattr(op.next, shape.job[from], &isnull), isnull);
        };
        put(kESeq, Int64GetDatum(nextval_internal(shape.errors_identity, false)), false);
        copy(kEJobId, kJobId);
        copy(kEQueue, kQueue);
        copy(kEAttempt, kAttempts);
        copy(kEFence, kFence);
        put(kEKind, CStringGetTextDatum(kind), false);
        copy(kEWorker, kWorker);
        put(kEError, error, no_error);
        put(kEAt, TimestampTzGetDatum(at), false);
        TupleTableSlot* slot = MakeSingleTupleTableSlot(desc, &TTSOpsHeapTuple);
        ExecStoreHeapTuple(heap_form_tuple(desc, row.values, row.nulls), slot, true);
        if (desc->constr != nullptr) {
            // NOT NULL and CHECK, as ExecInsert checks them, as the tables' owner (whom the
            // SQL path runs as: a violation's detail shows the row to whoever may read it).
            as_owner(access.owner, [&] { ExecConstraints(result, slot, op.estate); });
        }
        CheckCmdReplicaIdentity(errors, CMD_INSERT);
        simple_table_tuple_insert(errors, slot);
        if (result->ri_NumIndices > 0)
            jobcap_insert_index_tuples_new(result, slot, op.estate);
        ExecDropSingleTupleTableSlot(slot);
    }
    ExecCloseIndices(result);
}

}  // namespace

bool fail(const Access& access, int64 job_id, int64 fence, Datum error, bool no_error,
          Datum retry_in, bool no_retry_in, const char* kind, TimestampTz now, Datum* state,
          char** wake)
{
    Op op;
    begin(op);
    // The statement's DELETE from job_errors checks the replica identity when it starts,
    // whether or not it then deletes a row.
    Relation errors = table_open(shape.errors, RowExclusiveLock);
    CheckCmdReplicaIdentity(errors, CMD_DELETE);
    // The statement joins the job's queue: a job whose queue is gone matches no row.
    QueueRow q;
    bool isnull = false;
    bool done = lock_current(op, access, job_id, fence, true) &&
                read_queue(op, slot_getattr(op.found, shape.job[kQueue], &isnull), &q);
    if (done) {
        // The cap rule (JOBCAP_CAP, spi/cap.hpp): attempts >= cap is NULL, hence a retry, for
        // a budget without a cap.
        bool own_null = false, epoch_null = false;
        int32 own = int4_of(op.found, kMaxAttempts, &own_null);
        int64 epoch = int8_of(op.found, kCapEpoch, &epoch_null);
        int32 attempts = int4_of(op.found, kAttempts);
        bool dead = !epoch_null && epoch == q.epoch
                        ? !own_null && attempts >= own
                        : attempts >= (own_null ? q.cap : Min(own, q.cap));
        set(op, kState, ObjectIdGetDatum(dead ? shape.dead : shape.pending));
        if (dead) {
            set(op, kFinishedAt, TimestampTzGetDatum(now));
        } else {
            Datum delay = no_retry_in ? backoff(attempts, q.backoff_base, q.backoff_max) : retry_in;
            set(op, kRunAt,
                DirectFunctionCall2(timestamptz_pl_interval, TimestampTzGetDatum(now), delay));
            set(op, kFinishedAt, (Datum) 0, true);
        }
        set(op, kLeaseExpiresAt, (Datum) 0, true);
        update(op);
        add_history(op, errors, access, kind, error, no_error, now);
        *state = ObjectIdGetDatum(dead ? shape.dead : shape.pending);
        *wake = !dead && q.notify
                    ? TextDatumGetCString(slot_getattr(op.next, shape.job[kQueue], &isnull))
                    : nullptr;
    }
    table_close(errors, NoLock);  // as a statement's locks: held to the end of the transaction
    end(op);
    return done;
}

}  // namespace jobcap::direct
