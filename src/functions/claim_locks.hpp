// The claims' lock of a queue's row at REPEATABLE READ and SERIALIZABLE (claim.cpp).
#pragma once

#include "pg.hpp"

namespace jobcap {

// A claim reads its queue's row (paused, limits, fairness) in its statement's snapshot. At
// REPEATABLE READ or SERIALIZABLE that is the transaction's, which may predate an alter_queue or
// pause_queue committed since: the claim would hand out jobs as if the queue were still open.
// So, there, a claim first locks the queue's row: locking a row updated after the snapshot
// raises a serialization failure (40001), and the lock, held to commit, holds such a change off
// until the claim's transaction ends. Such claims of one queue take turns. At READ COMMITTED
// these do nothing (each statement reads the queue anew). Inside the claim's SPI connection.
void lock_queue_at_snapshot(Datum queue);

// The same for the queue of job_id (claim_job_by_id); nothing when there is no such job.
void lock_job_queue_at_snapshot(int64 job_id);

}  // namespace jobcap
