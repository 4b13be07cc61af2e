// The SimGrid platform: routes cross the links the hardware has, flows share them fairly, one GPU alone gets one
// NIC. Each test builds its platform in a child process (one SimGrid engine per process).
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include <simgrid/s4u.hpp>

#include "tests/topology/in_child.hpp"
#include "topology/platform.hpp"

namespace twin::topology {
namespace {

namespace sg4 = simgrid::s4u;
using testing::in_child;

// A fresh engine with our flow model; `args` keep SimGrid quiet (and add what a sanitizer build needs).
sg4::Engine make_engine() {
  static std::vector<std::string> args = [] {
    std::vector<std::string> list{"test", "--log=root.thres:critical"};
    for (std::string& option : sanitizer_engine_options()) list.push_back(std::move(option));
    return list;
  }();
  static std::vector<char*> argv = [] {
    std::vector<char*> pointers;
    for (std::string& arg : args) pointers.push_back(arg.data());
    pointers.push_back(nullptr);
    return pointers;
  }();
  int argc = static_cast<int>(args.size());
  return sg4::Engine(&argc, argv.data());
}

std::vector<double> route_facts(int nodes, bool rail_optimized) {
  auto engine = make_engine();
  configure_flow_model();
  PlatformOptions options;
  options.nodes = nodes;
  options.fabric.rail_optimized = rail_optimized;
  options.group_size = 8;
  const Platform platform(options);
  const int last = 8 * (nodes - 1);
  std::vector<double> facts;
  facts.push_back(static_cast<double>(platform.route(platform.gpu(0), platform.gpu(1)).size()));         // NVLink
  facts.push_back(static_cast<double>(platform.route(platform.gpu(0), platform.gpu(8)).size()));         // same leaf
  facts.push_back(static_cast<double>(platform.route(platform.gpu(3), platform.gpu(last + 3)).size()));  // spine
  facts.push_back(platform.route_latency_s(platform.gpu(3), platform.gpu(last + 3)));
  facts.push_back(
      static_cast<double>(platform.route(platform.group_endpoint(0, 0), platform.group_endpoint(nodes - 1, 0)).size()));
  // GPU 3's inter-node traffic leaves through its own NIC, never GPU 0's links.
  bool through_gpu0 = false, through_own_nic = false;
  for (const sg4::Link* link : platform.route(platform.gpu(3), platform.gpu(last + 3))) {
    const std::string name = link->get_name();
    through_gpu0 |= name.find("node0-gpu0") != std::string::npos;
    through_own_nic |= name == "node0-gpu3-nic_UP";
  }
  facts.push_back(through_gpu0 ? 1 : 0);
  facts.push_back(through_own_nic ? 1 : 0);
  return facts;
}

TEST(Platform, RoutesCrossTheExpectedLinks) {
  const std::vector<double> facts = in_child([] { return route_facts(35, false); });
  ASSERT_EQ(facts.size(), 7u);
  EXPECT_EQ(facts[0], 2);                    // nvlink out of GPU 0, into GPU 1
  EXPECT_EQ(facts[1], 4);                    // nic up, node->leaf, leaf->node, nic down
  EXPECT_EQ(facts[2], 6);                    // nic up, node->leaf, leaf->spine, spine->leaf, leaf->node, nic down
  EXPECT_NEAR(facts[3], 4 * 130e-9, 1e-12);  // four fabric links, one switch hop each
  EXPECT_EQ(facts[4], 6);                    // group endpoints: bundled NICs, then the same fabric path
  EXPECT_EQ(facts[5], 0);
  EXPECT_EQ(facts[6], 1);
}

TEST(Platform, RailOptimizedScalableUnitIsOneLeaf) {
  const std::vector<double> facts = in_child([] { return route_facts(20, true); });
  EXPECT_EQ(facts[2], 4);  // 20 nodes under one leaf: no spine
}

// Seconds each of a set of flows takes when started together.
std::vector<double> flow_times(const std::vector<std::pair<int, int>>& flows, double bytes, int nodes = 4,
                               double oversubscription = 1) {
  return in_child([&] {
    auto engine = make_engine();
    configure_flow_model();
    PlatformOptions options;
    options.nodes = nodes;
    options.fabric.oversubscription = oversubscription;
    const Platform platform(options);
    std::vector<double> finish(flows.size(), 0.0);
    sg4::Actor::create("driver", platform.gpu(0), [&] {
      std::vector<sg4::CommPtr> comms;
      for (const auto& [from, to] : flows) {
        comms.push_back(sg4::Comm::sendto_async(platform.gpu(from), platform.gpu(to), static_cast<uint64_t>(bytes)));
      }
      for (std::size_t i = 0; i < comms.size(); ++i) {
        comms[i]->wait();
        finish[i] = comms[i]->get_finish_time();
      }
    });
    engine.run();
    return finish;
  });
}

TEST(Platform, OneFlowRunsAtTheNicRate) {
  const double nic = dgx_a100().nic_effective_bytes_per_s;
  const auto t = flow_times({{0, 8}}, nic);  // one second of NIC
  EXPECT_NEAR(t[0], 1.0, 1e-9);              // latencies are paid by the engine, not SimGrid
}

TEST(Platform, TwoFlowsSharingALinkTakeTwiceAsLong) {
  const double nic = dgx_a100().nic_effective_bytes_per_s;
  const auto t = flow_times({{0, 8}, {0, 16}}, nic);  // both leave through GPU 0's NIC
  EXPECT_NEAR(t[0], 2.0, 1e-6);
  EXPECT_NEAR(t[1], 2.0, 1e-6);
}

TEST(Platform, EachGpuHasItsOwnNic) {
  const double nic = dgx_a100().nic_effective_bytes_per_s;
  // Eight GPUs of node 0 to eight GPUs of node 1: eight NICs, no sharing (the fabric link carries 8 cables).
  std::vector<std::pair<int, int>> flows;
  for (int g = 0; g < 8; ++g) flows.push_back({g, 8 + g});
  for (double t : flow_times(flows, nic)) EXPECT_NEAR(t, 1.0, 1e-6);
}

TEST(Platform, AnOversubscribedLeafSharesItsUpLinksAtExactlyTheRatio) {
  const double nic = dgx_a100().nic_effective_bytes_per_s;
  // Nodes 0 and 1 (one 40-port leaf) send from all 16 GPUs to nodes 2 and 3 (the next leaf): every flow crosses the
  // first leaf's up-links, which carry 1/R of what its nodes can send.
  std::vector<std::pair<int, int>> flows;
  for (int g = 0; g < 16; ++g) flows.push_back({g, 16 + g});
  PlatformOptions options;
  options.nodes = 4;
  const FatTreeShape shape = fat_tree_shape(options);  // 2 nodes per leaf, each with 8 cables of 25 GB/s up
  ASSERT_EQ(shape.nodes_per_leaf, 2);
  // Non-blocking, each flow runs at its NIC's effective rate (24 GB/s, below the 25 GB/s cable).
  for (double t : flow_times(flows, nic, 4, 1.0)) EXPECT_NEAR(t, 1.0, 1e-6);
  // Oversubscribed R : 1, the 16 flows share 2 x 200 / R GB/s: R = 3 is not rounded to a whole number of links.
  for (double ratio : {3.0, 4.0}) {
    const double share = shape.spines * shape.link_bytes_per_s / ratio / 16;
    for (double t : flow_times(flows, nic, 4, ratio)) EXPECT_NEAR(t, nic / share, 1e-6) << "R = " << ratio;
  }
  // Inside a leaf nothing changes.
  for (double t : flow_times({{0, 8}}, nic, 4, 4.0)) EXPECT_NEAR(t, 1.0, 1e-6);
}

// D-mod-k: the destination node picks the spine (node mod spines), as SimGrid's FatTreeZone routed. Eight nodes, two
// per leaf, two spines, each leaf's up-links at 1/4 of its nodes' rate (50 GB/s each): four GPUs of node 0 send to node
// 2 and four of node 1 to node 4 (both spine 0: eight flows share leaf 0's one up-link) or to node 5 (spine 1: four
// flows on each).
TEST(Platform, TheDestinationNodePicksTheSpine) {
  const double nic = dgx_a100().nic_effective_bytes_per_s;
  PlatformOptions options;
  options.nodes = 8;
  const FatTreeShape shape = fat_tree_shape(options);
  ASSERT_EQ(shape.nodes_per_leaf, 2);
  ASSERT_EQ(shape.spines, 2);
  const double up_link = shape.link_bytes_per_s / 4;
  const auto flows_to = [](int second_destination_node) {
    std::vector<std::pair<int, int>> flows;
    for (int g = 0; g < 4; ++g) flows.push_back({g, 2 * 8 + g});
    for (int g = 0; g < 4; ++g) flows.push_back({8 + g, second_destination_node * 8 + g});
    return flows;
  };
  for (double t : flow_times(flows_to(4), nic, 8, 4.0)) EXPECT_NEAR(t, nic / (up_link / 8), 1e-6);
  for (double t : flow_times(flows_to(5), nic, 8, 4.0)) EXPECT_NEAR(t, nic / (up_link / 4), 1e-6);
}

TEST(Platform, NvlinkInsideANode) {
  const double nvlink = dgx_a100().nvlink_effective_bytes_per_s;
  const auto t = flow_times({{0, 1}, {2, 3}}, nvlink);
  EXPECT_NEAR(t[0], 1.0, 1e-6);  // different GPUs' ports: no sharing through the NVSwitch
  EXPECT_NEAR(t[1], 1.0, 1e-6);
}

}  // namespace
}  // namespace twin::topology
