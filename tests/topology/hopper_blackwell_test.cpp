// Hopper and Blackwell nodes and today's fabrics: the datasheet numbers, NCCL's model of their links, and a 72-GPU
// NVLink domain as one node of the platform.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <simgrid/s4u.hpp>

#include "tests/topology/in_child.hpp"
#include "topology/hardware.hpp"
#include "topology/placement.hpp"
#include "topology/platform.hpp"

namespace twin::topology {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

TEST(HopperBlackwell, DensePeaksAreHalfTheDatasheetsSparseOnes) {
  // FP8 runs at twice the 16-bit rate on every part that has it; A100 has none.
  for (const GpuSpec& gpu : {h100_sxm5_80gb(), h200_sxm_141gb(), h800_sxm5_80gb(), b200_sxm_180gb(), gb200_186gb()}) {
    EXPECT_DOUBLE_EQ(gpu.fp8_flops, 2 * gpu.bf16_flops) << gpu.name;
  }
  EXPECT_EQ(a100_sxm4_80gb().fp8_flops, 0);
  EXPECT_DOUBLE_EQ(h100_sxm5_80gb().fp8_flops, 1979e12);        // 3,958 TFLOPS with sparsity
  EXPECT_DOUBLE_EQ(b200_sxm_180gb().bf16_flops, 2250e12);       // HGX B200: 4.5 PFLOPS with sparsity
  EXPECT_DOUBLE_EQ(b200_sxm_180gb().fp8_flops, 4500e12);        // 9 PFLOPS with sparsity
  EXPECT_DOUBLE_EQ(gb200_186gb().bf16_flops, 2500e12);          // GB200 NVL72: 5 PFLOPS with sparsity
  EXPECT_DOUBLE_EQ(gb200_186gb().fp8_flops, 5000e12);           // 10 PFLOPS with sparsity
  EXPECT_DOUBLE_EQ(b200_sxm_180gb().hbm_bytes, 183359 * kMiB);  // "180 GB" as the driver counts it
  EXPECT_DOUBLE_EQ(gb200_186gb().hbm_bytes, 189471 * kMiB);     // "186 GB"
  EXPECT_EQ(b200_sxm_180gb().sm_count, 148);
  EXPECT_EQ(gb200_186gb().sm_count, 152);
  EXPECT_EQ(b200_sxm_180gb().compute_capability, 100);
  EXPECT_EQ(h800_sxm5_80gb().compute_capability, 90);
  // H800: H100's compute and memory, only its NVLink cut.
  EXPECT_DOUBLE_EQ(h800_sxm5_80gb().bf16_flops, h100_sxm5_80gb().bf16_flops);
  EXPECT_DOUBLE_EQ(h800_sxm5_80gb().hbm_bytes, h100_sxm5_80gb().hbm_bytes);
}

TEST(HopperBlackwell, NodesLinksAsNcclModelsThem) {
  const NodeSpec h800 = hgx_h800();
  EXPECT_DOUBLE_EQ(h800.nvlink_bytes_per_s, 200e9);  // 400 GB/s bidirectional
  // NCCL's model (8 links of 20.6 GB/s) against what DeepSeek-V3's report measured on these nodes: 160 GB/s.
  EXPECT_NEAR(h800.nvlink_effective_bytes_per_s, 160e9, 0.05 * 160e9);
  EXPECT_DOUBLE_EQ(h800.nic_effective_bytes_per_s, 48e9);  // their "IB (50 GB/s)": NCCL's 48 for a 400 Gb/s NIC
  EXPECT_LT(h800.nvlink_effective_bytes_per_s, dgx_h100().nvlink_effective_bytes_per_s);
  const NodeSpec b200 = dgx_b200();
  EXPECT_EQ(b200.gpus, 8);
  EXPECT_DOUBLE_EQ(b200.nvlink_bytes_per_s, 900e9);  // NVLink 5: 1.8 TB/s bidirectional
  EXPECT_NEAR(b200.nvlink_effective_bytes_per_s, 721.8e9, 1e6);
  EXPECT_LT(b200.nvlink_effective_bytes_per_s, b200.nvlink_bytes_per_s);
  EXPECT_EQ(b200.nccl_nvlink_channels, 32);
  const NodeSpec rack = gb200_nvl72();
  EXPECT_EQ(rack.gpus, 72);
  EXPECT_EQ(rack.compute_nics, 72);
  EXPECT_DOUBLE_EQ(rack.nvlink_effective_bytes_per_s, b200.nvlink_effective_bytes_per_s);
  EXPECT_EQ(node_spec_by_gpu_name("b200").name, "DGX B200");
  EXPECT_EQ(node_spec_by_gpu_name("h800").name, "HGX H800");
  EXPECT_THROW(node_spec_by_gpu_name("gb200"), std::invalid_argument);  // a rack, not a GPU swap
}

TEST(HopperBlackwell, NcclPicksItsSpeedTableByComputeCapability) {
  EXPECT_DOUBLE_EQ(nccl_net_speed_bytes_per_s(50e9, 100), 48e9);   // 400 Gb/s on Blackwell
  EXPECT_DOUBLE_EQ(nccl_net_speed_bytes_per_s(100e9, 100), 96e9);  // 800 Gb/s (ConnectX-8) on Blackwell
  EXPECT_DOUBLE_EQ(nccl_net_speed_bytes_per_s(100e9, 90), 48e9);   // Hopper's table tops out at 48
  EXPECT_DOUBLE_EQ(nccl_net_speed_bytes_per_s(25e9, 80), 24e9);    // HDR on Ampere, as before
  EXPECT_DOUBLE_EQ(nccl_net_speed_bytes_per_s(50e9, true), nccl_net_speed_bytes_per_s(50e9, 90));
}

TEST(HopperBlackwell, FabricsByName) {
  EXPECT_EQ(fabric_by_name("infiniband-hdr").name, infiniband_hdr_fat_tree().name);
  EXPECT_EQ(fabric_by_name("infiniband-ndr").name, infiniband_ndr_fat_tree().name);
  EXPECT_DOUBLE_EQ(fabric_by_name("infiniband-xdr").link_bytes_per_s, 100e9);  // 800 Gb/s
  EXPECT_EQ(fabric_by_name("infiniband-xdr").switch_radix, 144);
  const FabricSpec roce = fabric_by_name("roce");
  EXPECT_DOUBLE_EQ(roce.link_bytes_per_s, 50e9);
  EXPECT_EQ(roce.nodes_per_leaf, 2);  // Llama 3: 16 GPUs of two servers under one top-of-rack switch
  try {
    fabric_by_name("ethernet");
    FAIL() << "an unknown fabric was accepted";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("infiniband-xdr"), std::string::npos) << error.what();
  }
}

