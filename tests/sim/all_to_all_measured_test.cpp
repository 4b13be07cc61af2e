// The expert all-to-all inside one node no faster than OpenXLA measured it there (sim/data/collectives_by_size.csv,
// sim/all_to_all.cpp measured_floor_s): on an H100 or B200 node the measured time sets a latency floor at small sizes
// and a rate under NCCL's bus-bandwidth model at large ones; across nodes, and on the A100 (no table), the model as
// before. The floor engages at rank and group fidelity and at layer and op granularity alike.
#include <gtest/gtest.h>

#include <vector>

#include "model/program/program.hpp"
#include "sim/all_to_all.hpp"
#include "sim/cost_model.hpp"
#include "sim/measured_tables.hpp"
#include "sim/simulate.hpp"
#include "tests/sim/measured_tables_support.hpp"
#include "tests/sim/support.hpp"
#include "topology/hardware.hpp"

namespace twin::sim {
namespace {

CommunicationModel node_model(const topology::NodeSpec& node) {
  CommunicationModel model;
  model.node = node;
  return model;
}

// Eight members each holding `operand` bytes spread evenly (their own share included).
std::vector<std::vector<double>> even(double operand, int n = 8) {
  std::vector<std::vector<double>> bytes(n, std::vector<double>(n, operand / n));
  for (int i = 0; i < n; ++i) bytes[i][i] = 0;
  return bytes;
}

// The untouched model: the same node with a GPU name no table knows.
using testing::untabled;

TEST(AllToAllMeasured, InsideAnH100NodeNoFasterThanMeasured) {
  const topology::NodeSpec h100 = topology::dgx_h100();
  const std::vector<int> one_node(8, 0);
  const CollectiveTable& table = *all_to_all_table(h100.gpu.name, 8);
  for (const double operand : {8192.0, 8.0 * 1024 * 1024, 128.0 * 1024 * 1024, 2.0 * 1024 * 1024 * 1024}) {
    const CollectivePlan measured = plan_all_to_all(even(operand), one_node, node_model(h100));
    const CollectivePlan modelled = plan_all_to_all(even(operand), one_node, node_model(untabled(h100)));
    EXPECT_DOUBLE_EQ(measured.estimate_s, std::max(modelled.estimate_s, table.seconds(operand))) << operand;
    EXPECT_GE(measured.phases.at(0).min_s + measured.phases[0].latency_s, table.seconds(operand) * (1 - 1e-12));
  }
  // At 8 MiB NCCL's tuning model says 32 us; measured, 71 us: more than twice.
  const double mib8 = 8.0 * 1024 * 1024;
  EXPECT_GT(plan_all_to_all(even(mib8), one_node, node_model(h100)).estimate_s,
            2 * plan_all_to_all(even(mib8), one_node, node_model(untabled(h100))).estimate_s);
}

TEST(AllToAllMeasured, AcrossNodesAndOnTheA100TheModelAsBefore) {
  const std::vector<int> two_nodes{0, 0, 0, 0, 1, 1, 1, 1};
  const double operand = 64e6;
  EXPECT_DOUBLE_EQ(plan_all_to_all(even(operand), two_nodes, node_model(topology::dgx_h100())).estimate_s,
                   plan_all_to_all(even(operand), two_nodes, node_model(untabled(topology::dgx_h100()))).estimate_s);
  EXPECT_EQ(all_to_all_table(topology::dgx_a100().gpu.name, 8), nullptr);
  EXPECT_EQ(all_to_all_table("H800-SXM5-80GB", 8), nullptr);  // 8 NVLinks of the H100's 18
  EXPECT_NE(all_to_all_table("GB200-186GB", 8), nullptr);
  EXPECT_NE(all_to_all_table("B200-SXM-180GB", 4), nullptr);
  EXPECT_EQ(all_to_all_table("B200-SXM-180GB", 6), nullptr);  // no such group measured
}

TEST(AllToAllMeasured, TheFloorFallsInRateTowardsSmallSizes) {
  const CollectiveTable& table = *all_to_all_table("H100-SXM5-80GB", 8);
  double previous_rate = 1e300;
  for (const double operand : {1e9, 1e8, 1e7, 1e6, 1e5, 1e4}) {
    const double rate = operand / table.seconds(operand);
    EXPECT_LT(rate, previous_rate) << operand;
    previous_rate = rate;
  }
  // Below the smallest size measured, its time: a floor, not a rate.
  EXPECT_DOUBLE_EQ(table.seconds(10), table.seconds(1024));
}

model::Scenario small_moe_h100(int pp) {
  testing::Plan plan;
  plan.layers = 4;
  plan.hidden = 2048;
  plan.heads = 16;
  plan.seq = 2048;
  plan.vocab = 4096;
  plan.pp = pp;
  plan.dp = 8;
  plan.global_batch = 16;
  plan.node = "dgx-h100";
  plan.nodes = pp;
  model::Scenario s = testing::make_scenario(plan);
  s.model.experts = 64;
  s.model.top_k = 4;
  s.model.moe_ffn_hidden = 768;
  s.parallel.ep = 8;
  return s;
}

// Through the engine: an EP 8 plan inside each node takes longer with the measured floor, at both fidelities and
// granularities, on one stage and on two.
TEST(AllToAllMeasured, EngagesAtEveryFidelityAndGranularity) {
  testing::expect_tables_lengthen_every_cell(small_moe_h100);
}

}  // namespace
}  // namespace twin::sim
