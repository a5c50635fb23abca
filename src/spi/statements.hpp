// The statements on the hot path, named so that jobcap.statements() can show them for EXPLAIN.
#pragma once

#include "spi/plans.hpp"

namespace jobcap::statements {

extern Statement insert_job;      // enqueue.cpp
extern Statement insert_jobs;     // enqueue.cpp
extern Statement claim_batch;     // claim.cpp
extern Statement claim_one;       // claim.cpp
extern Statement complete;        // settle.cpp
extern Statement complete_many;   // settle.cpp
extern Statement fail;            // settle.cpp
extern Statement crash;           // settle.cpp
extern Statement release;         // settle.cpp
extern Statement heartbeat;       // settle.cpp
extern Statement assert_current;  // settle.cpp
extern Statement reap_cohort;     // reap.cpp
extern Statement queue_stats;     // stats.cpp (not on the hot path: the figures' one statement)
extern Statement refresh_stats;   // stats.cpp

}  // namespace jobcap::statements
