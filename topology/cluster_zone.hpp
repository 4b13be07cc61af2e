// The whole cluster as one SimGrid zone: every GPU (or TP group endpoint) is a host of it, and a route is computed
// from where its two ends sit (node, GPU or group slot, leaf), in constant time, with no routing table.
//
// Routes (the layout topology/platform.hpp draws):
//   same node, GPU i to GPU j          NVLink port i up, port j down (the NVSwitches are a non-blocking crossbar)
//   same node, group slot a to b       the bundles of a's NVLinks up and b's down
//   across nodes                       the source's NIC (or its slot's NICs) up; its node's cable up to its leaf; to a
//                                      node of another leaf, the leaf's cable up to spine (destination node mod
//                                      spines: D-mod-k) and down to the destination's leaf; the destination's node
//                                      cable down; its NIC (or NICs) down
//   a host to itself                   SimGrid's loopback link
// These are the routes the earlier build gave (a full zone per node under SimGrid's FatTreeZone, whose
// get_local_route at v3.32 picks the spine the same way), link for link and in the same order. That build took time
// that grew with the square of the nodes: SimGrid 3.32 looks up each new host's and link's name by walking every zone
// (NetZoneImpl::get_host_by_name_or_null, StandardLinkImpl's constructor), seals a zone by filtering every host of
// the engine (NetZoneImpl::get_all_hosts), and its FatTreeZone tests every node against every leaf switch
// (connect_node_to_parents) — 24 s of 85 for Llama 3 405B on 12,288 DGX H100 nodes. Here the tree has two zones.
#pragma once

#include <string>
#include <vector>

#include <simgrid/kernel/routing/NetZoneImpl.hpp>
#include <simgrid/s4u/Host.hpp>
#include <simgrid/s4u/Link.hpp>

namespace twin::topology {

struct FatTreeShape;
struct NodeSpec;

class ClusterFabricZone final : public simgrid::kernel::routing::NetZoneImpl {
 public:
  // One direction of a cable or port: the link, and what a route takes from it, read once (s4u::Link::get_impl is a
  // dynamic_cast; a what-if changes bandwidths only).
  struct Hop {
    simgrid::s4u::Link* link = nullptr;
    simgrid::kernel::resource::StandardLinkImpl* impl = nullptr;
    double latency_s = 0;
  };
  // A cable or port: `up` carries traffic away from a GPU (towards the spines), `down` towards it.
  struct Cable {
    Hop up, down;
  };

  // Makes the zone under `parent` with the fabric's cables for `nodes` nodes (one per node at link_bytes_per_s,
  // leaves x spines at up_link_bytes_per_s, `hop_latency_s` each). Nodes are then added in order with add_node.
  static ClusterFabricZone* create(const std::string& name, simgrid::s4u::NetZone* parent, const FatTreeShape& shape,
                                   int nodes, double hop_latency_s);

  // Adds the next node: with `gpu_hosts`, a host per GPU with its NVLink port and NIC; with `group_size` > 0, a host
  // per TP group slot with the bundles of its GPUs' NVLinks (several slots) and NICs. Returns the node's hosts, GPUs
  // first, then slots.
  std::vector<simgrid::s4u::Host*> add_node(const std::string& name, const NodeSpec& spec, bool gpu_hosts,
                                            int group_size);

  const Cable& leaf_cable(int leaf, int spine) const;
  // A node's ports (for what-ifs that slow one): GPU `gpu`'s NIC or NVLink port, group slot `slot`'s bundled NICs.
  // Throws std::invalid_argument, naming `what`, for a port the platform does not have.
  enum class Port : unsigned char { GpuNic, GpuNvlink, SlotNics };
  const Cable& port(int node, Port kind, int index, const std::string& what) const;

 protected:
  void get_local_route(const simgrid::kernel::routing::NetPoint* src, const simgrid::kernel::routing::NetPoint* dst,
                       simgrid::kernel::routing::Route* into, double* latency) override;

 private:
  // Where a host sits: its node, and its GPU (slot -1) or its group slot (gpu -1).
  struct Seat {
    int node = 0;
    int gpu = -1;
    int slot = -1;
  };
  struct NodePorts {
    std::vector<Cable> gpu_nvlinks, gpu_nics, slot_nvlinks, slot_nics;
  };

  ClusterFabricZone(const std::string& name, int nodes_per_leaf, int leaves, int spines);
  Cable make_cable(const std::string& name, double bytes_per_s, double latency_s);
  Cable make_port(const std::string& name, double bytes_per_s);
  static Hop hop_of(simgrid::s4u::Link* link);
  simgrid::s4u::Host* make_host(const std::string& name, double flops, Seat seat);
  const Seat& seat_of(const simgrid::kernel::routing::NetPoint* point) const;
  const Cable& port_of(const Seat& seat) const;

  int nodes_per_leaf_;
  int leaves_;
  int spines_;                      // 0: one switch, no spines
  std::vector<Cable> node_cables_;  // by node
  std::vector<Cable> leaf_cables_;  // leaf * spines + spine
  std::vector<NodePorts> ports_;    // by node, as added
  std::vector<Seat> seats_;         // by host netpoint id (the order hosts joined this zone)
};

}  // namespace twin::topology
