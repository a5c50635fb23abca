// The cap rule in SQL, written once: every statement that decides whether a job may run again
// (the claims, fail_job, the reaper) and every figure that shows a job's cap (what a claim
// returns, top_failing_jobs; the dead_jobs view spells the same expression in the install
// script) uses JOBCAP_CAP_OF. The direct path's C++ spelling is src/core/cap.hpp; the table of
// cases test/unit/cap_cases.txt ties the two (test/unit/cap_test.cpp, test/t/180_cap_rule.pl).
//
// A job's cap is the lower of its own max_attempts and its queue's (least() ignores a NULL: no
// own cap means the queue's). So nobody who enqueues can give a job more attempts than its
// queue allows, and lowering a queue's cap binds every job of the queue at once, with no write.
// The one exception is a budget an operator granted with requeue_job or requeue_dead: that
// statement sets the job's max_attempts and copies its queue's cap_epoch into the job, and the
// budget holds while the two are equal. alter_queue bumps a queue's cap_epoch each time it
// lowers max_attempts, so a lowering ends every budget granted before it.
#pragma once

// J: the job's alias; QMAX and QEPOCH: SQL for its queue's max_attempts and cap_epoch (columns
// of a joined queue, or scalar subqueries).
#define JOBCAP_CAP_OF(J, QMAX, QEPOCH)                                                             \
    "(CASE WHEN (" J ".cap_epoch = " QEPOCH ") IS TRUE THEN " J                                    \
    ".max_attempts"                                                                                \
    " ELSE least(" J ".max_attempts, " QMAX ") END)"

// The same for job j joined with its queue q.
#define JOBCAP_CAP JOBCAP_CAP_OF("j", "q.max_attempts", "q.cap_epoch")

// The same for job j, its queue looked up by QUEUE (a parameter or a qualified column): one
// scalar subquery per setting, an InitPlan run once per statement when QUEUE is a parameter.
#define JOBCAP_CAP_BY(QUEUE)                                                                       \
    JOBCAP_CAP_OF("j", "(SELECT q.max_attempts FROM jobcap.queues q WHERE q.queue = " QUEUE ")",   \
                  "(SELECT q.cap_epoch FROM jobcap.queues q WHERE q.queue = " QUEUE ")")

// compat(0.1.0): the 0.1.0 rule, for the 0.1.0 schema (no cap_epoch yet; spi/schema.hpp): a
// job's own max_attempts, else its queue's.
#define JOBCAP_CAP_0_1 "coalesce(j.max_attempts, q.max_attempts)"
#define JOBCAP_CAP_BY_0_1(QUEUE)                                                                   \
    "coalesce(j.max_attempts, (SELECT q.max_attempts FROM jobcap.queues q WHERE q.queue = " QUEUE  \
    "))"
