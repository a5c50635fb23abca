#include "spi/plans.hpp"

#include "spi/citus.hpp"

namespace jobcap {

Statement* Statement::all = nullptr;

Statement::Statement(const char* name_, const char* sql_, std::initializer_list<Oid> argtypes_,
                     PlanKind kind_)
    : name(name_),
      sql(sql_),
      nargs(static_cast<int>(argtypes_.size())),
      argtypes(),
      kind(kind_),
      next(all)
{
    int i = 0;
    for (Oid t : argtypes_)
        if (i < kMaxStatementArgs)
            argtypes[i++] = t;
    all = this;
}

Params& Params::add(Datum value, bool is_null)
{
    if (count >= kMaxStatementArgs)
        elog(ERROR, "jobcap: more than %d statement parameters", kMaxStatementArgs);
    values[count] = is_null ? (Datum) 0 : value;
    nulls[count++] = is_null ? 'n' : ' ';
    nulls[count] = '\0';
    return *this;
}

SPIPlanPtr prepare_kept(const Statement& s, const char* sql)
{
    if (s.nargs > kMaxStatementArgs)
        elog(ERROR, "jobcap: statement %s has more than %d parameters", s.name, kMaxStatementArgs);
    int options = s.kind == PlanKind::custom ? 0 : CURSOR_OPT_GENERIC_PLAN;
    SPIPlanPtr plan = SPI_prepare_cursor(sql, s.nargs, const_cast<Oid*>(s.argtypes), options);
    if (plan == nullptr)
        elog(ERROR, "jobcap: could not prepare statement %s: %s", s.name,
             SPI_result_code_string(SPI_result));
    if (SPI_keepplan(plan) != 0)
        elog(ERROR, "jobcap: could not keep a prepared statement");
    return plan;
}

namespace {

// The plan of s: on a Citus node, inside a call routed to a shard, the plan of s on that shard.
SPIPlanPtr prepared(Statement& s)
{
    if (unlikely(citus::routed != nullptr))
        return citus::plan_on_shard(s);
    if (s.plan == nullptr)
        s.plan = prepare_kept(s, s.sql);
    return s.plan;
}

uint64 checked(int rc, int expected)
{
    if (rc != expected)
        elog(ERROR, "jobcap: statement returned %s, expected %s", SPI_result_code_string(rc),
             SPI_result_code_string(expected));
    return SPI_processed;
}

// The plan cache may (re)plan inside SPI_execute_plan, after any invalidation: the steering
// settings are in force around every execution, at a cost of four GUC assignments. JIT is
// decided when planning, from the plan's cost, which the disabled paths inflate; it would
// compile these small statements on every execution, so it is off too. An error in
// between needs no cleanup: transaction or subtransaction abort restores the settings.
int execute_steered(SPIPlanPtr plan, Datum* values, const char* nulls)
{
    static const char* const kOff[] = {"enable_seqscan", "enable_bitmapscan", "enable_sort", "jit"};
    int nest = NewGUCNestLevel();
    for (const char* name : kOff)
        (void) set_config_option(name, "off", PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE, true, 0,
                                 false);
    int rc = SPI_execute_plan(plan, values, nulls, false, 0);
    AtEOXact_GUC(true, nest);
    return rc;
}

void check_count(const Statement& s, const Params& p)
{
    if (p.count != s.nargs)
        elog(ERROR, "jobcap: statement %s takes %d parameters, %d given", s.name, s.nargs, p.count);
}

}  // namespace

uint64 execute(Statement& s, const Params& p, int expected)
{
    check_count(s, p);
    SPIPlanPtr plan = prepared(s);
    Datum* values = const_cast<Datum*>(p.values);
    int rc = s.kind == PlanKind::steered ? execute_steered(plan, values, p.nulls)
                                         : SPI_execute_plan(plan, values, p.nulls, false, 0);
    return checked(rc, expected);
}

uint64 execute_fresh(Statement& s, const Params& p, int expected)
{
    check_count(s, p);
    return checked(SPI_execute_snapshot(prepared(s), const_cast<Datum*>(p.values), p.nulls,
                                        GetLatestSnapshot(), InvalidSnapshot, false, false, 0),
                   expected);
}

Datum result_column(uint64 row, int column, bool* is_null)
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
