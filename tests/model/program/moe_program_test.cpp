// Mixture-of-Experts in the Program (model/ops/moe_ops.hpp): one expert is the dense MLP, the all-to-all moves the
// closed form, both granularities agree, the skew loads the hottest EP rank.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "model/ops/moe_ops.hpp"
#include "model/ops/optimizer_traffic.hpp"
#include "model/program/estimates.hpp"
#include "model/program/program.hpp"
#include "test_scenarios.hpp"

namespace twin::model {
namespace {

using testing::make_scenario;

struct MoeSums {
  double flops = 0, compute_bytes = 0, collective_bytes = 0, routing_flops = 0, routing_bytes = 0, optimizer_bytes = 0;
  int all_to_alls = 0;
};

bool is_routing(ComputeKind what) {
  return what == ComputeKind::Router || what == ComputeKind::ExpertPermute || what == ComputeKind::ExpertUnpermute ||
         what == ComputeKind::ExpertSplitsSync;
}

// Over every stage's list (one rank per stage); routing (router GEMM, permute, unpermute) apart.
MoeSums moe_sums_of(const Program& program) {
  MoeSums sums;
  for (const auto& ops : program.stage_ops) {
    for (const Op& op : ops) {
      if (op.kind == OpKind::Collective) {
        sums.collective_bytes += op.bytes;
        sums.all_to_alls += op.collective == CollectiveKind::AllToAll;
      } else if (op.kind == OpKind::Compute && is_routing(op.what)) {
        sums.routing_flops += op.flops;
        sums.routing_bytes += op.bytes;
      } else if (op.kind == OpKind::Compute && op.what == ComputeKind::OptimizerStep) {
        sums.optimizer_bytes += op.bytes;
      } else if (op.kind == OpKind::Compute) {
        sums.flops += op.flops;
        sums.compute_bytes += op.bytes;
      }
      if (op.breakdown) {  // a fused layer's routing parts
        for (const Op& part : op.breakdown->parts) {
          if (!is_routing(part.what)) continue;
          sums.routing_flops += part.flops;
          sums.routing_bytes += part.bytes;
          sums.flops -= part.flops;
          sums.compute_bytes -= part.bytes;
        }
      }
    }
  }
  return sums;
}

Scenario moe(Scenario s, int experts, int top_k, int ep) {
  s.model.experts = experts;
  s.model.top_k = top_k;
  s.parallel.ep = ep;
  return s;
}

// experts = 1, top_k = 1: every token goes to the one expert with probability 1, so the expert GEMMs and activation
// are the dense MLP's, FLOP for FLOP and byte for byte, and so are its gradients' reduction (over ExpertData, here
// the DP ranks) and optimizer traffic; what is left is the routing: a [T, h] x [h, 1] router GEMM (2 T h forward,
// twice that backward), the permute / unpermute passes, and the router weight's h parameters per layer.
TEST(MoeProgram, OneExpertTopOneIsTheDenseModelPlusItsRouter) {
  for (const bool swiglu : {false, true}) {
    Scenario dense = make_scenario(4, 256, 8, 128, 1000, 1, 2, 2, 1, 8);
    if (swiglu) dense.model.activation = Activation::Swiglu;
    const Scenario one = moe(dense, 1, 1, 1);
    for (const Granularity granularity : {Granularity::Op, Granularity::Layer}) {
      const MoeSums d = moe_sums_of(build_program(dense, granularity)),
                    m = moe_sums_of(build_program(one, granularity));
      EXPECT_DOUBLE_EQ(m.flops, d.flops);
      EXPECT_DOUBLE_EQ(m.compute_bytes, d.compute_bytes);
      const double router_parameters = 4 * 256;  // per pipeline: 4 layers of [1, h]
      EXPECT_DOUBLE_EQ(m.collective_bytes, d.collective_bytes + router_parameters * 4);  // fp32 gradients
      EXPECT_NEAR(m.optimizer_bytes, d.optimizer_bytes + optimizer_step_bytes(one, router_parameters, 2, false),
                  1e-9 * d.optimizer_bytes);
      EXPECT_EQ(count_moe_parameters(one).total, count_moe_parameters(one).active);
      EXPECT_DOUBLE_EQ(count_moe_parameters(one).total, count_moe_parameters(dense).total + router_parameters);
      EXPECT_EQ(m.all_to_alls, 0);
      const double tokens = 128, hidden = 256, micro_batches = 4, layers = 4;
      EXPECT_DOUBLE_EQ(m.routing_flops, layers * micro_batches * (2 + 4) * tokens * hidden);
      EXPECT_GT(m.routing_bytes, 0);
    }
  }
}

// Each all-to-all moves T x top_k rows of hidden x bytes from every rank, (ep - 1) / ep of them to its peers when
// routing is balanced; T is the rank's sequence shard under sequence parallelism.
TEST(MoeProgram, AllToAllBytesPerRankAreTheClosedForm) {
  struct Case {
    int tp, dp, ep, experts, top_k;
    bool sequence_parallel;
  };
  for (const Case c : {Case{1, 4, 4, 8, 2, false}, Case{2, 4, 8, 16, 4, true}, Case{1, 8, 2, 4, 1, false}}) {
    Scenario s = moe(make_scenario(2, 256, 8, 128, 1000, c.tp, 1, c.dp, 2, 4 * c.dp), c.experts, c.top_k, c.ep);
    s.parallel.sequence_parallel = c.sequence_parallel;
    const Program program = build_program(s);
    const double tokens = 2.0 * 128 / (c.sequence_parallel ? c.tp : 1), row_bytes = 256.0 * 2;
    const double closed_form = tokens * c.top_k * row_bytes * (c.ep - 1) / c.ep;
    int seen = 0, probabilities = 0;
    for (const Op& op : program.stage_ops[0]) {
      if (op.kind != OpKind::Collective || op.collective != CollectiveKind::AllToAll) continue;
      // The rows' exchanges, and beside each dispatch its rows' probabilities: one value of the rows' dtype a row.
      const bool probs = op.payload == Payload::ExpertProbs;
      (probs ? probabilities : seen) += 1;
      const double per_row = probs ? 2 : row_bytes;
      EXPECT_EQ(op.group, Group::Expert);
      EXPECT_TRUE(probs || op.payload == Payload::Tokens);
      EXPECT_DOUBLE_EQ(op.bytes, tokens * c.top_k * per_row);
      ASSERT_TRUE(op.peer_bytes);
      ASSERT_EQ(op.peer_bytes->size(), static_cast<std::size_t>(c.ep * c.ep));
      for (int i = 0; i < c.ep; ++i) {
        double sent = 0, received = 0;
        for (int j = 0; j < c.ep; ++j) {
          if (j == i) continue;
          sent += (*op.peer_bytes)[i * c.ep + j];
          received += (*op.peer_bytes)[j * c.ep + i];
        }
        const double expected = closed_form * per_row / row_bytes;
        EXPECT_NEAR(sent, expected, 1e-9 * expected) << "member " << i;
        EXPECT_NEAR(received, expected, 1e-9 * expected) << "member " << i;
      }
    }
    // dispatch and combine, forward and backward, per layer and micro-batch; the probabilities beside each dispatch
    EXPECT_EQ(seen, 2 * 2 * 2 * static_cast<int>(s.parallel.micro_batches())) << c.tp << " " << c.ep;
    EXPECT_EQ(probabilities, seen / 2) << c.tp << " " << c.ep;
  }
}

// Under skew every sender sends each receiver the receiver's share of its rows: with 4 experts on ep 4 and skew 1 the
// shares are 1, 1/2, 1/3, 1/4 over 25/12 (12/25, 6/25, 4/25, 3/25), so the matrix (sender i, receiver j) of an
// all-to-all towards the experts (the forward's dispatch before the up GEMM, the backward's before the down GEMM's
// gradient) is T k share_j row bytes for every sender, and the one back from them its transpose: rank 0 receives
// four times what rank 3 does, and sends back four times as much.
TEST(MoeProgram, SkewedAllToAllSendsEachPeerTheReceiversShare) {
  for (const Granularity granularity : {Granularity::Op, Granularity::Layer}) {
    Scenario s = moe(make_scenario(2, 256, 8, 128, 1000, 1, 1, 4, 2, 16), 4, 1, 4);
    s.model.expert_load_skew = 1.0;
    const std::vector<double> shares{12.0 / 25, 6.0 / 25, 4.0 / 25, 3.0 / 25};
    const double rows = 2.0 * 128, row_bytes = 256.0 * 2;
    int to_experts = 0, back = 0;
    const Program program = build_program(s, granularity);
    for (const Op& op : program.stage_ops[0]) {
      if (op.kind != OpKind::Collective || op.collective != CollectiveKind::AllToAll) continue;
      ASSERT_TRUE(op.peer_bytes);
      ASSERT_EQ(op.peer_bytes->size(), 16u);
      const bool towards = (op.phase == Phase::Forward) == (op.what == ComputeKind::ExpertUp);
      const bool probs = op.payload == Payload::ExpertProbs;  // a row's probability: 2 bytes where its row took 512
      if (!probs) (towards ? to_experts : back) += 1;
      for (int i = 0; i < 4; ++i) {
        for (int j = 0; j < 4; ++j) {
          const double want = rows * (towards ? shares[j] : shares[i]) * (probs ? 2 : row_bytes);
          EXPECT_NEAR((*op.peer_bytes)[i * 4 + j], want, 1e-9 * want)
              << (towards ? "towards the experts" : "back from them") << ": sender " << i << ", receiver " << j << " ("
              << to_string(op.phase) << ")";
        }
      }
    }
    EXPECT_EQ(to_experts, 2 * 2 * static_cast<int>(s.parallel.micro_batches()));
    EXPECT_EQ(back, to_experts);
  }
}

TEST(MoeProgram, BothGranularitiesKeepTheSums) {
  Scenario s = moe(make_scenario(4, 256, 8, 128, 1000, 2, 2, 4, 1, 16), 8, 2, 4);
  s.parallel.sequence_parallel = true;
  s.model.shared_experts = 1;
  s.model.dense_layers = 1;
  s.model.expert_load_skew = 0.7;
  s.parallel.recompute = Recompute::Full;
  const Program op = build_program(s, Granularity::Op), layer = build_program(s, Granularity::Layer);
  EXPECT_DOUBLE_EQ(op.total_flops(), layer.total_flops());
  const MoeSums a = moe_sums_of(op), b = moe_sums_of(layer);
  const double bytes = a.compute_bytes + a.routing_bytes;  // summed in another order: the last bits differ
  EXPECT_NEAR(b.compute_bytes + b.routing_bytes, bytes, 1e-12 * bytes);
  EXPECT_DOUBLE_EQ(a.collective_bytes, b.collective_bytes);
  EXPECT_EQ(a.all_to_alls, b.all_to_alls);
  EXPECT_GT(a.all_to_alls, 0);
}

// Zipf skew: shares fall with the expert's index; EP rank 0 (experts 0 .. E/ep - 1) gets the most, and the expert
// GEMMs carry its rows, so skew costs FLOPs on the critical rank.
TEST(MoeProgram, SkewLoadsTheFirstEpRank) {
  Scenario s = moe(make_scenario(2, 256, 8, 128, 1000, 1, 1, 4, 1, 4), 8, 2, 4);
  const std::vector<double> balanced = ep_rank_row_shares(s);
  for (double share : balanced) EXPECT_DOUBLE_EQ(share, 0.25);
  s.model.expert_load_skew = 1;
  const std::vector<double> skewed = ep_rank_row_shares(s);
  EXPECT_NEAR(std::accumulate(skewed.begin(), skewed.end(), 0.0), 1, 1e-12);
  // H_8 = 761/280: rank 0 holds experts 0 and 1, (1 + 1/2) / H_8
  EXPECT_NEAR(skewed[0], 1.5 / (761.0 / 280), 1e-12);
  for (std::size_t r = 1; r < skewed.size(); ++r) EXPECT_LT(skewed[r], skewed[r - 1]);
  Scenario even = s;
  even.model.expert_load_skew = 0;
  auto expert_flops = [](const Scenario& scenario) {
    double flops = 0;
    const Program program = build_program(scenario);
    for (const Op& op : program.stage_ops[0]) {
      if (op.what == ComputeKind::ExpertUp || op.what == ComputeKind::ExpertDown) flops += op.flops;
    }
    return flops;
  };
  EXPECT_NEAR(expert_flops(s) / expert_flops(even), 4 * skewed[0], 1e-9);
}

// With balanced routing the Program's GEMM FLOPs are the active parameters' (Narayanan's count with the MoE MLP:
// router, top_k routed and the shared experts), over every plan.
TEST(MoeProgram, GemmFlopsAreTheActiveParametersFlops) {
  Scenario s = moe(make_scenario(4, 256, 8, 128, 1000, 2, 2, 4, 1, 16), 8, 2, 4);
  s.parallel.sequence_parallel = true;
  s.model.shared_experts = 2;
  s.model.dense_layers = 1;
  s.model.moe_ffn_hidden = 384;
  s.model.activation = Activation::Swiglu;
  for (const int etp : {1, 2}) {
    s.parallel.etp = etp;
    EXPECT_NEAR(build_program(s).total_flops() / model_flops_per_iteration(s, false), 1, 1e-12) << etp;
  }
}

// A capacity factor c caps each expert at c / E of the rows; the rest are dropped before the dispatch.
TEST(MoeProgram, CapacityDropsWhatTheHotExpertsCannotTake) {
  Scenario s = moe(make_scenario(2, 256, 8, 128, 1000, 1, 1, 4, 1, 4), 8, 2, 4);
  s.model.expert_load_skew = 1;
  s.model.capacity_factor = 1;
  const std::vector<double> shares = ep_rank_row_shares(s);
  EXPECT_DOUBLE_EQ(shares[0], 0.25);  // experts 0 and 1 (0.37 and 0.18 of the rows) each capped at 1/8
  EXPECT_NEAR(shares[1], (1.0 / 3 + 1.0 / 4) / (761.0 / 280), 1e-12);  // under their capacity
  EXPECT_LT(std::accumulate(shares.begin(), shares.end(), 0.0), 1);
  Scenario dropless = s;
  dropless.model.capacity_factor = 0;
  EXPECT_GT(ep_rank_row_shares(dropless)[0], 0.5);
}

// Mixtral 8x7B's shape (Jiang et al. 2024, arXiv:2401.04088, Table 1: 32 layers, hidden 4096, 8 experts of width
// 14336, top 2, 32000 tokens, 8 key/value heads): 46.7 B parameters, 12.9 B active.
TEST(MoeProgram, ParametersTotalAndActive) {
  Scenario s = moe(make_scenario(32, 4096, 32, 4096, 32000, 1, 1, 8, 1, 8), 8, 2, 8);
  s.model.kv_heads = 8;
  s.model.ffn_hidden = 14336;
  s.model.activation = Activation::Swiglu;
  s.model.norm = Norm::RmsNorm;
  s.model.linear_bias = false;
  s.model.position_embedding = PositionEmbedding::Rope;
  s.framework.tied_embeddings = false;
  s.parallel.vocab_pad_multiple = 1;
  const MoeParameterCount count = count_moe_parameters(s);
  EXPECT_NEAR(count.total / 1e9, 46.7, 0.05);
  EXPECT_NEAR(count.active / 1e9, 12.9, 0.05);
  // One GPU of ep 8 holds one expert of each layer, its attention and router and the ends.
  EXPECT_DOUBLE_EQ(expert_parameters_per_gpu(s), 3.0 * 4096 * 14336);
}

}  // namespace
}  // namespace twin::model
