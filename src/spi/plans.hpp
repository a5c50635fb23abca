// Statements prepared once per backend and kept. Each family of SQL functions declares its
// statements as `Statement` objects next to the code that runs them; the plan is made on first
// use, kept with SPI_keepplan, and re-validated by PostgreSQL's plan cache when the tables
// change (so DROP/CREATE EXTENSION in one session is safe).
#pragma once

#include "pg.hpp"

#include <initializer_list>

namespace jobcap {

// How a statement is planned. custom: PostgreSQL's plan cache decides. generic: one generic plan
// is kept; statements that check the caller's grants (access.hpp) need it, because for a
// privileged caller the caller parameter is NULL, a custom plan folds the grant check away and
// so always looks cheaper, and the plan cache would plan again on every call. steered: one
// generic plan made with sequential scans, bitmap scans, sorts and JIT disabled (the claims,
// complete_jobs and the reaper): planning a claim costs twice what running it does, and a plan
// made from statistics of an empty table must still walk the claim index in order and reach
// claimed rows by primary key.
enum class PlanKind : uint8 { custom, generic, steered };

constexpr int kMaxStatementArgs = 16;

// A statement jobcap prepares: made on first use, kept with SPI_keepplan, re-validated by
// PostgreSQL's plan cache when the tables change (so DROP/CREATE EXTENSION in one session is
// safe). Every Statement links itself into Statement::all when the library is loaded (plain
// pointers, nothing of PostgreSQL's), so that jobcap.statements() shows each of them by its name.
struct Statement {
    Statement(const char* name, const char* sql, std::initializer_list<Oid> argtypes,
              PlanKind kind = PlanKind::custom);

    const char* name;
    const char* sql;
    int nargs;
    Oid argtypes[kMaxStatementArgs];
    PlanKind kind;
    SPIPlanPtr plan = nullptr;
    Statement* next;

    static Statement* all;
};

// Defines Statement NAME, shown by jobcap.statements() as "NAME":
//     JOBCAP_STATEMENT(job_exists, "SELECT FROM jobcap.jobs WHERE job_id = $1", {INT8OID});
#define JOBCAP_STATEMENT(name, ...) Statement name(#name, __VA_ARGS__)

struct Access;

// The arguments of one execution, added in the statement's parameter order:
//     Params p;
//     p.add(Int64GetDatum(job_id)).add(lease, no_lease).add_caller(access);
//     execute(statements::heartbeat, p, SPI_OK_UPDATE_RETURNING);
// execute() checks that as many were added as the statement has parameters.
struct Params {
    Datum values[kMaxStatementArgs];
    char nulls[kMaxStatementArgs + 1] = {};  // SPI's flags: 'n' for null, ' ' otherwise
    int count = 0;

    Params& add(Datum value, bool is_null = false);
    // The $caller parameter of a statement that checks grants (spi/access.hpp): the caller, or
    // NULL for a privileged caller, whom no grant is needed for.
    Params& add_caller(const Access& access);
};

// Prepares sql as statement s (its parameters and kind) and keeps the plan; s.sql itself, or
// s retargeted to a Citus shard (citus.hpp).
SPIPlanPtr prepare_kept(const Statement& s, const char* sql);

// Executes s inside an open SPI connection with the arguments p and checks that SPI answered
// `expected`. Returns the row count.
uint64 execute(Statement& s, const Params& p, int expected);

// The same, but reading with a fresh snapshot (the latest committed state) instead of the
// transaction's: for checks that must see what a REPEATABLE READ snapshot cannot.
uint64 execute_fresh(Statement& s, const Params& p, int expected);

// Reads column `column` (1-based) of result row `row`; is_null may be nullptr when the column
// cannot be null.
Datum result_column(uint64 row, int column, bool* is_null = nullptr);

}  // namespace jobcap
