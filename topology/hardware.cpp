// Hardware specs. Every number names its source; "dense" peaks are the datasheet's sparsity figures halved where
// the datasheet only prints the sparse one (marked *) .
#include "topology/hardware.hpp"
#include "topology/datasheet_units.hpp"
#include "topology/host_launch.hpp"

#include <iterator>
#include <stdexcept>
#include <string>

#include <fmt/core.h>

namespace twin::topology {

double GpuSpec::peak_flops(model::DType dtype) const {
  switch (dtype) {
    case model::DType::BF16:
      return bf16_flops;
    case model::DType::FP16:
      return fp16_flops;
    case model::DType::FP32:
      return fp32_flops;
  }
  return bf16_flops;
}

// NVIDIA A100 Tensor Core GPU datasheet (2021, "A100 80GB SXM" column): FP32 19.5 TFLOPS, TF32 156 TFLOPS,
// BF16 312 TFLOPS, FP16 312 TFLOPS, 80 GB HBM2e at 2,039 GB/s. SM count: NVIDIA A100 Tensor Core GPU Architecture
// whitepaper (2020), "the A100 GPU ... 108 SMs".
GpuSpec a100_sxm4_80gb() {
  GpuSpec gpu;
  gpu.name = "A100-SXM4-80GB";
  gpu.bf16_flops = 312 * kTera;
  gpu.fp16_flops = 312 * kTera;
  gpu.tf32_flops = 156 * kTera;
  gpu.fp32_flops = 19.5 * kTera;
  gpu.hbm_bytes_per_s = 2039 * kGB;
  gpu.hbm_bytes = model::gpu_memory_bytes(model::NodeKind::DgxA100);  // model/'s one table of GPU memory
  gpu.sm_count = 108;
  return gpu;
}

// The same datasheet's "A100 40GB SXM" column: the same peaks and SMs, 40 GB of HBM2 at 1,555 GB/s.
GpuSpec a100_sxm4_40gb() {
  GpuSpec gpu = a100_sxm4_80gb();
  gpu.name = "A100-SXM4-40GB";
  gpu.hbm_bytes_per_s = 1555 * kGB;
  gpu.hbm_bytes = model::gpu_memory_bytes(model::NodeKind::DgxA100_40GB);  // model/'s one table of GPU memory
  return gpu;
}

// NVIDIA H100 Tensor Core GPU datasheet (2023, "H100 SXM" column): FP32 67 TFLOPS, TF32 989 TFLOPS*, BF16 1,979
// TFLOPS*, FP16 1,979 TFLOPS*, FP8 3,958 TFLOPS* (* with sparsity: dense is half), 80 GB HBM3 at 3.35 TB/s. SM
// count: NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022), "H100 SXM5 ... 132 SMs".
GpuSpec h100_sxm5_80gb() {
  GpuSpec gpu;
  gpu.name = "H100-SXM5-80GB";
  gpu.bf16_flops = 1979 * kTera / 2;
  gpu.fp16_flops = 1979 * kTera / 2;
  gpu.tf32_flops = 989 * kTera / 2;
  gpu.fp32_flops = 67 * kTera;
  gpu.fp8_flops = 3958 * kTera / 2;
  gpu.hbm_bytes_per_s = 3350 * kGB;
  gpu.hbm_bytes = model::gpu_memory_bytes(model::NodeKind::DgxH100);  // model/'s one table of GPU memory
  gpu.sm_count = 132;
  gpu.compute_capability = 90;
  return gpu;
}

// NVIDIA H200 Tensor Core GPU datasheet (2024, "H200 SXM" column): FP32 67 TFLOPS, TF32 989 TFLOPS*, BF16 1,979
// TFLOPS*, FP16 1,979 TFLOPS*, FP8 3,958 TFLOPS*, 141 GB HBM3e at 4.8 TB/s. Same GH100 die as H100 SXM5, hence 132 SMs.
GpuSpec h200_sxm_141gb() {
  GpuSpec gpu;
  gpu.name = "H200-SXM-141GB";
  gpu.bf16_flops = 1979 * kTera / 2;
  gpu.fp16_flops = 1979 * kTera / 2;
  gpu.tf32_flops = 989 * kTera / 2;
  gpu.fp32_flops = 67 * kTera;
  gpu.fp8_flops = 3958 * kTera / 2;
  gpu.hbm_bytes_per_s = 4800 * kGB;
  gpu.hbm_bytes = model::gpu_memory_bytes(model::NodeKind::DgxH200);  // model/'s one table of GPU memory
  gpu.sm_count = 132;
  gpu.compute_capability = 90;
  return gpu;
}

// NVIDIA DGX A100 User Guide / datasheet: 8x A100 80GB, 6x NVSwitch giving 600 GB/s bidirectional GPU-to-GPU
// bandwidth per GPU (300 GB/s per direction), 8x single-port ConnectX-6 VPI HDR InfiniBand 200 Gb/s for compute
// (the two dual-port storage NICs are not modelled).
// Effective rates (NCCL 2.8, src/graph/tuning.cc and src/graph/search.cc, contemporary with MT-NLG):
//   NVLink: "if (compCap80) busBw = std::min(busBw, 235.0f)": NCCL models an A100's NVLink bus bandwidth as 235 GB/s;
//   NIC: speedArrayInter = {..., 24.0, ...}: the fastest ring speed not above a 200 Gb/s (25 GB/s) NIC is 24 GB/s.
//   Channels inside the node (src/graph/topo.h, search.cc, connect.cc, init.cc): each GPU reaches the NVSwitches
//   over 12 links of SM80_NVLINK_WIDTH 21 GB/s, 252 GB/s; the ring search fits 6 rings at the top speed 42 GB/s
//   (6 x 42 = 252, the total: search done), doubles them because that speed is >= 25 (12 channels, within init.cc's
//   ring maxChannels MAXCHANNELS/2 = 16), and ncclTopoPostset doubles the channels again ("nChannels*2", MAXCHANNELS
//   32): 24 (NCCL 2.12 gets 24 too: 12 x 22 GB/s, 6 rings at 44).
NodeSpec dgx_a100() {
  NodeSpec node;
  node.name = "DGX A100";
  node.gpu = a100_sxm4_80gb();
  node.gpus = 8;
  node.nvlink_bytes_per_s = 300 * kGB;
  node.nvlink_effective_bytes_per_s = 235 * kGB;
  node.compute_nics = 8;
  node.nic_bytes_per_s = 200 * kGiga / 8;
  node.nic_effective_bytes_per_s = 24 * kGB;
  node.nccl_nvlink_channels = 24;
  node.host_us_per_kernel = kXeon8480cHostUsPerKernel;
  return node;
}

// DGX A100 320GB (the first DGX A100, as Selene was built in 2020): the same chassis, NVSwitches and compute NICs
// with 8x A100 40GB (NVIDIA DGX A100 datasheet, 320GB and 640GB systems).
NodeSpec dgx_a100_40gb() {
  NodeSpec node = dgx_a100();
  node.name = "DGX A100 320GB";
  node.gpu = a100_sxm4_40gb();
  return node;
}

// NVIDIA DGX H100 User Guide: 8x H100 SXM5 80GB, 4x NVSwitch giving 900 GB/s bidirectional per GPU (450 GB/s per
// direction), 8x ConnectX-7 NDR InfiniBand 400 Gb/s for compute (through four OSFP cages).
// Effective rates (NCCL src/graph/tuning.cc, topo.h and search.cc):
//   NVLink: 370 GB/s. NCCL 2.17.1 caps it there ("if (compCapIndex == HOPPER_COMPCAP_IDX) busBw = std::min(busBw,
//   370.0f)", tuning.cc at tag v2.17.1-1); from 2.18 the cap is gone but the ring search's total is the same, 18
//   links of SM90_NVLINK_BW 20.6 GB/s (topo.h) = 370.8 GB/s;
//   NIC: sm90SpeedArrayInter = {48.0, ...}: 48 GB/s for a 400 Gb/s (50 GB/s) NIC.
//   Channels inside the node: 18 links of SM90_NVLINK_BW 20.6 GB/s (370.8 GB/s); the ring search fits 6 rings at
//   sm90SpeedArrayIntra's top 60 GB/s (no slower speed fits more bandwidth), ncclTopoDupChannels doubles them (60 >=
//   50) and ncclTopoPostset doubles again: 24 for ring and tree. NVLink SHARP (NVLS, NCCL >= 2.17), which NCCL may
//   prefer for all-reduce on NVSwitch systems, is not modelled.
NodeSpec dgx_h100() {
  NodeSpec node;
  node.name = "DGX H100";
  node.gpu = h100_sxm5_80gb();
  node.gpus = 8;
  node.nvlink_bytes_per_s = 450 * kGB;
  node.nvlink_effective_bytes_per_s = 370 * kGB;
  node.compute_nics = 8;
  node.nic_bytes_per_s = 400 * kGiga / 8;
  node.nic_effective_bytes_per_s = 48 * kGB;
  node.nccl_nvlink_channels = 24;
  node.host_us_per_kernel = kXeon8480cHostUsPerKernel;
  return node;
}

// NVIDIA DGX H200 datasheet: the DGX H100 chassis (4x NVSwitch, 900 GB/s per GPU, 8x ConnectX-7 400 Gb/s) with
// 8x H200 141GB.
NodeSpec dgx_h200() {
  NodeSpec node = dgx_h100();
  node.name = "DGX H200";
  node.gpu = h200_sxm_141gb();
  return node;
}

// InfiniBand HDR: 4x links at 50 Gb/s per lane = 200 Gb/s per port (InfiniBand Architecture Specification, Release
// 1.4, HDR). Switch: NVIDIA (Mellanox) Quantum QM8700 datasheet: 40 HDR ports, 130 ns port-to-port latency.
// DGX SuperPOD reference architecture (A100): scalable units of 20 nodes, NIC i of each node on leaf (rail) i.
FabricSpec infiniband_hdr_fat_tree() {
  FabricSpec fabric;
  fabric.name = "InfiniBand HDR fat-tree";
  fabric.link_bytes_per_s = 200 * kGiga / 8;
  fabric.hop_latency_s = 130e-9;
  fabric.switch_radix = 40;
  fabric.scalable_unit_nodes = 20;
  return fabric;
}

// InfiniBand NDR: 4x links at 100 Gb/s per lane = 400 Gb/s per port (IBTA specification, NDR). Switch: NVIDIA
// Quantum-2 QM9700 datasheet: 64 NDR ports. Its brief gives no port-to-port latency; Quantum's 130 ns is reused.
// DGX SuperPOD reference architecture (H100): scalable units of 32 nodes.
FabricSpec infiniband_ndr_fat_tree() {
  FabricSpec fabric;
  fabric.name = "InfiniBand NDR fat-tree";
  fabric.link_bytes_per_s = 400 * kGiga / 8;
  fabric.hop_latency_s = 130e-9;
  fabric.switch_radix = 64;
  fabric.scalable_unit_nodes = 32;
  return fabric;
}

NodeSpec node_spec(model::NodeKind kind) {
  switch (kind) {
    case model::NodeKind::DgxA100:
      return dgx_a100();
    case model::NodeKind::DgxA100_40GB:
      return dgx_a100_40gb();
    case model::NodeKind::DgxH100:
      return dgx_h100();
    case model::NodeKind::DgxH200:
      return dgx_h200();
    case model::NodeKind::HgxH800:
      return hgx_h800();
    case model::NodeKind::DgxB200:
      return dgx_b200();
    case model::NodeKind::Gb200Nvl72:
      return gb200_nvl72();
    case model::NodeKind::CpuHost:
      break;
  }
  throw std::invalid_argument(
      "the simulator models GPU clusters: cluster.node must be a GPU node (dgx-a100, dgx-a100-40gb, dgx-h100, "
      "dgx-h200, hgx-h800, dgx-b200 or gb200-nvl72), not a CPU host");
}

FabricSpec fabric_spec(model::NodeKind kind) {
  switch (kind) {
    case model::NodeKind::DgxA100:
    case model::NodeKind::DgxA100_40GB:
      return infiniband_hdr_fat_tree();
    case model::NodeKind::DgxH100:
    case model::NodeKind::DgxH200:
    case model::NodeKind::HgxH800:  // DeepSeek's H800 nodes: 400G InfiniBand (CX7) NICs
    case model::NodeKind::DgxB200:
    case model::NodeKind::Gb200Nvl72:  // their ConnectX-7 NICs are 400 Gb/s NDR
      return infiniband_ndr_fat_tree();
    case model::NodeKind::CpuHost:
      break;
  }
  throw std::invalid_argument("the simulator models GPU clusters: no fabric for a CPU host");
}

double nccl_net_speed_bytes_per_s(double line_bytes_per_s, int compute_capability) {
  // GB/s. NCCL 2.8.3 (src/graph/search.cc, tag v2.8.3-1): speedArray; NCCL 2.18 (tag v2.18.3-1): sm90SpeedArrayInter;
  // NCCL 2.30 (tag v2.30.7-1): sm100SpeedArrayInter.
  static constexpr double kAmpere[] = {42.0, 30.0, 24.0, 21.0, 18.0, 15.0, 12.0, 10.0, 9.0,
                                       7.0,  6.0,  5.0,  4.0,  3.0,  2.4,  1.2,  0.24, 0.12};
  static constexpr double kHopper[] = {48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 20.0, 17.5,
                                       15.0, 12.0, 6.0,  3.0,  2.4,  1.2,  0.24, 0.12};
  static constexpr double kBlackwell[] = {96.0, 86.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0,
                                          20.0, 17.5, 15.0, 12.0, 6.0,  3.0,  2.4,  1.2,  0.24, 0.12};
  const double line = line_bytes_per_s / kGB;
  auto fastest_not_above = [line](const auto& speeds) {
    for (double speed : speeds) {
      if (speed <= line) return speed;
    }
    return speeds[std::size(speeds) - 1];
  };
  if (compute_capability >= 100) return fastest_not_above(kBlackwell) * kGB;
  return (compute_capability >= 90 ? fastest_not_above(kHopper) : fastest_not_above(kAmpere)) * kGB;
}

double nccl_net_speed_bytes_per_s(double line_bytes_per_s, bool hopper) {
  return nccl_net_speed_bytes_per_s(line_bytes_per_s, hopper ? 90 : 80);
}

NodeSpec part_of_node(NodeSpec node, int gpus) {
  if (gpus < 1 || gpus > node.gpus) {
    throw std::invalid_argument(fmt::format("cluster.gpus_per_node = {} but a {} has {} GPUs (1 to {})", gpus,
                                            node.name, node.gpus, node.gpus));
  }
  if (gpus == node.gpus) return node;
  // Each GPU's NIC link (nic_effective_bytes_per_s) is its share already; the node's cables shrink with its NICs.
  node.compute_nics = std::max(1, node.compute_nics * gpus / node.gpus);
  node.name += fmt::format(", {} of its {} GPUs", gpus, node.gpus);
  node.gpus = gpus;
  return node;
}

NodeSpec job_part_of_node(NodeSpec node, std::int64_t gpus_per_node) {
  return gpus_per_node > 0 && gpus_per_node < node.gpus ? part_of_node(node, static_cast<int>(gpus_per_node)) : node;
}

NodeSpec node_spec(const model::ClusterSpec& cluster) {
  NodeSpec node = node_spec(cluster.node);
  if (cluster.nics_per_node <= 0 && cluster.nic_gbps <= 0) return job_part_of_node(node, cluster.gpus_per_node);
  const int nics = cluster.nics_per_node > 0 ? static_cast<int>(cluster.nics_per_node) : node.compute_nics;
  const double line = cluster.nic_gbps > 0 ? cluster.nic_gbps * kGiga / 8 : node.nic_bytes_per_s;
  node.name += fmt::format(" with {} x {:g} Gb/s NICs", nics, line * 8 / kGiga);
  node.compute_nics = nics;
  node.nic_bytes_per_s = line;
  node.nic_effective_bytes_per_s = nccl_net_speed_bytes_per_s(line, node.gpu.compute_capability) * nics / node.gpus;
  return job_part_of_node(node, cluster.gpus_per_node);
}

FabricSpec fabric_spec(const model::ClusterSpec& cluster) {
  FabricSpec fabric =
      cluster.fabric == model::Fabric::NodeDefault ? fabric_spec(cluster.node) : fabric_spec(cluster.fabric);
  // A fabric two generations past the node's NICs (XDR's 800 Gb/s links for a DGX A100's HDR ConnectX-6 at 200 Gb/s)
  // is no cluster anyone built: InfiniBand switches take the previous generation's links at that generation's rate,
  // and the model would give each hop a bandwidth the NIC can never feed. One generation apart is kept (NDR links for
  // HDR NICs run at HDR's rate, as the NIC's own link models it).
  const double nic_bytes_per_s =
      cluster.fabric != model::Fabric::NodeDefault && cluster.nic_gbps <= 0 ? node_spec(cluster).nic_bytes_per_s : 0;
  if (nic_bytes_per_s > 0 && fabric.link_bytes_per_s > 2 * nic_bytes_per_s) {
    throw std::invalid_argument(fmt::format(
        "cluster.fabric = \"{}\" on {}: its {:g} Gb/s links are {:g} times the node's {:g} Gb/s NICs, two "
        "generations apart; give the node's own fabric, or cluster.nic_gbps for NICs of the fabric's generation",
        model::to_string(cluster.fabric), model::to_string(cluster.node), fabric.link_bytes_per_s * 8 / kGiga,
        fabric.link_bytes_per_s / nic_bytes_per_s, nic_bytes_per_s * 8 / kGiga));
  }
  fabric.rail_optimized = fabric.rail_optimized || cluster.rail_optimized;
  if (cluster.nic_gbps > 0) {
    fabric.name = fmt::format("fat-tree of {:g} Gb/s links", cluster.nic_gbps);
    fabric.link_bytes_per_s = cluster.nic_gbps * kGiga / 8;
  }
  return fabric;
}

double host_link_bytes_per_s(const GpuSpec& gpu) { return gpu.compute_capability >= 90 ? 64e9 : 32e9; }

NodeSpec node_spec_by_gpu_name(std::string_view gpu) {
  if (gpu == "a100") return dgx_a100();
  if (gpu == "h100") return dgx_h100();
  if (gpu == "h200") return dgx_h200();
  if (gpu == "h800") return hgx_h800();
  if (gpu == "b200") return dgx_b200();
  throw std::invalid_argument("unknown GPU '" + std::string(gpu) + "' (expected a100, h100, h200, h800 or b200)");
}

}  // namespace twin::topology
