// jobcap on a Citus cluster (docs/scaling.md). After jobcap.distribute(), jobcap.jobs and
// jobcap.job_errors (and the statistics tables) are distributed by queue and colocated, and
// jobcap.queues, jobcap.queue_grants and jobcap.job_schedules are reference tables. On every
// node the tables named jobcap.jobs and so on are then shells; the rows are in shards, plain
// tables named jobcap.jobs_<shard id>.
//
// Citus delegates a call of a hot-path function to the node that holds its shard
// (create_distributed_function: claims and enqueues by queue, settles by fence, whose hash as
// text falls in the shard of the job's queue by construction, shard_fence below). There the
// call is routed: its statements are prepared against that node's shard instead of the shells
// (plans.cpp asks plan_on_shard), so every statement is the one a single server runs, planned
// by PostgreSQL alone, and the cap, the fence check and dead-is-quiet hold exactly as there.
// A call that arrives on a node without its shard is refused (55000), or told to retry (40001)
// when the shard moved away while the call was on its way.
//
// Routing takes Citus's own shard metadata lock (the one a Citus write takes, which a shard
// move takes exclusively before it switches placements) and then reads the placements afresh:
// a call never writes a shard that was moved away. Nothing here links with Citus: its catalogs
// are read with SQL, its lock tag is rebuilt from its documented layout.
//
// Without Citus loaded, none of this runs: loaded() is false once per backend and the entry
// points skip routing altogether (single-node calls pay one branch).
#pragma once

#include "pg.hpp"

namespace jobcap {

struct Statement;
struct Params;

namespace citus {

// A shard of jobcap.jobs and the shards colocated with it (same hash range), on this node or not.
struct Shard {
    int64 jobs;
    int64 errors;
    int64 minutes;  // jobcap.stats_minutes
    int64 latency;  // jobcap.stats_latency
    int32 lo, hi;   // the range of hashes (of queues, and of fences as text) it holds
    uint32 index;   // its position among jobs' shards, as Citus numbers them
    bool local;     // placed on this node
};

// True when Citus is loaded into this server (its settings exist). Learnt once per backend.
extern int8 loaded_state;  // -1: not known yet, 0: no, 1: yes
bool learn_loaded();
inline bool loaded()
{
    return loaded_state > 0 || (loaded_state < 0 && learn_loaded());
}

// True when jobcap.jobs is distributed in this database (only ever with Citus loaded). Learnt
// once per backend, forgotten when jobcap.jobs' relcache entry is invalidated.
bool distributed();

// The shard the running call works on; nullptr: the tables themselves (a single server, or a
// call Citus runs against the shells). Read by plans.cpp for every statement.
extern const Shard* routed;

// What a call found routed when it began, given back when it ends (a call made inside a routed
// call's statement, such as jobcap.backoff, leaves it as it was).
struct Outer {
    Shard shard;
    bool routed;
};

// At the entry of every SQL function (boundary.cpp), with Citus loaded: routes a call of a
// hot-path function to the shard of its queue or fence (raising when that shard is not on this
// node), leaves other calls unrouted. leave_call gives back what enter_call found.
Outer enter_call(FunctionCallInfo fcinfo, const char* function);
void leave_call(const Outer& outer);

// The shards of jobs on this node, fresh from Citus's catalogs (the background worker works on
// each, route_local). Sets *shards to an array in the current memory context.
int local_shards(Shard** shards);

// Routes the statements that follow to shard s (one of local_shards'), under Citus's shard
// metadata lock; false when s is no longer on this node (moved meanwhile). unroute() ends it.
bool route_local(const Shard& s);
// The same for the shard of a fence (a rolled-back claim's): false when it is not on this node.
bool route_fence_local(int64 fence);
void unroute();

// The statement s prepared against the routed shard: the same text with jobcap's distributed
// and reference tables renamed to their shards here, and with what a shard lacks supplied
// (job ids and history sequence numbers, which shards have no default for; fences that route).
// Kept per statement and shard for the life of the backend.
SPIPlanPtr plan_on_shard(const Statement& s);

// Citus's hash of a fence as text: the shard a settle is delegated to (a fence is chosen so that
// it falls in the shard of its job's queue: jobcap.shard_fence, functions/distribute.cpp).
int32 fence_hash(int64 fence);

// raise_not_current's look-up of a job (state, fence, whether the caller $2 may work it) by
// its id $1 in every shard, through Citus: the job a call names need not be in the shard its
// fence routed the call to. Returns the row count (0 or 1) of SPI_tuptable.
uint64 job_now_across_shards(const Params& p);

// The relation id of the shard of jobcap.jobs s on this node (InvalidOid: none), for the
// vacuum of the background worker.
Oid jobs_shard_relid(const Shard& s);

}  // namespace citus
}  // namespace jobcap
