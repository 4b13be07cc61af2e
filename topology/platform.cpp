#include "topology/platform.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <iterator>
#include <stdexcept>
#include <string>

#include <fmt/format.h>
#include <simgrid/s4u.hpp>

#include "topology/cluster_zone.hpp"

// GCC says __SANITIZE_ADDRESS__, Clang __has_feature(address_sanitizer).
#if defined(__SANITIZE_ADDRESS__)
#define TWIN_ADDRESS_SANITIZER
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TWIN_ADDRESS_SANITIZER
#endif
#endif

namespace twin::topology {

namespace sg4 = simgrid::s4u;
namespace {

std::string node_name(int node) {
  return "node" + std::to_string(node);
}

}  // namespace

FatTreeShape fat_tree_shape(const PlatformOptions& options) {
  const FabricSpec& fabric = options.fabric;
  FatTreeShape shape;
  shape.link_bytes_per_s = options.node.compute_nics * fabric.link_bytes_per_s;
  // A rail-optimized leaf (really one switch per rail) serves a scalable unit; otherwise a leaf switch gives half its
  // ports to nodes (the other half goes up) and each node takes compute_nics of them.
  int per_leaf = std::max(1, fabric.switch_radix / 2 / options.node.compute_nics);
  if (fabric.nodes_per_leaf > 0) per_leaf = fabric.nodes_per_leaf;  // the fabric's own racks (RoCE)
  if (fabric.rail_optimized) per_leaf = fabric.scalable_unit_nodes;
  if (options.nodes <= per_leaf) {
    shape.levels = 1;
    shape.nodes_per_leaf = options.nodes;
    shape.leaves = 1;
    shape.spines = 0;
    shape.positions = options.nodes;
    return shape;
  }
  shape.levels = 2;
  shape.nodes_per_leaf = per_leaf;
  shape.leaves = (options.nodes + per_leaf - 1) / per_leaf;
  // As many (aggregated) links up as down; an oversubscription r gives each up-link 1/r of a down-link's rate
  // (fewer links would only give ratios a leaf's node count divides: 1 or 2 with 2 nodes per leaf).
  shape.spines = per_leaf;
  shape.up_link_bytes_per_s = shape.link_bytes_per_s / std::max(1.0, fabric.oversubscription);
  shape.positions = per_leaf * shape.leaves;
  return shape;
}

void configure_flow_model() {
  sg4::Engine::set_config("network/model:CM02");          // max-min fair sharing (Casanova & Marchal 2002)
  sg4::Engine::set_config("network/crosstraffic:0");      // no TCP acknowledgement traffic on the reverse path
  sg4::Engine::set_config("network/TCP-gamma:0");         // no TCP window bound on a flow's rate
  sg4::Engine::set_config("network/weight-S:0");          // no RTT-dependent share
  sg4::Engine::set_config("network/latency-factor:0");    // latencies are paid by the engine (shares stay equal)
  sg4::Engine::set_config("network/bandwidth-factor:1");  // link rates are already the effective ones
}

std::vector<std::string> sanitizer_engine_options() {
#if defined(TWIN_ADDRESS_SANITIZER)
  return {"--cfg=contexts/factory:thread"};
#else
  return {};
#endif
}

Platform::Platform(const PlatformOptions& options) : options_(options), shape_(fat_tree_shape(options)) {
  if (options.nodes < 1) throw std::invalid_argument("platform: at least one node");
  if (options.group_size < 0 || (options.group_size > 0 && options.node.gpus % options.group_size != 0)) {
    throw std::invalid_argument("platform: the TP group size must divide the GPUs per node for group fidelity");
  }
  if (!options.gpu_hosts && options.group_size == 0) throw std::invalid_argument("platform: no hosts at all");
  build();
}

double estimated_build_seconds(long long nodes, long long hosts_per_node) {
  constexpr double kSecondsPerHost = 21e-6;  // bench/sim/platform_build.sh, see platform.hpp
  return kSecondsPerHost * static_cast<double>(nodes) * static_cast<double>(hosts_per_node);
}

double estimated_platform_bytes(long long nodes, long long hosts_per_node) {
  constexpr double kBytesPerHost = 4.2e3;  // as above
  constexpr double kBytesPerNode = 1.3e3;
  return static_cast<double>(nodes) * (kBytesPerNode + kBytesPerHost * static_cast<double>(hosts_per_node));
}

int hosts_per_node(const PlatformOptions& options) {
  const int slots = options.group_size > 0 ? options.node.gpus / options.group_size : 0;
  return (options.gpu_hosts ? options.node.gpus : 0) + slots;
}

void Platform::build() {
  gpus_.reserve(static_cast<std::size_t>(gpus()));
  sg4::NetZone* root = sg4::Engine::get_instance()->get_netzone_root();
  if (root == nullptr) root = sg4::create_full_zone("cluster");  // the first zone made is the root
  fabric_ = ClusterFabricZone::create("fabric", root, shape_, options_.nodes, options_.fabric.hop_latency_s);
  const std::size_t gpus_per_node = options_.gpu_hosts ? static_cast<std::size_t>(options_.node.gpus) : 0;
  for (int node = 0; node < options_.nodes; ++node) {
    const std::vector<sg4::Host*> hosts =
        fabric_->add_node(node_name(node), options_.node, options_.gpu_hosts, options_.group_size);
    gpus_.insert(gpus_.end(), hosts.begin(), hosts.begin() + static_cast<std::ptrdiff_t>(gpus_per_node));
    endpoints_.insert(endpoints_.end(), hosts.begin() + static_cast<std::ptrdiff_t>(gpus_per_node), hosts.end());
    if (options_.on_node) options_.on_node(node + 1);
  }
  fabric_->seal();
  root->seal();
}

namespace {

std::vector<sg4::Link*> both_ways(const ClusterFabricZone::Cable& cable) {
  return {cable.up.link, cable.down.link};
}

}  // namespace

std::vector<sg4::Link*> Platform::gpu_nic_links(int gpu_index) const {
  if (!options_.gpu_hosts || gpu_index < 0 || gpu_index >= gpus()) {
    throw std::invalid_argument(fmt::format("platform: no NIC of GPU {}", gpu_index));
  }
  return both_ways(fabric_->port(node_of_gpu(gpu_index), ClusterFabricZone::Port::GpuNic,
                                 gpu_index % gpus_per_node(), fmt::format("NIC of GPU {}", gpu_index)));
}

std::vector<sg4::Link*> Platform::gpu_nvlink_links(int gpu_index) const {
  if (!options_.gpu_hosts || gpu_index < 0 || gpu_index >= gpus()) {
    throw std::invalid_argument(fmt::format("platform: no NVLink of GPU {}", gpu_index));
  }
  return both_ways(fabric_->port(node_of_gpu(gpu_index), ClusterFabricZone::Port::GpuNvlink,
                                 gpu_index % gpus_per_node(), fmt::format("NVLink of GPU {}", gpu_index)));
}

std::vector<sg4::Link*> Platform::group_nic_links(int node, int slot) const {
  return both_ways(fabric_->port(node, ClusterFabricZone::Port::SlotNics, slot,
                                 fmt::format("group endpoint {} of node {}", slot, node)));
}

std::vector<sg4::Link*> Platform::up_links(int leaf, int spine) const {
  return both_ways(fabric_->leaf_cable(leaf, spine));
}

sg4::Host* Platform::group_endpoint(int node, int slot) const {
  const int slots = options_.group_size > 0 ? options_.node.gpus / options_.group_size : 0;
  if (slots == 0 || slot < 0 || slot >= slots) throw std::out_of_range("platform: no such group endpoint");
  return endpoints_[static_cast<std::size_t>(node) * slots + slot];
}

std::size_t Platform::PairHash::operator()(const std::pair<const void*, const void*>& key) const noexcept {
  return std::hash<const void*>()(key.first) * 31 + std::hash<const void*>()(key.second);
}

double Platform::route_latency_s(const sg4::Host* from, const sg4::Host* to) const {
  const auto key = std::make_pair(static_cast<const void*>(from), static_cast<const void*>(to));
  if (auto it = latency_cache_.find(key); it != latency_cache_.end()) return it->second;
  std::vector<sg4::Link*> links;
  double latency = 0;
  from->route_to(to, links, &latency);
  latency_cache_.emplace(key, latency);
  return latency;
}

std::vector<sg4::Link*> Platform::route(const sg4::Host* from, const sg4::Host* to) const {
  std::vector<sg4::Link*> links;
  double latency = 0;
  from->route_to(to, links, &latency);
  return links;
}

}  // namespace twin::topology
