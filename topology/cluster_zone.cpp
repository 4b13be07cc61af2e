#include "topology/cluster_zone.hpp"

#include <stdexcept>

#include <fmt/format.h>
#include <simgrid/kernel/routing/NetPoint.hpp>
#include <simgrid/s4u/Engine.hpp>

#include "topology/platform.hpp"

namespace twin::topology {

using simgrid::kernel::routing::NetPoint;
using simgrid::kernel::routing::Route;
namespace sg4 = simgrid::s4u;

ClusterFabricZone::ClusterFabricZone(const std::string& name, int nodes_per_leaf, int leaves, int spines)
    : NetZoneImpl(name), nodes_per_leaf_(nodes_per_leaf), leaves_(leaves), spines_(spines) {}

ClusterFabricZone* ClusterFabricZone::create(const std::string& name, sg4::NetZone* parent, const FatTreeShape& shape,
                                             int nodes, double hop_latency_s) {
  const int spines = shape.levels == 2 ? shape.spines : 0;
  auto* zone = new ClusterFabricZone(name, shape.nodes_per_leaf, shape.leaves, spines);  // the engine owns it
  zone->set_parent(parent->get_impl());
  zone->node_cables_.reserve(static_cast<std::size_t>(nodes));
  for (int node = 0; node < nodes; ++node) {
    zone->node_cables_.push_back(
        zone->make_cable(fmt::format("node{}-leaf", node), shape.link_bytes_per_s, hop_latency_s));
  }
  for (int leaf = 0; leaf < shape.leaves && spines > 0; ++leaf) {
    for (int spine = 0; spine < spines; ++spine) {
      zone->leaf_cables_.push_back(
          zone->make_cable(fmt::format("leaf{}-spine{}", leaf, spine), shape.up_link_bytes_per_s, hop_latency_s));
    }
  }
  return zone;
}

ClusterFabricZone::Hop ClusterFabricZone::hop_of(sg4::Link* link) {
  return {link, link->get_impl(), link->get_latency()};
}

ClusterFabricZone::Cable ClusterFabricZone::make_cable(const std::string& name, double bytes_per_s, double latency_s) {
  sg4::Link* up = create_link(name + "_UP", {bytes_per_s});
  sg4::Link* down = create_link(name + "_DOWN", {bytes_per_s});
  up->set_latency(latency_s)->seal();
  down->set_latency(latency_s)->seal();
  return {hop_of(up), hop_of(down)};
}

// A port inside a node: a split-duplex link (its two halves named name_UP and name_DOWN, as Platform looks them up).
ClusterFabricZone::Cable ClusterFabricZone::make_port(const std::string& name, double bytes_per_s) {
  sg4::SplitDuplexLink* link = create_split_duplex_link(name, {bytes_per_s});
  link->seal();
  return {hop_of(link->get_link_up()), hop_of(link->get_link_down())};
}

sg4::Host* ClusterFabricZone::make_host(const std::string& name, double flops, Seat seat) {
  sg4::Host* host = create_host(name, {flops});
  if (host->get_netpoint()->id() != seats_.size()) {
    throw std::logic_error(fmt::format("platform: host {} joined the cluster as component {}, expected {}", name,
                                       host->get_netpoint()->id(), seats_.size()));
  }
  seats_.push_back(seat);
  host->seal();
  return host;
}

std::vector<sg4::Host*> ClusterFabricZone::add_node(const std::string& name, const NodeSpec& spec, bool gpu_hosts,
                                                    int group_size) {
  const int node = static_cast<int>(ports_.size());
  if (node >= static_cast<int>(node_cables_.size())) {
    throw std::logic_error(
        fmt::format("platform: node {} is past the {} the fabric was made for", node, node_cables_.size()));
  }
  NodePorts& ports = ports_.emplace_back();
  std::vector<sg4::Host*> hosts;
  for (int i = 0; gpu_hosts && i < spec.gpus; ++i) {
    const std::string gpu = name + "-gpu" + std::to_string(i);
    ports.gpu_nvlinks.push_back(make_port(gpu + "-nvlink", spec.nvlink_effective_bytes_per_s));
    ports.gpu_nics.push_back(make_port(gpu + "-nic", spec.nic_effective_bytes_per_s));
    hosts.push_back(make_host(gpu, spec.gpu.bf16_flops, Seat{node, i, -1}));
  }
  const int slots = group_size > 0 ? spec.gpus / group_size : 0;
  for (int slot = 0; slot < slots; ++slot) {
    const std::string group = name + "-tpgroup" + std::to_string(slot);
    if (slots > 1)
      ports.slot_nvlinks.push_back(make_port(group + "-nvlinks", spec.nvlink_effective_bytes_per_s * group_size));
    ports.slot_nics.push_back(make_port(group + "-nics", spec.nic_effective_bytes_per_s * group_size));
    hosts.push_back(make_host(group, spec.gpu.bf16_flops * group_size, Seat{node, -1, slot}));
  }
  return hosts;
}

const ClusterFabricZone::Cable& ClusterFabricZone::leaf_cable(int leaf, int spine) const {
  if (spines_ == 0 || leaf < 0 || leaf >= leaves_ || spine < 0 || spine >= spines_) {
    throw std::invalid_argument(
        fmt::format("platform: no up-link from leaf {} to spine {} (the fat-tree has {} "
                    "leaves and {} spines)",
                    leaf, spine, spines_ > 0 ? leaves_ : 1, spines_));
  }
  return leaf_cables_[static_cast<std::size_t>(leaf) * spines_ + spine];
}

const ClusterFabricZone::Cable& ClusterFabricZone::port(int node, Port kind, int index, const std::string& what) const {
  if (node < 0 || node >= static_cast<int>(ports_.size())) throw std::invalid_argument("platform: no " + what);
  const NodePorts& ports = ports_[static_cast<std::size_t>(node)];
  const std::vector<Cable>& cables = kind == Port::GpuNic      ? ports.gpu_nics
                                     : kind == Port::GpuNvlink ? ports.gpu_nvlinks
                                                               : ports.slot_nics;
  if (index < 0 || index >= static_cast<int>(cables.size())) throw std::invalid_argument("platform: no " + what);
  return cables[static_cast<std::size_t>(index)];
}

const ClusterFabricZone::Seat& ClusterFabricZone::seat_of(const NetPoint* point) const {
  if (point->is_router() || point->id() >= seats_.size()) {
    throw std::logic_error(fmt::format("platform: {} is not a host of the cluster", point->get_name()));
  }
  return seats_[point->id()];
}

// The NIC (or a slot's bundled NICs) by which a host's traffic leaves its node.
const ClusterFabricZone::Cable& ClusterFabricZone::port_of(const Seat& seat) const {
  const NodePorts& ports = ports_[static_cast<std::size_t>(seat.node)];
  return seat.gpu >= 0 ? ports.gpu_nics[seat.gpu] : ports.slot_nics[seat.slot];
}

void ClusterFabricZone::get_local_route(const NetPoint* src, const NetPoint* dst, Route* into, double* latency) {
  const auto cross = [&](const Hop& hop) {
    into->link_list_.push_back(hop.impl);
    if (latency != nullptr) *latency += hop.latency_s;
  };
  if (src == dst) {
    cross(hop_of(sg4::Engine::get_instance()->link_by_name("__loopback__")));
    return;
  }
  const Seat& from = seat_of(src);
  const Seat& to = seat_of(dst);
  if (from.node == to.node) {
    const NodePorts& ports = ports_[static_cast<std::size_t>(from.node)];
    if (from.gpu >= 0 && to.gpu >= 0) {
      cross(ports.gpu_nvlinks[from.gpu].up);
      cross(ports.gpu_nvlinks[to.gpu].down);
    } else if (from.slot >= 0 && to.slot >= 0) {
      cross(ports.slot_nvlinks[from.slot].up);
      cross(ports.slot_nvlinks[to.slot].down);
    } else {
      throw std::logic_error(fmt::format("platform: no route between a GPU and a group endpoint ({} to {})",
                                         src->get_name(), dst->get_name()));
    }
    return;
  }
  cross(port_of(from).up);
  cross(node_cables_[from.node].up);
  const int from_leaf = from.node / nodes_per_leaf_;
  const int to_leaf = to.node / nodes_per_leaf_;
  if (from_leaf != to_leaf) {
    const int spine = to.node % spines_;  // D-mod-k: the destination picks the spine
    cross(leaf_cables_[static_cast<std::size_t>(from_leaf) * spines_ + spine].up);
    cross(leaf_cables_[static_cast<std::size_t>(to_leaf) * spines_ + spine].down);
  }
  cross(node_cables_[to.node].down);
  cross(port_of(to).down);
}

}  // namespace twin::topology
