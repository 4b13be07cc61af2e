// framework.moe_dispatcher = "flex" (DeepEP / HybridEP): each token crosses to a rank of its node once if any of its
// experts is there, and to another node once if any is there, where the all-to-all dispatcher sends one row per
// (token, expert). Checked against the hypergeometric count, written out here apart from model/ops/moe_ops.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "model/ops/moe_ops.hpp"
#include "test_scenarios.hpp"

namespace twin::model {
namespace {

// Qwen3-30B-A3B's routing (128 experts, top 8) over EP 16 on two 8-GPU nodes.
Scenario qwen_routing(MoeDispatcher dispatcher) {
  Scenario s = testing::make_scenario(2, 256, 4, 128, 1024, 1, 1, 16, 1, 16);
  s.model.experts = 128;
  s.model.top_k = 8;
  s.parallel.ep = 16;
  s.cluster.gpus_per_node = 8;
  s.framework.moe_dispatcher = dispatcher;
  return s;
}

// 1 - C(E - m, k) / C(E, k): the chance that k distinct experts of E include one of a set of m.
double hypergeometric_reach(double experts, double m, double k) {
  const auto log_choose = [](double n, double r) {
    return std::lgamma(n + 1) - std::lgamma(r + 1) - std::lgamma(n - r + 1);
  };
  return 1 - std::exp(log_choose(experts - m, k) - log_choose(experts, k));
}

TEST(FlexDispatcher, ReachIsTheHypergeometricChanceOnBalancedRouting) {
  const Scenario s = qwen_routing(MoeDispatcher::Flex);
  for (const double m : {1.0, 8.0, 16.0, 64.0}) {
    EXPECT_NEAR(flex_reach(s, m / 128, 1.0 / 128), hypergeometric_reach(128, m, 8), 1e-12) << m;
  }
  EXPECT_EQ(flex_reach(s, 0, 0), 0);
  EXPECT_EQ(flex_reach(s, 1, 1.0 / 128), 1);
  // One expert, however hot: a token picks it at most once, so it reaches k times its share of the tokens, exactly
  // the all-to-all's rows (3 / 128 of them: 24 / 128 of the tokens).
  EXPECT_DOUBLE_EQ(flex_reach(s, 3.0 / 128, 3.0 / 128), 24.0 / 128);
}

TEST(FlexDispatcher, SendsATokenOnceToEachRankOfItsNodeAndOnceToEachOtherNode) {
  const double tokens = 4096, k = 8, row_bytes = 4096;  // T tokens, k rows each, 2048 bf16 values a row
  const auto all = dispatch_peer_bytes(qwen_routing(MoeDispatcher::AllToAll), tokens * k, row_bytes);
  const auto flex = dispatch_peer_bytes(qwen_routing(MoeDispatcher::Flex), tokens * k, row_bytes);
  ASSERT_EQ(flex->size(), 16u * 16u);
  // Rank 0 (node 0): a rank of its own node holds 8 of the 128 experts; the other node 64 of them, over its 8 ranks.
  EXPECT_NEAR((*flex)[1] / row_bytes, tokens * hypergeometric_reach(128, 8, 8), 1e-6);
  EXPECT_NEAR((*flex)[9] / row_bytes, tokens * hypergeometric_reach(128, 64, 8) / 8, 1e-6);
  EXPECT_NEAR((*all)[1] / row_bytes, tokens * k / 16, 1e-9);
  // What crosses to the other node: about one row per token (99.6 %), against the all-to-all's 4.
  double flex_across = 0, all_across = 0;
  for (int j = 8; j < 16; ++j) {
    flex_across += (*flex)[j];
    all_across += (*all)[j];
  }
  EXPECT_NEAR(flex_across / (tokens * row_bytes), 0.996, 0.001);
  EXPECT_NEAR(all_across / (tokens * row_bytes), 4.0, 1e-9);
  // Deduplication never sends more than the all-to-all, skewed or capped alike.
  for (const double skew : {0.0, 1.0}) {
    for (const double capacity : {0.0, 1.0}) {
      Scenario a = qwen_routing(MoeDispatcher::AllToAll), f = qwen_routing(MoeDispatcher::Flex);
      a.model.expert_load_skew = f.model.expert_load_skew = skew;
      a.model.capacity_factor = f.model.capacity_factor = capacity;
      const auto ab = dispatch_peer_bytes(a, tokens * k, row_bytes), fb = dispatch_peer_bytes(f, tokens * k, row_bytes);
      for (std::size_t i = 0; i < ab->size(); ++i)
        EXPECT_LE((*fb)[i], (*ab)[i] * (1 + 1e-12)) << skew << " " << capacity << " " << i;
    }
  }
}

// When the key changes nothing, twin sim says so: read off the two dispatchers' bytes, not a rule beside them.
TEST(FlexDispatcher, SaysWhenItSendsWhatTheAllToAllDoes) {
  EXPECT_FALSE(flex_dispatch_changes_nothing(qwen_routing(MoeDispatcher::Flex)));  // 8 experts a rank: fewer rows
  EXPECT_FALSE(flex_dispatch_changes_nothing(qwen_routing(MoeDispatcher::AllToAll)));  // not set
  Scenario one_expert_a_rank = qwen_routing(MoeDispatcher::Flex);
  one_expert_a_rank.model.experts = 16;
  one_expert_a_rank.model.top_k = 2;
  one_expert_a_rank.cluster.gpus_per_node = 16;  // every EP rank in one node
  EXPECT_TRUE(flex_dispatch_changes_nothing(one_expert_a_rank));
  one_expert_a_rank.model.expert_load_skew = 1;  // a token still picks a hot expert at most once
  EXPECT_TRUE(flex_dispatch_changes_nothing(one_expert_a_rank));
  one_expert_a_rank.cluster.gpus_per_node = 8;  // two nodes: a token crosses once to a node holding two of its experts
  EXPECT_FALSE(flex_dispatch_changes_nothing(one_expert_a_rank));
  Scenario no_ep = qwen_routing(MoeDispatcher::Flex);
  no_ep.parallel.ep = 1;
  EXPECT_TRUE(flex_dispatch_changes_nothing(no_ep));
}

}  // namespace
}  // namespace twin::model
