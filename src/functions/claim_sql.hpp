// The SQL that every claim statement shares (functions/claim.cpp, functions/claim_keyed.cpp):
// the UPDATE that claims a locked cohort and the guards on the queue's row.
#pragma once

#include "spi/access.hpp"
#include "spi/cap.hpp"

// The locking scan is a MATERIALIZED CTE, so it runs exactly once and locks at most the batch:
// every eligibility predicate sits inside it (rows over their cap never take a batch slot), and
// LockRows sits under the LIMIT (rows skipped or re-checked away do not count). The UPDATE
// repeats every guard, because a materialised cohort is not re-checked by READ COMMITTED; the
// guards are wrapped in IS TRUE (same meaning in a WHERE) so the planner cannot use them to pick
// an index: it must reach the claimed rows by primary key, never by walking the backlog.
// The fence comes from a sequence, so a claim that rolled back never hands its fence out again.
// Parameters common to both claims: $1 = now (one clock reading per call), $2 = worker,
// $3 = lease (NULL: the queue's). The grant check (access.hpp) sits in the cohort: a caller
// may claim only jobs of queues granted to it.
// PAUSED: the paused guard; CAP: the cap of job j joined with queue q (spi/cap.hpp, or the
// 0.1.0 rule for the 0.1.0 schema).
#define CLAIM_THE_COHORT(PAUSED, CAP)                                                              \
    " UPDATE jobcap.jobs j SET state = 'running', attempts = j.attempts + 1,"                      \
    "     fence = nextval('jobcap.fences'), lease = coalesce($3, q.lease),"                        \
    "     lease_expires_at = $1 + coalesce($3, q.lease), worker = $2, claimed_at = $1,"            \
    "     first_claimed_at = coalesce(j.first_claimed_at, $1)"                                     \
    "   FROM jobcap.queues q"                                                                      \
    "  WHERE j.job_id = ANY (ARRAY(SELECT job_id FROM cohort)) AND q.queue = j.queue"              \
    "    AND (j.state = 'pending' AND j.run_at <= $1" PAUSED " AND j.attempts < " CAP              \
    ") IS TRUE"                                                                                    \
    "  RETURNING j.job_id, j.fence, j.attempts, " CAP                                              \
    ","                                                                                            \
    "    j.payload, j.lease_expires_at, j.priority, j.run_at"

// The queue QUEUE is neither paused nor capped (the claims below), or not paused (the capped
// claims, which run under the queue's row lock). A missing queue passes neither. A queue with a
// rate_limit, a max_running_per_key or round-robin fairness is capped too (compat(0.2.0):
// QUEUE_OPEN_0_2 on the 0.2.0 schema, which has none).
#define QUEUE_OPEN(QUEUE)                                                                          \
    "(SELECT NOT q.paused AND q.max_running IS NULL AND q.rate_limit IS NULL"                      \
    "   AND q.max_running_per_key IS NULL AND q.fairness = 'fifo' FROM jobcap.queues q"            \
    "  WHERE q.queue = " QUEUE ") IS TRUE"
// compat(0.2.0): the 0.2.0 schema's.
#define QUEUE_OPEN_0_2(QUEUE)                                                                      \
    "(SELECT NOT q.paused AND q.max_running IS NULL FROM jobcap.queues q"                          \
    "  WHERE q.queue = " QUEUE ") IS TRUE"
#define QUEUE_NOT_PAUSED(QUEUE)                                                                    \
    "(SELECT NOT q.paused FROM jobcap.queues q WHERE q.queue = " QUEUE ") IS TRUE"

// $4 = queue, $5 = batch, $6 = caller (NULL: privileged), $7 = jobs whose rolled-back claim is
// not counted yet (housekeeping/rollbacks.hpp): skipped until it is. The grant check and the
// queue's controls do not depend on the row: each runs once, as a one-time filter before the
// scan. CAP_BY: the cap of job j with its queue looked up by $4. KEY: the claim index's first key,
// hashtextextended(queue, 0), the hash of the queue's name (compat(0.1.0): none on the 0.1.0
// schema, whose index leads with the name, compared next anyway).
#define BY_QUEUE_KEY "hashtextextended(j.queue, 0) = hashtextextended($4, 0) AND "
// START_BY: a job never claimed whose start_by has passed is not claimable (the background
// worker cancels it: housekeeping/workflows.hpp), in the cohort and in the UPDATE's guards.
// compat(0.2.0): "" on the 0.2.0 schema, which has no start_by.
#define START_BY_DUE                                                                               \
    " AND (j.start_by IS NULL OR j.start_by >= $1 OR j.first_claimed_at IS NOT NULL)"
