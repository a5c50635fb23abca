// What the direct path may do itself, decided from the catalogs: which expressions, types,
// functions and indexes are PostgreSQL's own code only (what it may evaluate, compare or write
// as the caller), what an INSERT's defaults fold to, and what only the executor would do for a
// table. Anything else sends the call to the SQL path (docs/direct_path.md lists it).
#include "direct/vet.hpp"

namespace jobcap::direct {
namespace {

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

// Whether stored (pg_index.indexprs) is the claim index's hashtextextended(queue, 0) alone
// (is_queue_hash).
bool stored_exprs_are_queue_hash(Datum stored, AttrNumber queue)
{
    char* str = TextDatumGetCString(stored);
    Node* tree = static_cast<Node*>(stringToNode(str));
    pfree(str);
    return tree != nullptr && IsA(tree, List) && exprs_are_queue_hash(castNode(List, tree), queue);
}

// Whether stored (pg_index.indpred) is exactly "column = value" for an enum column (the claim
// index's "state = 'pending'"), and with not_null a valid column, that and "not_null IS NOT
// NULL" (jobs_keys' "state = 'pending' AND concurrency_key IS NOT NULL").
bool predicate_is(Datum stored, AttrNumber column, Oid value, AttrNumber not_null)
{
    Node* n = static_cast<Node*>(stringToNode(TextDatumGetCString(stored)));
    // Stored as a one-element list, or as an AND of the two (pg_index keeps it as written).
    List* clauses = IsA(n, List)      ? castNode(List, n)
                    : is_andclause(n) ? castNode(BoolExpr, n)->args
                                      : list_make1(n);
    if (list_length(clauses) == 1 && is_andclause(linitial(clauses)))
        clauses = castNode(BoolExpr, linitial(clauses))->args;
    if (list_length(clauses) != (not_null == InvalidAttrNumber ? 1 : 2))
        return false;
    n = static_cast<Node*>(linitial(clauses));
    if (not_null != InvalidAttrNumber) {
        Node* test = static_cast<Node*>(lsecond(clauses));
        if (!IsA(test, NullTest))
            return false;
        NullTest* t = castNode(NullTest, test);
        if (t->nulltesttype != IS_NOT_NULL || t->argisrow || !IsA(t->arg, Var) ||
            castNode(Var, t->arg)->varattno != not_null)
            return false;
    }
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

}  // namespace

bool exprs_are_queue_hash(const List* exprs, AttrNumber queue)
{
    return list_length(exprs) == 1 && is_queue_hash(static_cast<Node*>(linitial(exprs)), queue);
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
           TupleDescAttr(desc, job[kOutput] - 1)->attnotnull ||
           TupleDescAttr(desc, job[kFinishedAt] - 1)->attnotnull ||
           jobcap_has_unvalidated_not_null(desc);
}

bool index_on(Oid idx, Oid rel, const AttrNumber* keys, int nkeys, AttrNumber column, Oid value,
              AttrNumber hashed, AttrNumber not_null)
{
    HeapTuple t = SearchSysCache1(INDEXRELID, ObjectIdGetDatum(idx));
    if (!HeapTupleIsValid(t))
        return false;
    Form_pg_index index = reinterpret_cast<Form_pg_index>(GETSTRUCT(t));
    bool ok = index->indrelid == rel && index->indnkeyatts >= nkeys && index->indisvalid &&
              index->indisready && !index->indcheckxmin;
    bool isnull = false;
    Datum pred = SysCacheGetAttr(INDEXRELID, t, Anum_pg_index_indpred, &isnull);
    ok = ok &&
         (column == InvalidAttrNumber ? isnull
                                      : !isnull && predicate_is(pred, column, value, not_null));
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
    // Each key in its type's default btree operator class: the order the statements compare
    // keys in (text_pattern_ops, built in too, orders text by its bytes whatever the collation).
    Datum classes = SysCacheGetAttr(INDEXRELID, t, Anum_pg_index_indclass, &isnull);
    const oidvector* opclass =
        isnull ? nullptr : reinterpret_cast<const oidvector*>(DatumGetPointer(classes));
    for (int i = 0; ok && i < nkeys; ++i) {
        Oid type = keys[i] == InvalidAttrNumber ? INT8OID : get_atttype(rel, keys[i]);
        ok = opclass != nullptr && opclass->values[i] == GetDefaultOpClass(type, BTREE_AM_OID);
    }
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

bool may_hold(Form_pg_attribute a, bool isnull)
{
    return !isnull || !a->attnotnull;
}

Oid identity_of(Relation rel, AttrNumber col)
{
    if (TupleDescAttr(RelationGetDescr(rel), col - 1)->attidentity == '\0')
        return InvalidOid;
    Node* identity = build_column_default(rel, col);
    return identity != nullptr && IsA(identity, NextValueExpr)
               ? castNode(NextValueExpr, identity)->seqid
               : InvalidOid;
}

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

}  // namespace jobcap::direct
