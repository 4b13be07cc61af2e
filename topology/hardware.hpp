// Hardware as data: GPUs, DGX nodes and InfiniBand fabrics, each number with its source.
//
// Two kinds of numbers live here:
//   - datasheet numbers (peak FLOP/s, HBM, link rates): what the vendor specifies;
//   - "effective" link rates: what NCCL itself assumes a link delivers to a collective (its tuning model), used as
//     the bandwidth of the simulated links. They are cited from NCCL's source, never fitted to a training run.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "model/scenario/scenario.hpp"

namespace twin::topology {

struct GpuSpec {
  std::string name;
  // Dense (no sparsity) tensor-core peaks, FLOP/s.
  double bf16_flops = 0;
  double fp16_flops = 0;
  double tf32_flops = 0;
  double fp32_flops = 0;  // CUDA cores (no tensor cores)
  double fp8_flops = 0;   // FP8 (e4m3 / e5m2) tensor cores; 0: the GPU has none (A100)
  double hbm_bytes_per_s = 0;
  double hbm_bytes = 0;
  int sm_count = 0;  // for wave quantization of GEMMs
  // CUDA compute capability x 10 (80 Ampere, 90 Hopper, 100 Blackwell): NCCL picks its speed tables by it.
  int compute_capability = 80;

  // The matrix-multiply peak a model of this dtype runs at (fp32 runs on CUDA cores, not TF32).
  double peak_flops(model::DType dtype) const;
};

struct NodeSpec {
  std::string name;
  GpuSpec gpu;
  int gpus = 8;
  // NVLink through the NVSwitches, per GPU and per direction.
  double nvlink_bytes_per_s = 0;            // datasheet
  double nvlink_effective_bytes_per_s = 0;  // NCCL's bus-bandwidth model of it
  // Compute NICs (one per GPU on DGX nodes), per NIC and per direction.
  int compute_nics = 8;
  double nic_bytes_per_s = 0;            // datasheet line rate
  double nic_effective_bytes_per_s = 0;  // NCCL's per-channel network speed for this NIC
  // Channels of an NCCL collective inside the node: its kernel runs one thread block per channel, each holding an
  // SM while the collective runs.
  int nccl_nvlink_channels = 0;
  // The node's host CPU: its time to issue one kernel from PyTorch's eager path (topology/host_launch.hpp, cited).
  double host_us_per_kernel = 0;
};

struct FabricSpec {
  std::string name;
  double link_bytes_per_s = 0;   // one cable, per direction
  double hop_latency_s = 0;      // one switch traversal (port to port)
  int switch_radix = 0;          // ports per switch
  int scalable_unit_nodes = 20;  // nodes per rail group in a rail-optimized fabric (DGX SuperPOD scalable unit)
  double oversubscription = 1;   // leaf down:up ratio; 1 = non-blocking
  bool rail_optimized = false;   // NIC i of every node of a scalable unit on the same leaf (rail) switch
  // Nodes one leaf switch serves when the fabric's design says so (Llama 3's RoCE racks: two 8-GPU servers under one
  // top-of-rack switch); 0: half the switch's ports, shared out by the nodes' NICs.
  int nodes_per_leaf = 0;
};

// GPUs (NVIDIA datasheets).
GpuSpec a100_sxm4_80gb();
GpuSpec a100_sxm4_40gb();
GpuSpec h100_sxm5_80gb();
GpuSpec h200_sxm_141gb();
// Hopper and Blackwell parts of today's clusters (topology/hopper_blackwell.cpp).
GpuSpec h800_sxm5_80gb();
GpuSpec b200_sxm_180gb();
GpuSpec gb200_186gb();  // the Blackwell GPU of a GB200 superchip (1200 W, NVL72 racks)

// Nodes (DGX user guides).
NodeSpec dgx_a100();
NodeSpec dgx_a100_40gb();
NodeSpec dgx_h100();
NodeSpec dgx_h200();
NodeSpec hgx_h800();
NodeSpec dgx_b200();
// One GB200 NVL72 rack as one "node": 72 GPUs in one NVLink domain (18 compute trays of 2 GB200 superchips, each
// GPU reaching every other through the rack's NVLink switch trays at its full NVLink rate), one compute NIC per GPU.
// TP, CP and EP groups of up to 72 GPUs stay inside it; the fabric joins racks.
NodeSpec gb200_nvl72();

// Fabrics (InfiniBand specifications and switch datasheets).
FabricSpec infiniband_hdr_fat_tree();
FabricSpec infiniband_ndr_fat_tree();
// Today's fabrics (topology/fabrics.cpp): InfiniBand XDR (800 Gb/s ports) and RoCE over 400 GbE.
FabricSpec infiniband_xdr_fat_tree();
FabricSpec roce_400g_fabric();
// The fabric a scenario's cluster.fabric names: "infiniband-hdr", "infiniband-ndr", "infiniband-xdr" or "roce";
// throws std::invalid_argument naming the known ones otherwise.
FabricSpec fabric_by_name(std::string_view name);
// The fabric cluster.fabric names (not NodeDefault: that is the node's, fabric_spec(NodeKind)).
FabricSpec fabric_spec(model::Fabric fabric);

// The node and fabric a scenario's `cluster.node` names. Throws std::invalid_argument for kinds that have no GPU
// (CpuHost): the simulator models GPU clusters only.
NodeSpec node_spec(model::NodeKind kind);
FabricSpec fabric_spec(model::NodeKind kind);

// The same, with the scenario's own network when it gives one (cluster.nics_per_node, cluster.nic_gbps): the node's
// compute NICs and their line rate, NCCL's ring speed for such a NIC, and one cable per NIC into the fabric. When
// the GPUs outnumber the NICs they share them: each GPU's NIC link carries its share, NCCL speed x NICs / GPUs
// (Megatron-LM's and DeepSpeed's inter-node traffic moves on every rail of a node at once, so a share is what each
// gets); with more NICs than GPUs, each GPU drives several. With cluster.gpus_per_node below the node's own count,
// the job's part of each node (part_of_node).
NodeSpec node_spec(const model::ClusterSpec& cluster);

// `gpus` of a node's GPUs, as a job that holds only those sees the node: the same GPUs and NVSwitch ports (any subset
// of NVSwitch-connected GPUs talks at the full per-GPU rate), and their share of its compute NICs, each GPU keeping
// the one beside it (a DGX's compute NICs are one per GPU, on the GPU's own PCIe switch: DGX A100 and DGX H100 user
// guides, "Network Ports"; NCCL picks each GPU's nearest NIC), so each GPU's network share does not change.
// Throws std::invalid_argument unless 1 <= gpus <= node.gpus.
NodeSpec part_of_node(NodeSpec node, int gpus);
// The part of `node` a job with cluster.gpus_per_node = `gpus_per_node` holds: part_of_node below the node's count,
// the whole node otherwise (0 is the node's default; a count above it is the simulator's to refuse, naming the key).
NodeSpec job_part_of_node(NodeSpec node, std::int64_t gpus_per_node);
FabricSpec fabric_spec(const model::ClusterSpec& cluster);

// NCCL's ring speed over one NIC of `line_bytes_per_s`: the fastest entry of its speed array not above the line rate
// (NCCL 2.8.3 src/graph/search.cc speedArray for A100 nodes; NCCL 2.18 sm90SpeedArrayInter for H100/H200 nodes).
double nccl_net_speed_bytes_per_s(double line_bytes_per_s, bool hopper);
// The same by compute capability: NCCL's table for GPUs of that generation (sm100SpeedArrayInter from 100 on).
double nccl_net_speed_bytes_per_s(double line_bytes_per_s, int compute_capability);

// One GPU's link to its host's memory, per direction: what an asynchronous checkpoint's snapshot crosses. PCIe Gen4
// x16 on A100 (A100 datasheet: 64 GB/s both directions), Gen5 x16 on Hopper and Blackwell (H100 SXM and HGX B200
// datasheets: 128 GB/s both directions); a GB200's NVLink-C2C to its Grace (900 GB/s both directions, GB200 NVL72
// datasheet) is counted at the Gen5 rate too (conservative: the snapshot's time is over-, never under-stated).
double host_link_bytes_per_s(const GpuSpec& gpu);

// "a100", "h100", "h200", "h800", "b200" -> the 8-GPU node of that GPU (DGX, or HGX H800); throws
// std::invalid_argument otherwise (a GB200 rack of 72 GPUs is a cluster.node, not a GPU swap).
NodeSpec node_spec_by_gpu_name(std::string_view gpu);

}  // namespace twin::topology
