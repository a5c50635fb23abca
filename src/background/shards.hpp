// The reaper on a Citus node (spi/citus.hpp): a step that works on jobcap.jobs runs once on each
// shard of it that this node holds, and only on those; the shards that move here are found at
// the next cycle's step, those that moved away are left. Private to src/background/.
#pragma once

#include "background/steps.hpp"

namespace jobcap {

// step(batch) on the tables themselves, or, when jobcap is distributed, on each shard of jobs on
// this node in turn, routed to it under Citus's placement lock (a shard that moves away meanwhile
// is skipped). Returns the rows of all, at least batch when one shard's batch was full (the
// caller then runs another).
uint64 on_local_shards(Step step, int32 batch);

}  // namespace jobcap
