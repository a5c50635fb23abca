// Statements prepared once per backend and kept. Each family of SQL functions declares its
// statements as `Statement` objects next to the code that runs them; the plan is made on first
// use, kept with SPI_keepplan, and re-validated by PostgreSQL's plan cache when the tables
// change (so DROP/CREATE EXTENSION in one session is safe).
#pragma once

#include "pg.hpp"

namespace jobcap {

struct Statement {
    const char* sql;
    int nargs;
    Oid argtypes[10];
    SPIPlanPtr plan;
    // Steered statements (the claims, complete_jobs and the reaper) keep ONE generic plan, made
    // with sequential scans, bitmap scans, sorts and JIT disabled: planning a claim costs twice
    // what running it does, and a plan made from statistics of an empty table must still walk
    // the claim index in order and reach claimed rows by primary key. Plain statements leave
    // the choice to PostgreSQL's plan cache.
    bool steered;
    // Statements that check the caller's grants (access.hpp) keep one generic plan as well:
    // for a privileged caller the caller parameter is NULL, a custom plan folds the grant check
    // away and so always looks cheaper, and the plan cache would plan again on every call.
    bool generic;
};

// Executes s inside an open SPI connection with the given arguments (nulls as SPI wants them:
// 'n' for null, ' ' otherwise) and checks that SPI answered `expected`. Returns the row count.
uint64 execute(Statement& s, Datum* values, const char* nulls, int expected);

// The same, but reading with a fresh snapshot (the latest committed state) instead of the
// transaction's: for checks that must see what a REPEATABLE READ snapshot cannot.
uint64 execute_fresh(Statement& s, Datum* values, const char* nulls, int expected);

// Reads column `column` (1-based) of result row `row`; is_null may be nullptr when the column
// cannot be null.
Datum result_column(uint64 row, int column, bool* is_null = nullptr);

}  // namespace jobcap
