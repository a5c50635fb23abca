// A failed attempt's history on the direct path (src/direct/history.cpp). Private to
// src/direct/.
#pragma once

#include "direct/rows.hpp"

namespace jobcap::direct {

// The history of a failed attempt (JOBCAP_HISTORY_CTES in spi/history.hpp): the job's history
// cut to its newest jobcap.error_history - 1 rows, then a row for the job's new version in
// op.next (unless jobcap.error_history is 0) — in the order the statement's ModifyTable nodes
// run its two CTEs (what logical decoding shows), with the same outcome: the statement's DELETE
// does not see its INSERT's row either.
void add_history(Op& op, Relation errors, const Access& access, const char* kind, Datum error,
                 bool no_error, TimestampTz at);

}  // namespace jobcap::direct
