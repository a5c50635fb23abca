// The statements that more than one file runs. Every statement, these and those private to a
// file, is listed by jobcap.statements() under its one name (JOBCAP_STATEMENT, plans.hpp).
#pragma once

#include "spi/plans.hpp"

namespace jobcap::statements {

extern Statement complete_job;      // functions/settle.cpp; complete_and_claim runs it too
extern Statement complete_job_0_1;  // compat(0.1.0): the same on the 0.1.0 schema
extern Statement complete_job_0_2;  // compat(0.2.0): the same on the 0.2.0 schema
extern Statement queue_exists;      // spi/errors.cpp
extern Statement claim_job_keyed;   // functions/claim_keyed.cpp, run by functions/claim.cpp
extern Statement claim_job_turns;   // the same

}  // namespace jobcap::statements
