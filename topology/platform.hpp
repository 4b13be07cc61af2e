// The SimGrid platform of a GPU cluster, built in code that reads like the hardware:
//
//   fat-tree                             InfiniBand leaves and spines (D-mod-k routing), a cable per node to its leaf
//     └── node n                         (one SimGrid zone holds every node's hosts: topology/cluster_zone.hpp)
//           gpu0 .. gpu7                 one host per GPU
//           nvlink_i (split-duplex)      GPU i's NVLink ports into the NVSwitches: intra-node traffic only
//           nic_i (split-duplex)         GPU i's own HCA: its inter-node traffic leaves here, so one GPU alone never
//                                        gets more than one NIC's bandwidth; the node's NICs meet its fabric cable
//
// Links between a node and its leaf switch, and between switches, aggregate the node's eight cables (8 x 200 Gb/s
// for HDR): in the DGX SuperPOD every NIC has its own cable, and Megatron's traffic is rail-aligned (rank tp=i talks
// to tp=i), so the eight rails move side by side. Oversubscription divides the spine links; the rail-optimized
// layout groups a scalable unit (20 nodes) under one leaf, otherwise a leaf switch serves half its ports' worth of
// nodes. Cross-rail traffic inside a rail-optimized scalable unit is therefore modelled as crossing one switch (as if
// NCCL's PXN moved it to the right rail over NVLink first).
//
// Flow model: SimGrid's CM02 max-min fair sharing with no TCP cross-traffic, no TCP window bound and no latency
// weighting of the shares (InfiniBand and NVLink share a link fairly per flow, credit-based, unlike TCP's RTT
// bias). Link latencies are recorded on the links but paid by the replay engine (`route_latency_s`), so that SimGrid
// only shares bandwidth. Link bandwidths are the "effective" rates of hardware.hpp (NCCL's own model of each link).
//
// group fidelity uses instead, per node, one endpoint host per TP group slot whose NVLink and NIC links bundle the
// group's links (t NVLinks, t NICs): a TP group's ranks move their bytes in lockstep, so one flow of t times the bytes
// over the bundle stands for the t rail-parallel flows.
#pragma once

#include <functional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <simgrid/forward.h>

#include "topology/hardware.hpp"

namespace twin::topology {

class ClusterFabricZone;

struct PlatformOptions {
  int nodes = 1;
  NodeSpec node = dgx_a100();
  FabricSpec fabric = infiniband_hdr_fat_tree();
  int group_size = 0;     // > 0: add gpus_per_node / group_size bundled endpoints per node (group fidelity)
  bool gpu_hosts = true;  // false: only the group endpoints (group fidelity needs no per-GPU hosts)
  // Called after each node is built (1 .. nodes): a platform of 100,000 nodes takes seconds (estimated_build_seconds),
  // and a caller shows progress.
  std::function<void(int nodes_built)> on_node;
};

// The fat-tree SimGrid builds: `levels` 1 (one switch) or 2 (leaves and spines).
struct FatTreeShape {
  int levels = 1;
  int nodes_per_leaf = 1;
  int leaves = 1;                  // leaf switches
  int spines = 0;                  // spine switches (2 levels)
  int positions = 1;               // nodes_per_leaf * leaves (>= nodes; the leaves' free ports)
  double link_bytes_per_s = 0;     // a node's link to its leaf (its NICs' cables together)
  double up_link_bytes_per_s = 0;  // a leaf's link to each spine: link_bytes_per_s / oversubscription
};
FatTreeShape fat_tree_shape(const PlatformOptions& options);

// About how long (seconds, on a 2-core machine) and how much memory (bytes) SimGrid takes to build a platform of
// `nodes` nodes with `hosts_per_node` hosts each (8 at rank fidelity on a DGX, gpus / TP at group and replica
// fidelity): both grow with the hosts (cluster_zone.hpp says why no longer with their square). Measured with
// bench/sim/platform_build.sh on 7 December 2026, GPT-3 175B's plan on 100,000 DGX A100 nodes: 1.3 s and 746 MB
// with one host a node (group fidelity), 16.3 s and 3.84 GB with eight (rank fidelity), the process's whole
// resident memory (224 and 396 MB at 1,000 nodes). Each estimate is an upper bound of those: 21 us and 4.2 KB a host,
// plus 1.3 KB a node.
double estimated_build_seconds(long long nodes, long long hosts_per_node);
double estimated_platform_bytes(long long nodes, long long hosts_per_node);
// Hosts a node gets (PlatformOptions: its GPUs at rank fidelity, its TP group slots at group fidelity).
int hosts_per_node(const PlatformOptions& options);

// Configures SimGrid's flow model (see above). Call once, on a fresh engine, before building a Platform.
void configure_flow_model();

// SimGrid command-line options that a sanitizer build adds to every engine's (empty in any other build). Under
// AddressSanitizer actors run on threads: SimGrid's default raw contexts switch stacks by hand and end each actor by
// throwing ForcefulKillException on its stack, which ASan cannot follow ("ASan is ignoring requested
// __asan_handle_no_return ... False positive error reports may follow").
std::vector<std::string> sanitizer_engine_options();

class Platform {
 public:
  // Builds the platform into the current s4u::Engine (there is one per process). Throws std::invalid_argument on
  // impossible options (no nodes, group size not dividing the node).
  explicit Platform(const PlatformOptions& options);

