#include "core/order.hpp"

#include <gtest/gtest.h>

#include <vector>

using jobcap::core::ClaimKey;
using jobcap::core::sort_claim_order;

TEST(ClaimOrder, PriorityThenRunAtThenId)
{
    std::vector<ClaimKey> keys = {
        {5, 100, 1, 0}, {-1, 300, 2, 1}, {5, 50, 3, 2}, {-1, 300, 1, 3}, {0, 0, 9, 4},
    };
    sort_claim_order(keys.data(), keys.size());
    std::vector<std::uint32_t> rows;
    for (const auto& k : keys)
        rows.push_back(k.row);
    EXPECT_EQ(rows, (std::vector<std::uint32_t>{3, 1, 4, 2, 0}));
}

TEST(ClaimOrder, EmptyAndSingle)
{
    sort_claim_order(nullptr, 0);
    ClaimKey one = {1, 2, 3, 7};
    sort_claim_order(&one, 1);
    EXPECT_EQ(one.row, 7u);
}
