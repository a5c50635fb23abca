// What the direct path may do itself (src/direct/vet.cpp): the checks that decide, from the
// catalogs, whether a table, an index, an expression or a default is one the direct path
// handles as the executor would. Private to src/direct/.
#pragma once

#include "direct/shape.hpp"

namespace jobcap::direct {

// Whether exprs (an index's expressions) are the claim index's hashtextextended(queue, 0) alone
// (queue: the column's number), the one index expression the direct path evaluates itself.
bool exprs_are_queue_hash(const List* exprs, AttrNumber queue);

// The number of column name in desc when its type is type (InvalidOid: any), else
// InvalidAttrNumber.
AttrNumber column(TupleDesc desc, const char* name, Oid type);

// Whether the executor would do more for an UPDATE of rel than the direct path does: fire
// triggers, apply row security or rules, check constraints (a partition's too), compute
// generated columns; or whether rel is not a heap. The direct path writes NULL only into
// lease_expires_at, output and finished_at (a failure that retries): NOT NULL on any of them
// would be a check the executor makes, as would a NOT NULL not validated (PostgreSQL 18's NOT
// VALID) on any column, whose NULLs every new version copies. Columns the direct path sets are
// never NULL otherwise (the worker's name and lease are checked arguments).
bool executor_needed(Relation rel, const AttrNumber* job);

// Whether index idx is on table rel with exactly these leading key columns, and no predicate
// but (when column is valid) "column = value", and "not_null IS NOT NULL" with it when not_null
// is valid: an index the direct path scans must hold every row the statement's scan would find.
bool index_on(Oid idx, Oid rel, const AttrNumber* keys, int nkeys,
              AttrNumber column = InvalidAttrNumber, Oid value = InvalidOid,
              AttrNumber hashed = InvalidAttrNumber, AttrNumber not_null = InvalidAttrNumber);

// The oid of enum type's label, or InvalidOid.
Oid state_value(Oid type, const char* label);

// Whether node (a stored index predicate, a CHECK constraint, a column default) uses only
// built-in operators and functions written in C, on plain types (no SQL or PL function, nothing
// resolved by name, nothing run as the caller but PostgreSQL's own code), in the node kinds such
// expressions are made of. Returns true at the first node that is not (an
// expression_tree_walker callback).
bool not_plain(Node* node, void*);

// Whether index (of jobs) is one the direct path may write: no expression but the claim index's
// hashtextextended(queue, 0) (queue: the column's number, or none), and a predicate, if
// any, of plain nodes only. Read from pg_index's stored trees, not through the relcache (which
// would fold the predicate and inline SQL functions under the caller's search_path). Anything
// else (an index on a function, a predicate calling one) sends every call to the SQL path,
// whose statements evaluate it as the tables' owner under the pinned search_path.
bool plain_index(Relation index, AttrNumber queue);

// Whether a column written by enqueue may hold value (NULL: none) as its type and constraints
// stand: only NOT NULL is checked (CHECK constraints send every call to the SQL path).
bool may_hold(Form_pg_attribute a, bool isnull);

// The sequence of rel's identity column col, or InvalidOid when col is not one.
Oid identity_of(Relation rel, AttrNumber col);

// The values an INSERT into rel gives the columns it does not list (listed: n column numbers),
// as its rewriter and planner would (build_column_default, constants folded), allocated in
// shape_context. Each default must fold to a constant of built-in functions only (a DBA's
// DEFAULT now() or a function of their own sends the call to the SQL path); a column left
// NULL must be nullable. False otherwise.
bool learn_defaults(Relation rel, const AttrNumber* listed, int n, Datum** defaults, bool** nulls);

}  // namespace jobcap::direct