TEST(HopperBlackwell, RoceRacksOfTwoServersAreTheLeaves) {
  PlatformOptions options;
  options.nodes = 16;
  options.node = dgx_h100();
  options.fabric = roce_400g_fabric();
  const FatTreeShape shape = fat_tree_shape(options);
  EXPECT_EQ(shape.levels, 2);
  EXPECT_EQ(shape.nodes_per_leaf, 2);
  EXPECT_EQ(shape.leaves, 8);
  // Without the rack rule the same switch would serve 64 / 2 / 8 = 4 nodes.
  options.fabric.nodes_per_leaf = 0;
  EXPECT_EQ(fat_tree_shape(options).nodes_per_leaf, 4);
}

// A GB200 NVL72 rack is one node of 72 GPUs: TP groups of 8 tile it (9 per rack), groups of 16 straddle racks.
TEST(HopperBlackwell, Nvl72RackHoldsTensorGroupsThatDivideIt) {
  const model::RankLayout eight(8, 2, 9);  // 144 ranks: two racks
  const Placement tiled(eight, gb200_nvl72().gpus);
  EXPECT_EQ(tiled.nodes(), 2);
  EXPECT_TRUE(tiled.tensor_groups_inside_nodes());
  const model::RankLayout sixteen(16, 1, 9);  // 144 ranks: the fifth group spans GPUs 64..79, across racks
  EXPECT_FALSE(Placement(sixteen, gb200_nvl72().gpus).tensor_groups_inside_nodes());
}

std::vector<double> nvl72_route_facts() {
  std::vector<std::string> args{"test", "--log=root.thres:critical"};
  for (std::string& option : sanitizer_engine_options()) args.push_back(option);
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  int argc = static_cast<int>(args.size());
  simgrid::s4u::Engine engine(&argc, argv.data());
  configure_flow_model();
  PlatformOptions options;
  options.nodes = 2;
  options.node = gb200_nvl72();
  options.fabric = infiniband_ndr_fat_tree();
  options.group_size = 8;
  const Platform platform(options);
  return {static_cast<double>(platform.gpus()),
          static_cast<double>(platform.route(platform.gpu(0), platform.gpu(71)).size()),  // NVLink, whole rack
          static_cast<double>(platform.route(platform.gpu(0), platform.gpu(72)).size()),  // the next rack: NICs
          static_cast<double>(platform.route(platform.group_endpoint(0, 0), platform.group_endpoint(0, 8)).size())};
}

TEST(HopperBlackwell, Nvl72PlatformKeepsTheRackOnNvlink) {
  const std::vector<double> facts = testing::in_child(nvl72_route_facts);
  ASSERT_EQ(facts.size(), 4u);
  EXPECT_EQ(facts[0], 144);
  EXPECT_EQ(facts[1], 2);  // GPU 0 to GPU 71: its NVLink out, 71's in, as any pair of one NVSwitch domain
  // The next rack: nic up, rack->leaf, leaf->spine, spine->leaf, leaf->rack, nic down (a rack's 72 NICs fill more
  // than a 64-port switch's half, so each rack has its own leaf).
  EXPECT_EQ(facts[2], 6);
  EXPECT_EQ(facts[3], 2);  // TP group slots 0 and 8 of one rack: their NVLink bundles
}

}  // namespace
}  // namespace twin::topology
