// The reaper's steps on the shards this node holds (shards.hpp).
#include "background/shards.hpp"

#include "spi/citus.hpp"

namespace jobcap {

uint64 on_local_shards(Step step, int32 batch)
{
    if (!citus::loaded() || !citus::distributed())
        return step(batch);
    citus::Shard* shards = nullptr;
    int n = citus::local_shards(&shards);
    uint64 total = 0;
    bool full = false;
    for (int i = 0; i < n; ++i) {
        if (!citus::route_local(shards[i]))
            continue;
        uint64 rows = step(batch);
        citus::unroute();
        total += rows;
        full = full || rows >= static_cast<uint64>(batch);
    }
    pfree(shards);
    return full ? Max(total, static_cast<uint64>(batch)) : total;
}

}  // namespace jobcap
