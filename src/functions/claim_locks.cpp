#include "functions/claim_locks.hpp"
#include "spi/plans.hpp"

extern "C" {
#include "access/xact.h"
}

namespace jobcap {
namespace statements {

JOBCAP_STATEMENT(lock_queue_at_snapshot,
                 "SELECT FROM jobcap.queues q WHERE q.queue = $1 FOR NO KEY UPDATE OF q",
                 {TEXTOID});
JOBCAP_STATEMENT(lock_job_queue_at_snapshot,
                 "SELECT FROM jobcap.queues q"
                 " WHERE q.queue = (SELECT j.queue FROM jobcap.jobs j WHERE j.job_id = $1)"
                 " FOR NO KEY UPDATE OF q",
                 {INT8OID});

}  // namespace statements

void lock_queue_at_snapshot(Datum queue)
{
    if (!IsolationUsesXactSnapshot())
        return;
    Params p;
    p.add(queue);
    execute(statements::lock_queue_at_snapshot, p, SPI_OK_SELECT);
}

void lock_job_queue_at_snapshot(int64 job_id)
{
    if (!IsolationUsesXactSnapshot())
        return;
    Params p;
    p.add(Int64GetDatum(job_id));
    execute(statements::lock_job_queue_at_snapshot, p, SPI_OK_SELECT);
}

}  // namespace jobcap
