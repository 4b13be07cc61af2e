#include "topology/platform.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>

#include <fmt/format.h>
#include <simgrid/s4u.hpp>

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
using simgrid::kernel::routing::NetPoint;

namespace {

using Direction = sg4::LinkInRoute::Direction;

sg4::LinkInRoute up(const sg4::Link* link) {
  return sg4::LinkInRoute(link, Direction::UP);
}
sg4::LinkInRoute down(const sg4::Link* link) {
  return sg4::LinkInRoute(link, Direction::DOWN);
}

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

// One DGX node: GPUs, their NVLink ports into the NVSwitch, their own NICs, and the router where the NIC cables
// leave the node (the zone's gateway into the fabric).
std::pair<NetPoint*, NetPoint*> Platform::dgx_node(sg4::NetZone* fabric, int node) {
  const NodeSpec& spec = options_.node;
  const std::string name = node_name(node);
  sg4::NetZone* zone = sg4::create_full_zone(name);
  zone->set_parent(fabric);
  NetPoint* hca = zone->create_router(name + "-hca");

  std::vector<sg4::Host*> gpus;
  std::vector<const sg4::Link*> nvlinks;
  for (int i = 0; options_.gpu_hosts && i < spec.gpus; ++i) {
    const std::string gpu = name + "-gpu" + std::to_string(i);
    gpus.push_back(zone->create_host(gpu, spec.gpu.bf16_flops)->seal());
    nvlinks.push_back(links_->create_split_duplex_link(gpu + "-nvlink", spec.nvlink_effective_bytes_per_s)->seal());
    const sg4::Link* nic = links_->create_split_duplex_link(gpu + "-nic", spec.nic_effective_bytes_per_s)->seal();
    zone->add_route(gpus[i]->get_netpoint(), hca, nullptr, nullptr, {up(nic)}, true);
  }
  // The NVSwitches form a non-blocking crossbar: GPU i reaches GPU j through its own port out and j's port in.
  for (int i = 0; i < static_cast<int>(gpus.size()); ++i) {
    for (int j = i + 1; j < static_cast<int>(gpus.size()); ++j) {
      zone->add_route(gpus[i]->get_netpoint(), gpus[j]->get_netpoint(), nullptr, nullptr,
                      {up(nvlinks[i]), down(nvlinks[j])}, true);
    }
  }
  gpus_.insert(gpus_.end(), gpus.begin(), gpus.end());

  // group fidelity: one endpoint per TP group slot, its links bundling the group's NVLinks and NICs.
  if (options_.group_size > 0) {
    const int slots = spec.gpus / options_.group_size;
    std::vector<sg4::Host*> endpoints;
    std::vector<const sg4::Link*> bundles;
    for (int slot = 0; slot < slots; ++slot) {
      const std::string group = name + "-tpgroup" + std::to_string(slot);
      endpoints.push_back(zone->create_host(group, spec.gpu.bf16_flops * options_.group_size)->seal());
      if (slots > 1) {
        bundles.push_back(
            links_
                ->create_split_duplex_link(group + "-nvlinks", spec.nvlink_effective_bytes_per_s * options_.group_size)
                ->seal());
      }
      const sg4::Link* nics =
          links_->create_split_duplex_link(group + "-nics", spec.nic_effective_bytes_per_s * options_.group_size)
              ->seal();
      zone->add_route(endpoints[slot]->get_netpoint(), hca, nullptr, nullptr, {up(nics)}, true);
    }
    for (int a = 0; a < slots; ++a) {
      for (int b = a + 1; b < slots; ++b) {
        zone->add_route(endpoints[a]->get_netpoint(), endpoints[b]->get_netpoint(), nullptr, nullptr,
                        {up(bundles[a]), down(bundles[b])}, true);
      }
    }
    endpoints_.insert(endpoints_.end(), endpoints.begin(), endpoints.end());
  }
  zone->seal();
  return {zone->get_netpoint(), hca};
}

double estimated_build_seconds(int nodes) {
  constexpr double kSecondsAt10000Nodes = 39.1;  // bench/sim/platform_build.sh, see platform.hpp
  const double scale = static_cast<double>(nodes) / 10000.0;
  return kSecondsAt10000Nodes * scale * scale;
}

void Platform::build() {
  gpus_.reserve(static_cast<std::size_t>(gpus()));
  // SimGrid 3.32 checks every new link's name against every zone (s4u::Engine::link_by_name_or_null walks the whole
  // tree from the root): with the nodes' links in their nodes' zones each check looks into every node built so far.
  // They live in one zone of their own instead, beside the fabric under a root of both, so that a check finds the
  // nodes' zones empty (a route may cross any zone's links).
  sg4::NetZone* root = sg4::Engine::get_instance()->get_netzone_root();
  if (root == nullptr) root = sg4::create_full_zone("cluster");  // the first zone made is the root
  links_ = sg4::create_empty_zone("node-links");
  links_->set_parent(root);
  // The fat-tree: leaves are nodes (positions past the last node are empty routers).
  std::vector<unsigned int> down_links;
  std::vector<unsigned int> up_links;
  std::vector<unsigned int> link_counts;
  if (shape_.levels == 1) {
    down_links = {static_cast<unsigned>(shape_.positions)};
    up_links = {1};
    link_counts = {1};
  } else {
    down_links = {static_cast<unsigned>(shape_.nodes_per_leaf), static_cast<unsigned>(shape_.leaves)};
    up_links = {1, static_cast<unsigned>(shape_.spines)};
    link_counts = {1, 1};
  }
  const auto leaf = [this](sg4::NetZone* fabric, const std::vector<unsigned long>& /*coord*/,
                           unsigned long id) -> std::pair<NetPoint*, NetPoint*> {
    const int node = static_cast<int>(id);
    if (node < options_.nodes) {
      const auto built = dgx_node(fabric, node);
      if (options_.on_node) options_.on_node(node + 1);
      return built;
    }
    return {fabric->create_router("empty-port" + std::to_string(node)), nullptr};
  };
  // Each fabric link carries one switch traversal's latency.
  sg4::NetZone* fabric = sg4::create_fatTree_zone(
      "fabric", root, sg4::FatTreeParams(static_cast<unsigned>(shape_.levels), down_links, up_links, link_counts),
      sg4::ClusterCallbacks(leaf), shape_.link_bytes_per_s, options_.fabric.hop_latency_s,
      sg4::Link::SharingPolicy::SPLITDUPLEX);
  fabric->seal();
  links_->seal();
  root->seal();
  if (shape_.levels == 2 && shape_.up_link_bytes_per_s != shape_.link_bytes_per_s) {
    // SimGrid's fat-tree gives every level one rate. Its links are named "link_from_<child>_<parent>_<n>_UP/DOWN",
    // nodes numbered 0..positions-1 and switches after them (kernel/routing/FatTreeZone.cpp, SimGrid 3.32): a link
    // from a switch is a leaf's up-link. The count below checks that reading.
    int oversubscribed = 0;
    const std::string prefix = "link_from_";
    for (sg4::Link* link : sg4::Engine::get_instance()->get_all_links()) {
      const std::string& name = link->get_name();
      if (name.rfind(prefix, 0) != 0) continue;
      if (std::stol(name.substr(prefix.size())) >= shape_.positions) {
        link->set_bandwidth(shape_.up_link_bytes_per_s);
        ++oversubscribed;
      }
    }
    if (oversubscribed != 2 * shape_.leaves * shape_.spines) {  // split-duplex: one per direction
      throw std::logic_error(fmt::format("platform: found {} leaf up-links to oversubscribe, expected {}",
                                         oversubscribed, 2 * shape_.leaves * shape_.spines));
    }
  }
}

namespace {

// Both directions of split-duplex link `name` (SimGrid names them name_UP and name_DOWN).
std::vector<sg4::Link*> split_duplex(const std::string& name, const std::string& what) {
  sg4::Link* up_link = sg4::Link::by_name_or_null(name + "_UP");
  sg4::Link* down_link = sg4::Link::by_name_or_null(name + "_DOWN");
  if (up_link == nullptr || down_link == nullptr) throw std::invalid_argument("platform: no " + what);
  return {up_link, down_link};
}

}  // namespace

std::vector<sg4::Link*> Platform::gpu_nic_links(int gpu_index) const {
  if (!options_.gpu_hosts || gpu_index < 0 || gpu_index >= gpus()) {
    throw std::invalid_argument(fmt::format("platform: no NIC of GPU {}", gpu_index));
  }
  return split_duplex(fmt::format("{}-gpu{}-nic", node_name(node_of_gpu(gpu_index)), gpu_index % gpus_per_node()),
                      fmt::format("NIC of GPU {}", gpu_index));
}

std::vector<sg4::Link*> Platform::gpu_nvlink_links(int gpu_index) const {
  if (!options_.gpu_hosts || gpu_index < 0 || gpu_index >= gpus()) {
    throw std::invalid_argument(fmt::format("platform: no NVLink of GPU {}", gpu_index));
  }
  return split_duplex(fmt::format("{}-gpu{}-nvlink", node_name(node_of_gpu(gpu_index)), gpu_index % gpus_per_node()),
                      fmt::format("NVLink of GPU {}", gpu_index));
}

std::vector<sg4::Link*> Platform::group_nic_links(int node, int slot) const {
  return split_duplex(fmt::format("{}-tpgroup{}-nics", node_name(node), slot),
                      fmt::format("group endpoint {} of node {}", slot, node));
}

std::vector<sg4::Link*> Platform::up_links(int leaf, int spine) const {
  if (shape_.levels != 2 || leaf < 0 || leaf >= shape_.leaves || spine < 0 || spine >= shape_.spines) {
    throw std::invalid_argument(fmt::format("platform: no up-link from leaf {} to spine {} (the fat-tree has {} leaves "
                                            "and {} spines)",
                                            leaf, spine, shape_.levels == 2 ? shape_.leaves : 1, shape_.spines));
  }
  // "link_from_<child>_<parent>_<n>_UP/DOWN" (as in build()): switches are numbered after the positions, leaves
  // first; the L-th smallest child id among switches is leaf L, its S-th smallest parent spine S.
  std::map<long, std::map<long, std::vector<sg4::Link*>>> by_leaf;
  const std::string prefix = "link_from_";
  for (sg4::Link* link : sg4::Engine::get_instance()->get_all_links()) {
    const std::string& name = link->get_name();
    if (name.rfind(prefix, 0) != 0) continue;
    std::size_t end = 0;
    const long child = std::stol(name.substr(prefix.size()), &end);
    const long parent = std::stol(name.substr(prefix.size() + end + 1));
    if (child >= shape_.positions) by_leaf[child][parent].push_back(link);
  }
  if (static_cast<int>(by_leaf.size()) != shape_.leaves) {
    throw std::logic_error(fmt::format("platform: found {} leaf switches, expected {}", by_leaf.size(), shape_.leaves));
  }
  const auto& parents = std::next(by_leaf.begin(), leaf)->second;
  if (static_cast<int>(parents.size()) != shape_.spines) {
    throw std::logic_error(fmt::format("platform: leaf {} has {} up-links, expected {}", leaf, parents.size(),
                                       shape_.spines));
  }
  return std::next(parents.begin(), spine)->second;
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
