// Collectives and point-to-point messages through the whole engine, against their closed forms.
#include <gtest/gtest.h>

#include "sim/simulate.hpp"
#include "tests/sim/support.hpp"
#include "topology/hardware.hpp"

namespace twin::sim {
namespace {

using testing::collective;
using testing::hand_program;
using testing::make_scenario;
using testing::Plan;

const topology::NodeSpec kA100Node = topology::dgx_a100();
const NcclTuning kNcclTuning;

double run(const model::Program& program, Fidelity fidelity) {
  SimOptions options;
  options.fidelity = fidelity;
  return simulate(program, FixedCostModel(0, 0), options).timeline.iteration_time_s;
}

// A DP all-reduce of S bytes over n nodes, one member per node: 2(n-1)/n S / B plus NCCL's ring latency. All eight TP
// ranks run theirs at once, each over its own NIC, so they do not slow each other down.
TEST(RingAllReduce, AcrossNodesMatchesTheClosedForm) {
  const double S = 1e9;
  for (const int n : {2, 4, 8}) {
    Plan plan;
    plan.tp = 8;
    plan.dp = n;
    plan.nodes = n;
    plan.global_batch = n;
    const auto program =
        hand_program(make_scenario(plan), {{collective(model::CollectiveKind::AllReduce, model::Group::Data, S)}});
    const double expected = 2.0 * (n - 1) / n * S / kA100Node.nic_effective_bytes_per_s +
                            kNcclTuning.ring_simple_base_s + 2 * (n - 1) * kNcclTuning.ring_simple_net_step_s;
    EXPECT_NEAR(run(program, Fidelity::Rank), expected, 1e-9 * expected) << "n = " << n;
    EXPECT_NEAR(run(program, Fidelity::Group), expected, 1e-9 * expected) << "n = " << n;
  }
}

// The same on the cluster's own network (cluster.nics_per_node, cluster.nic_gbps): four 100 Gb/s NICs for eight GPUs,
// all eight rails busy at once, so each ring gets half a NIC at NCCL's 12 GB/s.
TEST(RingAllReduce, AcrossNodesOnSharedNicsGetsItsShare) {
  const double S = 1e9;
  const int n = 4;
  Plan plan;
  plan.tp = 8;
  plan.dp = n;
  plan.nodes = n;
  plan.global_batch = n;
  model::Scenario scenario = make_scenario(plan);
  scenario.cluster.nics_per_node = 4;
  scenario.cluster.nic_gbps = 100;
  const auto program = hand_program(scenario, {{collective(model::CollectiveKind::AllReduce, model::Group::Data, S)}});
  const double expected =
      2.0 * (n - 1) / n * S / 6e9 + kNcclTuning.ring_simple_base_s + 2 * (n - 1) * kNcclTuning.ring_simple_net_step_s;
  EXPECT_NEAR(run(program, Fidelity::Rank), expected, 1e-9 * expected);
  EXPECT_NEAR(run(program, Fidelity::Group), expected, 1e-9 * expected);
}

TEST(RingAllReduce, InsideANodeOnNvlink) {
  const double S = 1e9;
  Plan plan;
  plan.tp = 8;
  const auto program =
      hand_program(make_scenario(plan), {{collective(model::CollectiveKind::AllReduce, model::Group::Tensor, S)}});
  const double expected = 2.0 * 7 / 8 * S / kA100Node.nvlink_effective_bytes_per_s + kNcclTuning.ring_simple_base_s +
                          14 * kNcclTuning.ring_simple_nvlink_step_s;
  EXPECT_NEAR(run(program, Fidelity::Rank), expected, 1e-9 * expected);   // flows on the NVLinks
  EXPECT_NEAR(run(program, Fidelity::Group), expected, 1e-9 * expected);  // analytical
}

TEST(RingAllReduce, HierarchicalWhenMembersShareNodes) {
  // tp 2, dp 8 on two nodes: each DP group has 4 members per node. Reduce-scatter in the node, all-reduce of S/4
  // across the two nodes (each member over its own NIC), all-gather in the node.
  const double S = 1e9;
  Plan plan;
  plan.tp = 2;
  plan.dp = 8;
  plan.nodes = 2;
  plan.global_batch = 8;
  const auto program =
      hand_program(make_scenario(plan), {{collective(model::CollectiveKind::AllReduce, model::Group::Data, S)}});
  const double nvlink = kA100Node.nvlink_effective_bytes_per_s, nic = kA100Node.nic_effective_bytes_per_s;
  const double expected = 2 * (0.75 * S / nvlink + 3 * kNcclTuning.ring_simple_nvlink_step_s) +
                          (S / 4 / nic + 2 * kNcclTuning.ring_simple_net_step_s) + kNcclTuning.ring_simple_base_s;
  EXPECT_NEAR(run(program, Fidelity::Rank), expected, 1e-9 * expected);
}

TEST(PointToPoint, OneMessageBetweenNodes) {
  const double S = 2.4e8;  // 10 ms on one HDR NIC (1.25 ms once scattered over eight)
  Plan plan;
  plan.tp = 8;
  plan.pp = 2;
  plan.layers = 2;
  plan.nodes = 2;
  model::Op send;
  send.kind = model::OpKind::Send;
  send.stream = model::Stream::Pipeline;
  send.micro_batch = 0;
  send.peer_stage = 1;
  send.tag_virtual_stage = 0;
  send.bytes = S;
  model::Op recv = send;
  recv.kind = model::OpKind::Recv;
  recv.peer_stage = 0;
  const auto program = hand_program(make_scenario(plan), {{send}, {recv}});
  // Megatron's scatter/gather (model::pipeline_transfer): each TP rank sends 1/8 of the tensor over its own NIC
  // (bandwidth, NCCL's network step latency, two fabric links: both nodes under one leaf switch), then the receivers
  // all-gather it on NVLink.
  const double gather = kNcclTuning.ring_simple_base_s + 7 * kNcclTuning.ring_simple_nvlink_step_s +
                        7.0 / 8 * S / kA100Node.nvlink_effective_bytes_per_s;
  const double expected =
      S / 8 / kA100Node.nic_effective_bytes_per_s + kNcclTuning.ring_simple_net_step_s + 2 * 130e-9 + gather;
  EXPECT_NEAR(run(program, Fidelity::Rank), expected, 1e-9);
  EXPECT_NEAR(run(program, Fidelity::Group), expected, 1e-9);
}

TEST(Collectives, WaitForTheLastMember) {
  // Stage 0 computes 5 ms before the embedding all-reduce with the last stage: both finish together, after it.
  Plan plan;
  plan.tp = 4;
  plan.pp = 2;
  plan.layers = 2;
  model::Op compute;
  compute.what = model::ComputeKind::TransformerLayer;
  compute.phase = model::Phase::Forward;
  const auto ar = collective(model::CollectiveKind::AllReduce, model::Group::Embedding, 1e3);  // latency bound
  const auto program = hand_program(make_scenario(plan), {{compute, ar}, {ar}});
  SimOptions options;
  options.fidelity = Fidelity::Rank;
  const SimResult result = simulate(program, FixedCostModel(5e-3, 0), options);
  const auto& stage1 = result.timeline.ranks.at(1);  // rank of (dp 0, pp 1, tp 0) is recorded second
  EXPECT_EQ(stage1.stage, 1);
  EXPECT_DOUBLE_EQ(stage1.spans[0].start_s, 0);
  EXPECT_NEAR(stage1.spans[0].active_s, 5e-3, 1e-12);  // it only starts when stage 0 arrives
  EXPECT_GT(stage1.spans[0].end_s, 5e-3);
  EXPECT_DOUBLE_EQ(stage1.spans[0].end_s, result.timeline.ranks.at(0).spans[1].end_s);
}

}  // namespace
}  // namespace twin::sim
