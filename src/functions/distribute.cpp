// jobcap on Citus (spi/citus.hpp): the fences that route. jobcap.distribute() itself is SQL (in
// sql/jobcap--0.2.0--0.3.0.sql): it only calls Citus's functions, in order.
#include "boundary.hpp"
#include "spi/args.hpp"
#include "spi/citus.hpp"

extern "C" {
#include "catalog/namespace.h"
#include "commands/sequence.h"
#include "utils/lsyscache.h"
}

namespace jobcap {
namespace {

// Each value of jobcap.fences yields kCandidates fences, value * kCandidates + k; the first whose
// hash falls in the shard is taken. With Citus's 32 shards by default, 1 in 32 candidates does:
// a value without one is rare ((31/32)^256, about 3 in 10,000) and another is drawn.
constexpr int64 kCandidates = 256;
constexpr int kDraws = 64;

}  // namespace
}  // namespace jobcap

using namespace jobcap;

// jobcap.shard_fence(lo, hi): a new fence whose hash as text (Citus's hash of a text value) is in
// [lo, hi], the range of the shard a claim or requeue runs on; unique, as every value of
// jobcap.fences is drawn once. Citus delegates a settle, routed by its fence, to that shard.
JOBCAP_FUNCTION(shard_fence, Duty::anyone)
{
    int32 lo = DatumGetInt32(arg_required(fcinfo, 0, "lo"));
    int32 hi = DatumGetInt32(arg_required(fcinfo, 1, "hi"));
    Oid nsp = get_namespace_oid("jobcap", false);
    Oid fences = get_relname_relid("fences", nsp);
    if (!OidIsValid(fences))
        elog(ERROR, "jobcap: sequence jobcap.fences is missing");
    for (int draw = 0; draw < kDraws; ++draw) {
        int64 value = nextval_internal(fences, false);
        if (value < 0 || value > PG_INT64_MAX / kCandidates)
            ereport(ERROR, (errcode(ERRCODE_SEQUENCE_GENERATOR_LIMIT_EXCEEDED),
                            errmsg("jobcap.fences is past the values that make fences"),
                            errdetail("Its value %lld times %lld overflows a bigint.",
                                      static_cast<long long>(value),
                                      static_cast<long long>(kCandidates))));
        for (int64 k = 0; k < kCandidates; ++k) {
            int64 fence = value * kCandidates + k;
            int32 hash = citus::fence_hash(fence);
            if (hash >= lo && hash <= hi)
                PG_RETURN_INT64(fence);
        }
    }
    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                    errmsg("no fence falls in hashes [%d, %d]", lo, hi),
                    errdetail("%d values of jobcap.fences were tried, %lld fences each.", kDraws,
                              static_cast<long long>(kCandidates))));
    PG_RETURN_NULL();
}
