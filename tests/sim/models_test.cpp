// The analytical cost model and the collective planner, without SimGrid.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include "sim/collectives.hpp"
#include "sim/cost_model.hpp"
#include "tests/sim/support.hpp"
#include "topology/hardware.hpp"

namespace twin::sim {
namespace {

TEST(CostModel, ReproducesTheMeasuredGemm) {
  // At the measured shape, the model gives the measured rate: 230 TFLOP/s on an A100 with CUDA 11.7 (8192^3 fp16,
  // mli/transformers-benchmarks), 792.1 on an H100 (mamf-finder).
  const AnalyticalCostModel a100(topology::a100_sxm4_80gb());
  const double m = 8192, n = 8192, k = 8192;
  EXPECT_NEAR(2 * m * n * k / a100.gemm_time_s(m, n, k, 1, model::DType::FP16), 230e12, 1e9);
  EXPECT_NEAR(a100.parameters().gemm_efficiency, 230.0 / 312 / (2048.0 / 2052), 1e-3);  // 19 waves for 18.96
  const AnalyticalCostModel h100(topology::h100_sxm5_80gb());
  EXPECT_NEAR(2 * 6144.0 * 17920 * 2816 / h100.gemm_time_s(6144, 17920, 2816, 1, model::DType::BF16), 792.1e12, 1e9);
}

TEST(CostModel, TheClustersOwnMeasurementsReplaceTheCitedOnes) {
  const topology::GpuSpec gpu = topology::a100_sxm4_80gb();
  const AnalyticalParameters cited = analytical_parameters(gpu);
  EXPECT_FALSE(cited.gemm_measured_here);
  EXPECT_FALSE(cited.hbm_measured_here);
  // The cited measurement given as the cluster's own changes nothing.
  model::ClusterSpec cluster;
  cluster.gemm_tflops = 230;
  cluster.hbm_gb_per_s = 1616;
  const AnalyticalParameters same = analytical_parameters(gpu, cluster);
  EXPECT_DOUBLE_EQ(same.gemm_efficiency, cited.gemm_efficiency);
  EXPECT_NEAR(same.hbm_efficiency, cited.hbm_efficiency, 1e-12);
  EXPECT_TRUE(same.gemm_measured_here);
  EXPECT_TRUE(same.hbm_measured_here);
  // A CUDA 12 stack (mamf-finder: 267.9 TFLOP/s at 6912 x 16384 x 2048) and a faster HBM: the model reproduces the
  // measurement at its own shape, and a memory-bound op runs at the measured bandwidth.
  cluster.gemm_tflops = 267.9;
  cluster.gemm_shape = {6912, 16384, 2048};
  cluster.hbm_gb_per_s = 1800;
  const AnalyticalCostModel measured(gpu, analytical_parameters(gpu, cluster));
  EXPECT_NEAR(2 * 6912.0 * 16384 * 2048 / measured.gemm_time_s(6912, 16384, 2048, 1, model::DType::BF16), 267.9e12,
              1e9);
  EXPECT_NEAR(measured.memory_time_s(1.8e9), 1e-3, 1e-12);
  const AnalyticalCostModel default_model(gpu);
  EXPECT_LT(measured.gemm_time_s(8192, 8192, 8192, 1, model::DType::BF16),
            default_model.gemm_time_s(8192, 8192, 8192, 1, model::DType::BF16));
  // The attention GEMMs' share of the streaming rate (bench/gpu twin_gemm_peak measures it) replaces the cited one.
  EXPECT_FALSE(cited.attention_measured_here);
  cluster.attention_gemm_hbm_fraction = 0.8;
  const AnalyticalParameters attention = analytical_parameters(gpu, cluster);
  EXPECT_DOUBLE_EQ(attention.attention_gemm_hbm_fraction, 0.8);
  EXPECT_TRUE(attention.attention_measured_here);
  EXPECT_NE(cited.attention_gemm_hbm_fraction, 0.8);
}

TEST(CostModel, AMeasurementBeyondTheGpuIsRefusedByName) {
  const topology::GpuSpec gpu = topology::a100_sxm4_80gb();
  // `cluster`'s measurements are refused with a message that contains `expected`.
  auto expect_refused = [&gpu](const model::ClusterSpec& cluster, const std::string& expected) {
    try {
      analytical_parameters(gpu, cluster);
      ADD_FAILURE() << "accepted; expected the refusal: " << expected;
    } catch (const std::invalid_argument& error) {
      EXPECT_NE(std::string(error.what()).find(expected), std::string::npos) << error.what();
    }
  };
  model::ClusterSpec cluster;
  cluster.gemm_tflops = 400;  // an H100's rate on an A100
  expect_refused(cluster,
                 "cluster.gemm_tflops = 400 exceeds the A100-SXM4-80GB's 16-bit tensor-core peak of 312 TFLOP/s");
  cluster.gemm_tflops = 0;
  cluster.hbm_gb_per_s = 3350;  // an H100's datasheet bandwidth
  expect_refused(cluster, "cluster.hbm_gb_per_s = 3350 exceeds the A100-SXM4-80GB's datasheet HBM bandwidth");
  // Under 5 % of the datasheet: a unit slip (here PFLOP/s for TFLOP/s, TB/s for GB/s), said so.
  cluster.hbm_gb_per_s = 0;
  cluster.gemm_tflops = 0.23;
  expect_refused(cluster,
                 "cluster.gemm_tflops = 0.23 is under 5 % of the A100-SXM4-80GB's 16-bit tensor-core peak of "
                 "312 TFLOP/s: is it in TFLOP/s?");
  cluster.gemm_tflops = 0;
  cluster.hbm_gb_per_s = 1.6;
  expect_refused(cluster, "cluster.hbm_gb_per_s = 1.6 is under 5 % of the A100-SXM4-80GB's datasheet HBM bandwidth");
  // The attention GEMMs' fraction given as a percentage's hundredth (0.0064 for 0.64), said so.
  cluster.hbm_gb_per_s = 0;
  cluster.attention_gemm_hbm_fraction = 0.0064;
  expect_refused(cluster, "cluster.attention_gemm_hbm_fraction = 0.0064 is under 5 % of the streaming rate");
}

TEST(CostModel, WaveQuantization) {
  // 108 tiles of 128x128 fill the A100's 108 SMs once; one more tile costs a whole second wave.
  const AnalyticalCostModel a100(topology::a100_sxm4_80gb());
  const double k = 8192;
  const double one_wave = a100.gemm_time_s(128 * 12, 128 * 9, k, 1, model::DType::BF16);
  const double two_waves = a100.gemm_time_s(128 * 12 + 1, 128 * 9, k, 1, model::DType::BF16);
  EXPECT_NEAR(two_waves / one_wave, 2.0, 0.15);
  // A partial tile costs a whole tile: 129 rows cost what 256 do (within 0.3 %: 256 rows fill their two waves, where
  // the measured rate the model never exceeds, 230 TFLOP/s, is 0.2 % under the tile model's 230.5).
  EXPECT_NEAR(a100.gemm_time_s(129, 128 * 108, k, 1, model::DType::BF16) /
                  a100.gemm_time_s(256, 128 * 108, k, 1, model::DType::BF16),
              1.0, 0.003);
}

TEST(CostModel, SkinnyGemmsAreMemoryBound) {
  const AnalyticalCostModel a100(topology::a100_sxm4_80gb());
  // [16, 8192] x [8192, 8192]: 2 GFLOP but 134 MB of weights to read.
  const double t = a100.gemm_time_s(16, 8192, 8192, 1, model::DType::BF16);
  EXPECT_NEAR(t, a100.memory_time_s(2.0 * (16 * 8192 + 8192 * 8192 + 16 * 8192)), 1e-12);
}

TEST(CostModel, FusedLayerCostsTheSumOfItsParts) {
  testing::Plan plan;
  plan.tp = 8;
  plan.hidden = 4096;
  plan.heads = 32;
  const model::Scenario scenario = testing::make_scenario(plan);
  const AnalyticalCostModel cost(topology::a100_sxm4_80gb());
  for (model::Phase phase : {model::Phase::Forward, model::Phase::Backward}) {
    double parts = 0;
    for (const model::Op& op : model::layer_compute_ops(scenario, 3, phase)) parts += cost.compute_time_s(scenario, op);
    EXPECT_DOUBLE_EQ(cost.compute_time_s(scenario, model::fused_layer_op(scenario, 3, phase)), parts);
    EXPECT_GT(parts, 0);
  }
}

TEST(CostModel, BackwardCostsAboutTwiceTheForward) {
  testing::Plan plan;
  plan.tp = 8;
  plan.hidden = 8192;
  plan.heads = 64;
  plan.seq = 2048;
  const model::Scenario scenario = testing::make_scenario(plan);
  const AnalyticalCostModel cost(topology::a100_sxm4_80gb());
  const double forward = cost.compute_time_s(scenario, model::fused_layer_op(scenario, 0, model::Phase::Forward));
  const double backward = cost.compute_time_s(scenario, model::fused_layer_op(scenario, 0, model::Phase::Backward));
  EXPECT_NEAR(backward / forward, 2.0, 0.25);
}

const topology::NodeSpec kNode = topology::dgx_a100();

CommunicationModel communication() {
  CommunicationModel model;
  model.node = kNode;
  return model;
}

TEST(Collectives, RingFlowsCarryTheRingShare) {
  const CollectivePlan plan =
      plan_collective(model::CollectiveKind::AllReduce, 8e8, {0, 1, 2, 3}, communication(), CollectiveAlgorithm::Ring);
  ASSERT_EQ(plan.phases.size(), 1u);
  ASSERT_EQ(plan.phases[0].flows.size(), 4u);
  for (const Flow& flow : plan.phases[0].flows) {
    EXPECT_EQ(flow.to, (flow.from + 1) % 4);
    EXPECT_DOUBLE_EQ(flow.bytes, 2.0 * 3 / 4 * 8e8);
  }
  const auto gather =
      plan_collective(model::CollectiveKind::AllGather, 8e8, {0, 1, 2, 3}, communication(), CollectiveAlgorithm::Ring);
  EXPECT_DOUBLE_EQ(gather.phases[0].flows[0].bytes, 3.0 / 4 * 8e8);
}

TEST(Collectives, AutoIsHierarchicalWhenMembersShareNodes) {
  const CollectivePlan plan = plan_collective(model::CollectiveKind::AllReduce, 1e9, {0, 0, 1, 1, 2, 2},
                                              communication(), CollectiveAlgorithm::Auto);
  EXPECT_EQ(plan.algorithm, CollectiveAlgorithm::Hierarchical);
  ASSERT_EQ(plan.phases.size(), 3u);
  EXPECT_EQ(plan.phases[1].flows.size(), 6u);  // two rings (one per local index) of three nodes
  EXPECT_DOUBLE_EQ(plan.phases[1].flows[0].bytes, 2.0 * 2 / 3 * 1e9 / 2);
}

TEST(Collectives, SmallMessagesAreLatencyBoundAndUseTheTree) {
  // The 4-byte gradient-norm all-reduce over 420 nodes: NCCL's tree with LL, no flows.
  std::vector<int> nodes;
  for (int node = 0; node < 420; ++node) nodes.push_back(node);
  const CollectivePlan plan =
      plan_collective(model::CollectiveKind::AllReduce, 4, nodes, communication(), CollectiveAlgorithm::Auto);
  EXPECT_EQ(plan.algorithm, CollectiveAlgorithm::Analytical);
  EXPECT_TRUE(plan.phases.empty());
  const NcclTuning nccl;
  EXPECT_NEAR(plan.estimate_s, nccl.tree_ll_base_s + 2 * 8 * nccl.tree_ll_net_step_s, 1e-7);
}

TEST(Collectives, NcclPicksItsProtocolBySize) {
  // Eight ranks of one DGX A100: NCCL 2.8.3's ring all-reduce, 14 steps over NVLink. LL for tiny messages, LL128
  // (10 us + 14 x 1.9 us; bus min(235 x 0.92, 16.9 x 12 channels) = 202.8 GB/s) in the middle, Simple (8.4 + 14 x 3.4
  // us at 235 GB/s) for large ones.
  const std::vector<int> one_node(8, 0);
  const NcclTuning nccl;
  const auto plan = [&](double bytes) {
    return plan_collective(model::CollectiveKind::AllReduce, bytes, one_node, communication(),
                           CollectiveAlgorithm::Ring);
  };
  EXPECT_EQ(plan(4e3).protocol, Protocol::LL);
  const double mid = 4e6;
  EXPECT_EQ(plan(mid).protocol, Protocol::LL128);
  EXPECT_NEAR(plan(mid).estimate_s, 10e-6 + 14 * 1.9e-6 + mid / (202.8e9 * 8 / 14), 1e-9);
  EXPECT_EQ(plan(1e8).protocol, Protocol::Simple);
  EXPECT_NEAR(plan(1e8).estimate_s,
              nccl.ring_simple_base_s + 14 * nccl.ring_simple_nvlink_step_s + 1e8 / (235e9 * 8 / 14), 1e-9);
  // LL128's flows carry the bytes its lower bus bandwidth stands for.
  const CollectivePlan ll128 = plan(mid);
  EXPECT_NEAR(ll128.phases.at(0).flows.at(0).bytes, 2.0 * 7 / 8 * mid * 235 / 202.8, 1e-3);
  // One rank per node: LL128 reaches 0.7 of the NIC's 24 GB/s ("sending/receiving at the same GPU through the NIC").
  const std::vector<int> eight_nodes{0, 1, 2, 3, 4, 5, 6, 7};
  const auto across =
      plan_collective(model::CollectiveKind::AllReduce, 1e6, eight_nodes, communication(), CollectiveAlgorithm::Ring);
  EXPECT_EQ(across.protocol, Protocol::LL128);
  EXPECT_NEAR(across.estimate_s, 10e-6 + 14 * 4.0e-6 + 1e6 / (0.7 * 24e9 * 8 / 14), 1e-9);
}

TEST(Collectives, TreeFlows) {
  const CollectivePlan plan = plan_collective(model::CollectiveKind::AllReduce, 1e9, {0, 1, 2, 3, 4}, communication(),
                                              CollectiveAlgorithm::Tree);
  EXPECT_EQ(plan.algorithm, CollectiveAlgorithm::Tree);
  ASSERT_EQ(plan.phases.size(), 1u);
  EXPECT_EQ(plan.phases[0].flows.size(), 16u);  // two trees of 4 edges, both directions
  // What each flow carries: half the message per tree, inflated by the share of the links' bus bandwidth NCCL's tree
  // reaches (one member per node, one channel: min(NIC x tree fraction, the per-channel cap), over the NIC).
  ASSERT_EQ(plan.protocol, Protocol::Simple);
  const NcclTuning nccl;
  const double nic = kNode.nic_effective_bytes_per_s;
  const double tree_bus =
      std::min(nic * nccl.tree_bandwidth_fraction, nccl.tree_max_more_nodes_per_channel_bytes_per_s);
  const double per_flow = 1e9 / 2 * nic / tree_bus;
  double total = 0;
  std::multiset<std::pair<int, int>> edges;
  for (const Flow& flow : plan.phases[0].flows) {
    EXPECT_DOUBLE_EQ(flow.bytes, per_flow) << flow.from << " -> " << flow.to;
    total += flow.bytes;
    edges.insert({flow.from, flow.to});
  }
  EXPECT_DOUBLE_EQ(total, 16 * per_flow);
  // the binary tree 0 <- 1, 2; 1 <- 3, 4 and its mirror 4 <- 3, 2; 3 <- 1, 0, each edge up and down
  const std::multiset<std::pair<int, int>> expected = {{1, 0}, {0, 1}, {2, 0}, {0, 2}, {3, 1}, {1, 3}, {4, 1}, {1, 4},
                                                       {3, 4}, {4, 3}, {2, 4}, {4, 2}, {1, 3}, {3, 1}, {0, 3}, {3, 0}};
  EXPECT_EQ(edges, expected);
  // and NCCL's estimate of the same bytes at the tree's algorithm bandwidth (half its bus bandwidth)
  EXPECT_NEAR(plan.estimate_s - plan.phases[0].latency_s, 1e9 / (0.5 * tree_bus), 1e-12);
}

TEST(Collectives, OneMemberOrIdealIsFree) {
  EXPECT_TRUE(plan_collective(model::CollectiveKind::AllReduce, 1e9, {0}, communication(), CollectiveAlgorithm::Auto)
                  .phases.empty());
  CommunicationModel ideal = communication();
  ideal.ideal = true;
  const auto plan = plan_collective(model::CollectiveKind::AllReduce, 1e9, {0, 1}, ideal, CollectiveAlgorithm::Auto);
  EXPECT_TRUE(plan.phases.empty());
  EXPECT_EQ(plan.estimate_s, 0);
}

}  // namespace
}  // namespace twin::sim
