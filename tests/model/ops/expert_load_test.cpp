// model::expert_load_skew_capped: when a capacity factor absorbs the router's skew, so that `twin sim` can say the key
// changes nothing rather than stay silent.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "model/ops/expert_load.hpp"
#include "model/ops/moe_ops.hpp"
#include "test_scenarios.hpp"

namespace twin::model {
namespace {

// 8 experts on EP 8 (Mixtral's layout): one expert per EP rank.
Scenario eight_experts(double skew, double capacity_factor) {
  Scenario s = testing::make_scenario(2, 256, 4, 128, 1024, 1, 1, 8, 1, 8);
  s.model.experts = 8;
  s.model.top_k = 2;
  s.parallel.ep = 8;
  s.model.expert_load_skew = skew;
  s.model.capacity_factor = capacity_factor;
  return s;
}

double hottest_rank_share(const Scenario& s) {
  const std::vector<double> shares = ep_rank_row_shares(s);
  return *std::max_element(shares.begin(), shares.end());
}

TEST(ExpertLoad, ACapacityFactorOfOneCapsAnySkew) {
  // Every expert takes at most its even share: the hottest rank gets exactly the balanced 1/8.
  for (const double skew : {0.5, 1.0, 3.0}) {
    const Scenario s = eight_experts(skew, 1.0);
    EXPECT_TRUE(expert_load_skew_capped(s)) << skew;
    EXPECT_DOUBLE_EQ(hottest_rank_share(s), 1.0 / 8);
  }
}

TEST(ExpertLoad, DroplessOrUnskewedIsNotCapped) {
  EXPECT_FALSE(expert_load_skew_capped(eight_experts(1.0, 0)));  // dropless: the skew loads rank 0 more
  EXPECT_GT(hottest_rank_share(eight_experts(1.0, 0)), 1.0 / 8);
  EXPECT_FALSE(expert_load_skew_capped(eight_experts(0, 1.0)));  // no skew: nothing to cap
  Scenario dense = eight_experts(1.0, 1.0);
  dense.model.experts = 0;
  EXPECT_FALSE(expert_load_skew_capped(dense));
}

TEST(ExpertLoad, ALooseCapLetsAStrongSkewThrough) {
  // Capacity 2: expert 0 may take up to 2/8 of the rows; Zipf 1 over 8 experts gives it 1 / H_8 = 0.368, capped to
  // 0.25, above the balanced 0.125: the skew still slows the plan.
  const Scenario s = eight_experts(1.0, 2.0);
  EXPECT_FALSE(expert_load_skew_capped(s));
  EXPECT_DOUBLE_EQ(hottest_rank_share(s), 2.0 / 8);
}

}  // namespace
}  // namespace twin::model