  const PlatformOptions& options() const { return options_; }
  const FatTreeShape& shape() const { return shape_; }
  int nodes() const { return options_.nodes; }
  int gpus_per_node() const { return options_.node.gpus; }
  int gpus() const { return options_.nodes * options_.node.gpus; }

  // Requires gpu_hosts.
  simgrid::s4u::Host* gpu(int gpu_index) const { return gpus_.at(static_cast<std::size_t>(gpu_index)); }
  // Bundled endpoint of TP group slot `slot` (0 .. gpus_per_node/group_size - 1) of `node`; requires group_size > 0.
  simgrid::s4u::Host* group_endpoint(int node, int slot) const;
  int node_of_gpu(int gpu_index) const { return gpu_index / gpus_per_node(); }

  // Sum of the latencies of the links from `from` to `to` (hardware latency; SimGrid itself does not pay it).
  double route_latency_s(const simgrid::s4u::Host* from, const simgrid::s4u::Host* to) const;
  // The SimGrid links a flow from `from` to `to` crosses, in order.
  std::vector<simgrid::s4u::Link*> route(const simgrid::s4u::Host* from, const simgrid::s4u::Host* to) const;

  // The parts a what-if degrades (sim/degraded.hpp), both directions of each: GPU `gpu_index`'s NIC and NVLink port
  // (requires gpu_hosts); the bundled NICs of a group endpoint (group fidelity); leaf switch `leaf`'s up-link to spine
  // `spine` (a two-level fat-tree; leaf L holds nodes L x nodes_per_leaf and the next ones, as SimGrid's fat-tree
  // numbers them). Throw std::invalid_argument naming the part when the platform has none such.
  std::vector<simgrid::s4u::Link*> gpu_nic_links(int gpu_index) const;
  std::vector<simgrid::s4u::Link*> gpu_nvlink_links(int gpu_index) const;
  std::vector<simgrid::s4u::Link*> group_nic_links(int node, int slot) const;
  std::vector<simgrid::s4u::Link*> up_links(int leaf, int spine) const;

 private:
  void build();

  PlatformOptions options_;
  FatTreeShape shape_;
  ClusterFabricZone* fabric_ = nullptr;  // every host and link (build())
  std::vector<simgrid::s4u::Host*> gpus_;
  std::vector<simgrid::s4u::Host*> endpoints_;  // node * slots + slot
  struct PairHash {
    std::size_t operator()(const std::pair<const void*, const void*>& key) const noexcept;
  };
  mutable std::unordered_map<std::pair<const void*, const void*>, double, PairHash> latency_cache_;
};

}  // namespace twin::topology
