// Today's inter-node fabrics: InfiniBand XDR and RoCE (RDMA over Converged Ethernet) at 400 Gb/s, beside the HDR and
// NDR fat-trees of hardware.cpp, and the names a scenario gives them (cluster.fabric).
#include <stdexcept>
#include <string>

#include "topology/datasheet_units.hpp"
#include "topology/hardware.hpp"

namespace twin::topology {

// InfiniBand XDR: 4x links at 200 Gb/s per lane = 800 Gb/s per port (IBTA specification, XDR). Switch: NVIDIA
// Quantum-X800 Q3400 datasheet: 144 XDR ports. No port-to-port latency is published for it; Quantum's 130 ns is
// reused (a collective's megabyte messages do not see it). Scalable units as NDR's (DGX SuperPOD reference
// architecture: 32 nodes of 8 GPUs).
FabricSpec infiniband_xdr_fat_tree() {
  FabricSpec fabric = infiniband_ndr_fat_tree();
  fabric.name = "InfiniBand XDR fat-tree";
  fabric.link_bytes_per_s = 800 * kGiga / 8;
  fabric.switch_radix = 144;
  return fabric;
}

// RoCE v2 over 400 GbE (IEEE 802.3bs 400GBASE), as Meta built it for Llama 3 405B (Llama Team, "The Llama 3 Herd of
// Models", arXiv:2407.21783, Section 3.3.1, "Network"): 400 Gbps between GPUs, a three-layer Clos whose bottom layer
// is one top-of-rack switch (Minipack2, 64 ports of 400G) for the 16 GPUs of two servers, racks joined without
// oversubscription into pods of 3,072 GPUs. Modelled as two levels: two nodes per leaf, non-blocking above (the 1:7
// oversubscribed aggregation layer between pods is not). NCCL drives RoCE NICs with the same speed tables as
// InfiniBand ones. No switch latency is published for this fabric; Quantum's 130 ns is reused.
FabricSpec roce_400g_fabric() {
  FabricSpec fabric;
  fabric.name = "RoCE 400 GbE Clos";
  fabric.link_bytes_per_s = 400 * kGiga / 8;
  fabric.hop_latency_s = 130e-9;
  fabric.switch_radix = 64;
  fabric.scalable_unit_nodes = 32;
  fabric.nodes_per_leaf = 2;
  return fabric;
}

FabricSpec fabric_spec(model::Fabric fabric) {
  switch (fabric) {
    case model::Fabric::InfinibandHdr:
      return infiniband_hdr_fat_tree();
    case model::Fabric::InfinibandNdr:
      return infiniband_ndr_fat_tree();
    case model::Fabric::InfinibandXdr:
      return infiniband_xdr_fat_tree();
    case model::Fabric::Roce:
      return roce_400g_fabric();
    case model::Fabric::NodeDefault:
      break;
  }
  throw std::invalid_argument("fabric_spec: the node's own fabric has no spec of its own (fabric_spec(NodeKind))");
}

FabricSpec fabric_by_name(std::string_view name) {
  for (model::Fabric fabric : {model::Fabric::InfinibandHdr, model::Fabric::InfinibandNdr, model::Fabric::InfinibandXdr,
                               model::Fabric::Roce}) {
    if (model::to_string(fabric) == name) return fabric_spec(fabric);
  }
  throw std::invalid_argument("unknown fabric '" + std::string(name) +
                              "' (expected infiniband-hdr, infiniband-ndr, infiniband-xdr or roce)");
}

}  // namespace twin::topology
