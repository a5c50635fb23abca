// jobcap.statements(): the name, parameter types and SQL text of every statement jobcap
// prepares, so that a DBA (and the plan-shape tests) can PREPARE and EXPLAIN exactly what runs.
#include "spi/access.hpp"
#include "boundary.hpp"
#include "spi/plans.hpp"

using namespace jobcap;

JOBCAP_FUNCTION(statements, Duty::operator_)
{
    InitMaterializedSRF(fcinfo, 0);
    ReturnSetInfo* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
    for (const Statement* s = Statement::all; s != nullptr; s = s->next) {
        Datum* types = static_cast<Datum*>(palloc(sizeof(Datum) * (s->nargs + 1)));
        for (int i = 0; i < s->nargs; ++i)
            types[i] = ObjectIdGetDatum(s->argtypes[i]);
        Datum values[3] = {CStringGetTextDatum(s->name),
                           PointerGetDatum(construct_array(types, s->nargs, REGTYPEOID, sizeof(Oid),
                                                           true, TYPALIGN_INT)),
                           CStringGetTextDatum(s->sql)};
        bool nulls[3] = {false, false, false};
        tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
    }
    return (Datum) 0;
}
