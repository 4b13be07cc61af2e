// Context parallelism in the Program and the simulator (framework.cp_comm = "all_gather", Llama 3's): the exchanges
// over the Context group equal model/context_parallel's closed form at both granularities, gradients reduce over
// DataWithContext, the attention core computes 1 / cp of the sequence's causal pairs; at 128k tokens CP 16 fits where
// CP 1 does not, and splits the sequence's time across its 16 x more GPUs.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "context_parallel_scenarios.hpp"
#include "model/ops/context_parallel.hpp"
#include "model/program/estimates.hpp"
#include "model/program/program.hpp"
#include "sim/cost_model.hpp"
#include "sim/simulate.hpp"
#include "topology/hardware.hpp"

namespace twin::sim {
namespace {

using cp_scenarios::cp_attention;
using cp_scenarios::llama3_8b;
using model::Op;

// Per layer and micro-batch, the bytes this rank puts into CP collectives, as the closed form counts them: an
// all-gather's shard (its op carries the gathered tensor, cp shards), a reduce-scatter's whole input.
struct ContextBytes {
  double forward = 0, backward = 0;
  int all_gathers = 0, reduce_scatters = 0;
};
ContextBytes context_bytes(const model::Program& program, int layer, int micro_batch) {
  ContextBytes bytes;
  const double cp = static_cast<double>(program.scenario.parallel.cp);
  for (const Op& op : program.stage_ops[0]) {
    if (op.kind != model::OpKind::Collective || op.group != model::Group::Context) continue;
    if (op.layer != layer || op.micro_batch != micro_batch) continue;
    const bool gather = op.collective == model::CollectiveKind::AllGather;
    (op.phase == model::Phase::Backward ? bytes.backward : bytes.forward) += gather ? op.bytes / cp : op.bytes;
    (gather ? bytes.all_gathers : bytes.reduce_scatters) += op.phase == model::Phase::Backward ? 1 : 0;
  }
  return bytes;
}

TEST(ContextParallelProgram, ExchangeBytesEqualTheClosedFormAtBothGranularities) {
  for (std::int64_t cp : {2, 4, 16}) {
    const model::Scenario s = llama3_8b(8192, cp);
    const model::CpTraffic forward = model::cp_forward_traffic(cp_attention(s), model::CpComm::AllGather);
    const model::CpTraffic backward = model::cp_backward_traffic(cp_attention(s), model::CpComm::AllGather);
    for (model::Granularity granularity : {model::Granularity::Op, model::Granularity::Layer}) {
      const model::Program program = model::build_program(s, granularity);
      for (int micro_batch : {0, 1}) {
        const ContextBytes bytes = context_bytes(program, 5, micro_batch);
        EXPECT_DOUBLE_EQ(bytes.forward, forward.collective_input_bytes) << "cp " << cp;
        EXPECT_DOUBLE_EQ(bytes.backward, backward.collective_input_bytes) << "cp " << cp;
        EXPECT_EQ(bytes.all_gathers, backward.all_gathers);
        EXPECT_EQ(bytes.reduce_scatters, backward.reduce_scatters);
      }
    }
    // 2 MiB per K block per TP rank at 128k on CP 16 (model/context_parallel's own check) scales as 1 / cp here:
    // 8192 / cp tokens x 1 key/value head x 128 x 2 bytes.
    EXPECT_DOUBLE_EQ(forward.collective_input_bytes, 2 * 8192.0 / static_cast<double>(cp) * 1 * 128 * 2);
  }
}

TEST(ContextParallelProgram, GradientsReduceOverDataWithContextAndAttentionSplitsTheCausalPairs) {
  const model::Program one = model::build_program(llama3_8b(8192, 1), model::Granularity::Op);
  const model::Program four = model::build_program(llama3_8b(8192, 4), model::Granularity::Op);
  EXPECT_EQ(four.layout.world_size(), 32);
  EXPECT_EQ(four.layout.group_members(model::Group::DataWithContext, 0).size(), 4u);
  int gradients = 0;
  for (const Op& op : four.stage_ops[0]) {
    if (op.kind == model::OpKind::Collective && op.payload == model::Payload::Gradients) {
      EXPECT_EQ(op.group, model::Group::DataWithContext);
      ++gradients;
    }
  }
  EXPECT_GT(gradients, 0);  // dp = 1, yet the CP ranks reduce their gradients
  const auto attention = [](const model::Program& program, model::Phase phase) {
    for (const Op& op : program.stage_ops[0]) {
      if (op.kind == model::OpKind::Compute && op.what == model::ComputeKind::AttentionCore && op.phase == phase)
        return op;
    }
    return Op{};
  };
  for (model::Phase phase : {model::Phase::Forward, model::Phase::Backward}) {
    EXPECT_DOUBLE_EQ(attention(four, phase).flops * 4, attention(one, phase).flops);
    EXPECT_EQ(attention(four, phase).gemm.m, 8192 / 4);  // the rank's queries
    EXPECT_EQ(attention(four, phase).gemm.n, 8192);      // against the whole sequence's keys
  }
}

// All three of Megatron-Core's ways are in the Program: p2p and all_gather build for Llama 3 8B at TP 8 x CP 2, and a2a,
// whose 8 key/value heads do not split over tp x cp = 16, is refused by name (it builds at TP 4: 8 / (4 x 2)).
TEST(ContextParallelProgram, EveryWayBuildsWhereItsRuleHolds) {
  for (std::string_view comm : {"p2p", "all_gather"}) {
    EXPECT_NO_THROW(model::build_program(llama3_8b(8192, 2, comm), model::Granularity::Layer)) << comm;
  }
  model::Scenario a2a = llama3_8b(8192, 2);
  a2a.framework.cp_comm = model::CpComm::AllToAll;
  try {
    model::build_program(a2a, model::Granularity::Layer);
    FAIL() << "a2a over 8 key/value heads at tp 8 x cp 2";
  } catch (const model::ScenarioError& error) {
    EXPECT_NE(std::string(error.what()).find("framework.cp_comm = \"a2a\""), std::string::npos) << error.what();
  }
  a2a.parallel.tp = 4;  // and dp 2 on the same 16 GPUs
  a2a.parallel.dp = 2;
  EXPECT_NO_THROW(model::build_program(a2a, model::Granularity::Layer));
}

TEST(ContextParallelSim, At128kTokensCp16FitsAndSplitsTheSequencesTimeWhereCp1DoesNotFit) {
  const model::Scenario cp1 = llama3_8b(131072, 1);
  const model::Scenario cp16 = llama3_8b(131072, 16);
  const model::MemoryEstimate memory1 = model::estimate_memory(cp1);
  const model::MemoryEstimate memory16 = model::estimate_memory(cp16);
  EXPECT_FALSE(memory1.fits) << memory1.peak_bytes / (1 << 30) << " GiB";
  EXPECT_GT(memory1.peak_bytes, memory1.capacity_bytes);
  EXPECT_TRUE(memory16.fits) << memory16.peak_bytes / (1 << 30) << " GiB";
  const AnalyticalCostModel cost(topology::h100_sxm5_80gb());
  const double t1 = simulate(model::build_program(cp1, model::Granularity::Layer), cost).timeline.iteration_time_s;
  const double t16 = simulate(model::build_program(cp16, model::Granularity::Layer), cost).timeline.iteration_time_s;
  std::printf("[ cp ] llama3-8b 128k tokens, TP 8: CP 1 %.3f s (%.0f GiB, does not fit), CP 16 %.3f s (%.1f GiB)\n", t1,
              memory1.peak_bytes / (1 << 30), t16, memory16.peak_bytes / (1 << 30));
  // Faster than CP 1 would be; not faster than 16 x the GPUs allow (the gathers cost time).
  EXPECT_LT(t16, t1 / 4);
  EXPECT_GT(t16, t1 / 16);
}

// Group fidelity replays one actor per TP group: every CP rank's group, so that the CP collectives meet their members
// (a replay of dp x pp groups only would leave them waiting forever or mistime them).
TEST(ContextParallelSim, GroupFidelityAgreesWithRankFidelity) {
  model::Scenario s = llama3_8b(32768, 4);
  s.parallel.dp = 2;
  s.parallel.global_batch = 4;
  s.cluster.nodes = 8;
  const model::Program program = model::build_program(s, model::Granularity::Layer);
  const AnalyticalCostModel cost(topology::h100_sxm5_80gb());
  SimOptions rank, group;
  rank.fidelity = Fidelity::Rank;
  group.fidelity = Fidelity::Group;
  const SimResult by_rank = simulate(program, cost, rank);
  const SimResult by_group = simulate(program, cost, group);
  EXPECT_EQ(by_group.fidelity, Fidelity::Group);
  EXPECT_NEAR(by_group.timeline.iteration_time_s, by_rank.timeline.iteration_time_s,
              1e-3 * by_rank.timeline.iteration_time_s);
}

}  // namespace
}  // namespace twin::sim
