#include "plans.hpp"

namespace jobcap {

namespace {

SPIPlanPtr prepared(Statement& s)
{
    if (s.plan == nullptr) {
        SPIPlanPtr plan = SPI_prepare(s.sql, s.nargs, s.argtypes);
        if (plan == nullptr)
            elog(ERROR, "jobcap: could not prepare statement: %s", SPI_result_code_string(SPI_result));
        if (SPI_keepplan(plan) != 0)
            elog(ERROR, "jobcap: could not keep a prepared statement");
        s.plan = plan;
    }
    return s.plan;
}

uint64 checked(int rc, int expected)
{
    if (rc != expected)
        elog(ERROR, "jobcap: statement returned %s, expected %s", SPI_result_code_string(rc),
             SPI_result_code_string(expected));
    return SPI_processed;
}

}  // namespace

uint64 run(Statement& s, Datum* values, const char* nulls, int expected)
{
    return checked(SPI_execute_plan(prepared(s), values, nulls, false, 0), expected);
}

uint64 run_fresh(Statement& s, Datum* values, const char* nulls, int expected)
{
    return checked(SPI_execute_snapshot(prepared(s), values, nulls, GetLatestSnapshot(),
                                        InvalidSnapshot, false, false, 0),
                   expected);
}

Datum column(uint64 row, int column, bool* is_null)
{
    bool null = false;
    Datum d = SPI_getbinval(SPI_tuptable->vals[row], SPI_tuptable->tupdesc, column, &null);
    if (is_null != nullptr)
        *is_null = null;
    else if (null)
        elog(ERROR, "jobcap: unexpected null in column %d", column);
    return d;
}

}  // namespace jobcap
