// Hardware specs and rank placement: the numbers the rest of the simulator leans on.
#include <gtest/gtest.h>

#include <set>

#include "topology/hardware.hpp"
#include "topology/placement.hpp"
#include "topology/platform.hpp"

namespace twin::topology {
namespace {

TEST(Hardware, DatasheetPeaks) {
  EXPECT_DOUBLE_EQ(a100_sxm4_80gb().bf16_flops, 312e12);
  EXPECT_DOUBLE_EQ(a100_sxm4_80gb().peak_flops(model::DType::FP32), 19.5e12);
  EXPECT_EQ(a100_sxm4_80gb().sm_count, 108);
  EXPECT_NEAR(h100_sxm5_80gb().bf16_flops, 989.5e12, 1e9);
  EXPECT_DOUBLE_EQ(h200_sxm_141gb().hbm_bytes_per_s, 4.8e12);
  EXPECT_DOUBLE_EQ(h200_sxm_141gb().bf16_flops, h100_sxm5_80gb().bf16_flops);  // same GH100 die
}

TEST(Hardware, DgxNodes) {
  const NodeSpec a100 = dgx_a100();
  EXPECT_EQ(a100.gpus, 8);
  EXPECT_EQ(a100.compute_nics, 8);
  EXPECT_DOUBLE_EQ(a100.nic_bytes_per_s, 25e9);      // HDR 200 Gb/s
  EXPECT_DOUBLE_EQ(a100.nvlink_bytes_per_s, 300e9);  // 600 GB/s bidirectional
  EXPECT_LT(a100.nic_effective_bytes_per_s, a100.nic_bytes_per_s);
  EXPECT_LT(a100.nvlink_effective_bytes_per_s, a100.nvlink_bytes_per_s);
  EXPECT_DOUBLE_EQ(dgx_h100().nic_bytes_per_s, 50e9);  // NDR 400 Gb/s
  EXPECT_EQ(node_spec(model::NodeKind::DgxA100).name, "DGX A100");
  EXPECT_EQ(node_spec_by_gpu_name("h200").gpu.name, "H200-SXM-141GB");
  EXPECT_THROW(node_spec(model::NodeKind::CpuHost), std::invalid_argument);
  EXPECT_THROW(node_spec_by_gpu_name("v100"), std::invalid_argument);
}

TEST(Hardware, TheClustersOwnNetworkReplacesTheNodesNics) {
  // NCCL's ring speed over a NIC: the fastest of its speeds not above the line rate.
  EXPECT_DOUBLE_EQ(nccl_net_speed_bytes_per_s(25e9, false), 24e9);    // HDR 200 Gb/s (NCCL 2.8.3)
  EXPECT_DOUBLE_EQ(nccl_net_speed_bytes_per_s(12.5e9, false), 12e9);  // 100 Gb/s
  EXPECT_DOUBLE_EQ(nccl_net_speed_bytes_per_s(50e9, true), 48e9);     // NDR 400 Gb/s (NCCL 2.18, sm90)
  model::ClusterSpec cluster;
  EXPECT_EQ(node_spec(cluster).name, "DGX A100");  // nothing given: the DGX node as it is
  EXPECT_DOUBLE_EQ(node_spec(cluster).nic_effective_bytes_per_s, dgx_a100().nic_effective_bytes_per_s);
  // 4 x 100 Gb/s for 8 GPUs: each GPU gets half a NIC at NCCL's 12 GB/s; one cable of 100 Gb/s per NIC.
  cluster.nics_per_node = 4;
  cluster.nic_gbps = 100;
  const NodeSpec shared = node_spec(cluster);
  EXPECT_EQ(shared.compute_nics, 4);
  EXPECT_DOUBLE_EQ(shared.nic_bytes_per_s, 12.5e9);
  EXPECT_DOUBLE_EQ(shared.nic_effective_bytes_per_s, 6e9);
  EXPECT_EQ(shared.name, "DGX A100 with 4 x 100 Gb/s NICs");
  EXPECT_DOUBLE_EQ(fabric_spec(cluster).link_bytes_per_s, 12.5e9);
  // More NICs than GPUs: each GPU drives several (32 x 400 Gb/s on 8 H100: 4 each).
  cluster.node = model::NodeKind::DgxH100;
  cluster.nics_per_node = 32;
  cluster.nic_gbps = 400;
  EXPECT_DOUBLE_EQ(node_spec(cluster).nic_effective_bytes_per_s, 4 * 48e9);
}

// A job on part of each node: its GPUs, each with the NIC beside it, on the same NVSwitch.
TEST(Hardware, PartOfANodeKeepsEachGpusLinksAndItsShareOfTheNics) {
  const NodeSpec whole = dgx_a100();
  const NodeSpec two = part_of_node(whole, 2);
  EXPECT_EQ(two.gpus, 2);
  EXPECT_EQ(two.compute_nics, 2);
  EXPECT_DOUBLE_EQ(two.nic_effective_bytes_per_s, whole.nic_effective_bytes_per_s);
  EXPECT_DOUBLE_EQ(two.nvlink_effective_bytes_per_s, whole.nvlink_effective_bytes_per_s);
  EXPECT_EQ(two.nccl_nvlink_channels, whole.nccl_nvlink_channels);
  EXPECT_EQ(two.name, "DGX A100, 2 of its 8 GPUs");
  EXPECT_EQ(part_of_node(whole, 8).name, "DGX A100");
  EXPECT_THROW(part_of_node(whole, 0), std::invalid_argument);
  EXPECT_THROW(part_of_node(whole, 9), std::invalid_argument);
  // A scenario's count: below the node's, its part; 0 (the default) or more, the whole node (more is the
  // simulator's to refuse, by the scenario key).
  EXPECT_EQ(job_part_of_node(whole, 4).gpus, 4);
  EXPECT_EQ(job_part_of_node(whole, 0).gpus, 8);
  EXPECT_EQ(job_part_of_node(whole, 9).gpus, 8);
  // From the scenario: cluster.gpus_per_node below the node's, with or without the cluster's own network.
  model::ClusterSpec cluster;
  cluster.node = model::NodeKind::DgxH200;
  cluster.gpus_per_node = 1;
  EXPECT_EQ(node_spec(cluster).gpus, 1);
  EXPECT_EQ(node_spec(cluster).compute_nics, 1);
  cluster.node = model::NodeKind::DgxA100;
  cluster.gpus_per_node = 4;
  cluster.nics_per_node = 4;  // 4 x 100 Gb/s for 8 GPUs: half a NIC each, 2 NICs for the job's 4 GPUs
  cluster.nic_gbps = 100;
  const NodeSpec shared = node_spec(cluster);
  EXPECT_EQ(shared.gpus, 4);
  EXPECT_EQ(shared.compute_nics, 2);
  EXPECT_DOUBLE_EQ(shared.nic_effective_bytes_per_s, 6e9);
}

TEST(Hardware, EveryDgxKindAScenarioNamesHasItsGpuAndFabric) {
  // A100 40GB: the 80GB part's peaks and SMs, HBM2 at 1555 GB/s, on the same HDR fabric as DGX A100.
  const NodeSpec a100_40 = node_spec(model::NodeKind::DgxA100_40GB);
  EXPECT_EQ(a100_40.gpu.name, "A100-SXM4-40GB");
  EXPECT_DOUBLE_EQ(a100_40.gpu.hbm_bytes_per_s, 1555e9);
  EXPECT_DOUBLE_EQ(a100_40.gpu.bf16_flops, dgx_a100().gpu.bf16_flops);
  EXPECT_DOUBLE_EQ(a100_40.nic_bytes_per_s, dgx_a100().nic_bytes_per_s);
  EXPECT_EQ(fabric_spec(model::NodeKind::DgxA100_40GB).name, fabric_spec(model::NodeKind::DgxA100).name);
  const NodeSpec h200 = node_spec(model::NodeKind::DgxH200);
  EXPECT_EQ(h200.gpu.name, "H200-SXM-141GB");
  EXPECT_EQ(fabric_spec(model::NodeKind::DgxH200).name, fabric_spec(model::NodeKind::DgxH100).name);
  // What validation and the memory check use is the specs' memory, in the same unit (one table: model/'s).
  for (const model::NodeKind kind : {model::NodeKind::DgxA100, model::NodeKind::DgxA100_40GB, model::NodeKind::DgxH100,
                                     model::NodeKind::DgxH200}) {
    EXPECT_EQ(model::gpu_memory_bytes(kind), node_spec(kind).gpu.hbm_bytes) << model::to_string(kind);
    EXPECT_EQ(model::default_gpus_per_node(kind), node_spec(kind).gpus) << model::to_string(kind);
  }
  EXPECT_EQ(model::gpu_memory_bytes(model::NodeKind::DgxA100), 80.0 * 1024 * 1024 * 1024);  // 81920 MiB
  EXPECT_GT(model::gpu_memory_bytes(model::NodeKind::DgxH200), 140.0 * 1024 * 1024 * 1024);  // 143771 MiB
}

TEST(Placement, MegatronOrderIsIdentity) {
  const model::RankLayout layout(8, 35, 8);
  const Placement placement(layout, 8);
  for (int rank = 0; rank < layout.world_size(); ++rank) EXPECT_EQ(placement.gpu_of(rank), rank);
  EXPECT_TRUE(placement.tensor_groups_inside_nodes());
  EXPECT_EQ(placement.nodes(), 280);
  // DP peers of a rank sit in different nodes, one per node, all with the same local index (their own NIC).
  const auto dp_group = layout.group_members(model::Group::Data, layout.rank_of({0, 3, 5}));
  std::set<int> nodes;
  for (int rank : dp_group) {
    nodes.insert(placement.node_of_rank(rank));
    EXPECT_EQ(placement.local_index_of_rank(rank), 5);
  }
  EXPECT_EQ(nodes.size(), dp_group.size());
}

TEST(Placement, OtherOrders) {
  const model::RankLayout layout(4, 2, 4);  // 32 ranks
  const Placement pp_inner(layout, 8, "tp-pp-dp");
  // Pipeline neighbours (same dp, tp) share a node: rank of (dp 0, pp 1, tp 0) on GPU 4.
  EXPECT_EQ(pp_inner.gpu_of(layout.rank_of({0, 1, 0})), 4);
  EXPECT_TRUE(pp_inner.tensor_groups_inside_nodes());
  const Placement spread(layout, 8, "dp-tp-pp");
  EXPECT_FALSE(spread.tensor_groups_inside_nodes());
  EXPECT_EQ(spread.order(), "dp-tp-pp");
  std::set<int> gpus;
  for (int rank = 0; rank < layout.world_size(); ++rank) gpus.insert(spread.gpu_of(rank));
  EXPECT_EQ(gpus.size(), 32u);  // a bijection
  EXPECT_THROW(Placement(layout, 8, "tp-tp-pp"), std::invalid_argument);
  EXPECT_THROW(Placement(layout, 8, "tp-dp"), std::invalid_argument);
}

TEST(Placement, ContextParallelSitsOutsideTensorUnlessNamed) {
  const model::RankLayout layout(model::LayoutSizes{.tp = 2, .pp = 2, .dp = 2, .cp = 2});  // 16 ranks
  const Placement megatron(layout, 8);  // "tp-dp-pp": cp right outside tp, as the ranks are numbered
  for (int rank = 0; rank < layout.world_size(); ++rank) EXPECT_EQ(megatron.gpu_of(rank), rank);
  EXPECT_EQ(megatron.order(), "tp-dp-pp");
  const Placement cp_outer(layout, 8, "tp-dp-cp-pp");
  EXPECT_EQ(cp_outer.order(), "tp-dp-cp-pp");
  EXPECT_EQ(cp_outer.gpu_of(layout.rank_of({.dp = 0, .pp = 0, .tp = 0, .cp = 1})), 4);
  EXPECT_EQ(cp_outer.gpu_of(layout.rank_of({.dp = 1, .pp = 0, .tp = 1, .cp = 0})), 3);
  EXPECT_TRUE(cp_outer.tensor_groups_inside_nodes());
  EXPECT_THROW(Placement(layout, 8, "tp-cp-dp-cp-pp"), std::invalid_argument);
  EXPECT_THROW(Placement(layout, 8, "tp-cp-pp"), std::invalid_argument);
}

TEST(FatTreeShape, NonBlockingAndOptions) {
  PlatformOptions options;
  options.nodes = 560;
  options.fabric.rail_optimized = true;
  FatTreeShape shape = fat_tree_shape(options);
  EXPECT_EQ(shape.levels, 2);
  EXPECT_EQ(shape.nodes_per_leaf, 20);  // a DGX SuperPOD scalable unit
  EXPECT_EQ(shape.leaves, 28);
  EXPECT_EQ(shape.spines, 20);  // as many links up as down
  EXPECT_DOUBLE_EQ(shape.link_bytes_per_s, 8 * 25e9);

  EXPECT_DOUBLE_EQ(shape.up_link_bytes_per_s, 8 * 25e9);
  options.fabric.oversubscription = 3;  // not a divisor of 20: the up-links' rate carries the ratio
  EXPECT_EQ(fat_tree_shape(options).spines, 20);
  EXPECT_DOUBLE_EQ(fat_tree_shape(options).up_link_bytes_per_s, 8 * 25e9 / 3);

  options.fabric = infiniband_hdr_fat_tree();
  options.nodes = 35;
  shape = fat_tree_shape(options);
  EXPECT_EQ(shape.nodes_per_leaf, 2);  // 40-port HDR leaf: 20 ports down = 2 nodes of 8 NICs
  EXPECT_EQ(shape.leaves, 18);
  EXPECT_EQ(shape.positions, 36);  // one empty port

  options.nodes = 1;
  EXPECT_EQ(fat_tree_shape(options).levels, 1);
}

}  // namespace
}  // namespace twin::topology
