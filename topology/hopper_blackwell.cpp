// The Hopper and Blackwell parts of today's training clusters beyond DGX H100 / H200: the export H800, the B200 of
// DGX B200 and the GB200 of NVL72 racks. Every number names its source; peaks are dense (the datasheets print the
// sparse figure for the tensor-core formats, marked *, which is twice the dense one). GPU memory is in bytes as the
// driver reports it (nvidia-smi's MiB), the datasheet's decimal "GB" said beside it.
#include "topology/datasheet_units.hpp"
#include "topology/hardware.hpp"
#include "topology/host_launch.hpp"

namespace twin::topology {

// NVIDIA H800 Tensor Core GPU datasheet ("H800 SXM5"): the GH100 of H100 SXM5 with the same tensor-core peaks (FP8
// 3,958 TFLOPS*, BF16 / FP16 1,979 TFLOPS*, TF32 989 TFLOPS*), 80 GB of HBM3 at 3.35 TB/s, and NVLink cut to
// 400 GB/s (node: hgx_h800()). Memory and SMs as H100 SXM5's.
GpuSpec h800_sxm5_80gb() {
  GpuSpec gpu = h100_sxm5_80gb();
  gpu.name = "H800-SXM5-80GB";
  gpu.hbm_bytes = model::gpu_memory_bytes(model::NodeKind::HgxH800);
  return gpu;
}

// NVIDIA HGX B200 specifications (nvidia.com/en-us/data-center/hgx, "Individual Blackwell GPU Specifications", HGX
// B200 column, 1,000 W): FP8 9 PFLOPS*, FP16 / BF16 4.5 PFLOPS*, TF32 2.2 PFLOPS*, FP32 75 TFLOPS, 180 GB HBM3e;
// NVIDIA DGX B200 datasheet: 1,440 GB and 64 TB/s of HBM3e over 8 GPUs (8 TB/s each). The driver reports 183359 MiB
// (nvidia-smi on a B200) and 148 SMs (cudaDeviceProp::multiProcessorCount on a B200).
GpuSpec b200_sxm_180gb() {
  GpuSpec gpu;
  gpu.name = "B200-SXM-180GB";
  gpu.bf16_flops = 4500 * kTera / 2;
  gpu.fp16_flops = 4500 * kTera / 2;
  gpu.tf32_flops = 2200 * kTera / 2;
  gpu.fp32_flops = 75 * kTera;
  gpu.fp8_flops = 9000 * kTera / 2;
  gpu.hbm_bytes_per_s = 8000 * kGB;
  gpu.hbm_bytes = model::gpu_memory_bytes(model::NodeKind::DgxB200);  // model/'s one table of GPU memory
  gpu.sm_count = 148;
  gpu.compute_capability = 100;
  return gpu;
}

// NVIDIA GB200 NVL72 specifications (nvidia.com/en-us/data-center/gb200-nvl72, "Individual Blackwell GPU
// Specifications", GB200 column, configurable up to 1,200 W): FP8 10 PFLOPS*, FP16 / BF16 5 PFLOPS*, TF32 2.5
// PFLOPS*, FP32 80 TFLOPS, 186 GB HBM3e at 8 TB/s. The driver reports 189471 MiB (nvidia-smi on a GB200) and 152
// SMs (torch.cuda.get_device_properties on a GB200).
GpuSpec gb200_186gb() {
  GpuSpec gpu;
  gpu.name = "GB200-186GB";
  gpu.bf16_flops = 5000 * kTera / 2;
  gpu.fp16_flops = 5000 * kTera / 2;
  gpu.tf32_flops = 2500 * kTera / 2;
  gpu.fp32_flops = 80 * kTera;
  gpu.fp8_flops = 10000 * kTera / 2;
  gpu.hbm_bytes_per_s = 8000 * kGB;
  gpu.hbm_bytes = model::gpu_memory_bytes(model::NodeKind::Gb200Nvl72);  // model/'s one table of GPU memory
  gpu.sm_count = 152;
  gpu.compute_capability = 100;
  return gpu;
}

// HGX H800 8-GPU (the baseboard of DeepSeek-V3's cluster): 8x H800 SXM5 behind NVSwitches at 400 GB/s bidirectional
// per GPU (H800 datasheet: 8 NVLink4 links, 200 GB/s per direction), and 8x ConnectX-7 400 Gb/s InfiniBand, one per
// GPU (DeepSeek-AI, "Insights into DeepSeek-V3: Scaling Challenges and Reflections on Hardware for AI
// Architectures", ISCA 2025, Section 4: "eight 400G Infiniband (IB) CX7 NICs" per node).
// Effective rates, as NCCL models them (tags v2.18.3-1 to v2.30.7-1): NVLink 8 links of SM90_NVLINK_BW 20.6 GB/s =
// 164.8 GB/s (DeepSeek-V3 technical report, arXiv:2412.19437, Section 3.2.2, measures "NVLink ... 160 GB/s" and "IB
// (50 GB/s)"); NIC 48 GB/s (sm90SpeedArrayInter). Channels: the ring search's best is 4 rings at 40 GB/s (160 of
// 164.8; 60 and 50 fit 2 and 3), ncclTopoDupChannels doubles them (4 is not above its "bwIntra < 50 && nChannels >
// 4" floor) and connect.cc's postset doubles again: 16.
NodeSpec hgx_h800() {
  NodeSpec node;
  node.name = "HGX H800";
  node.gpu = h800_sxm5_80gb();
  node.gpus = 8;
  node.nvlink_bytes_per_s = 200 * kGB;
  node.nvlink_effective_bytes_per_s = 8 * 20.6 * kGB;
  node.compute_nics = 8;
  node.nic_bytes_per_s = 400 * kGiga / 8;
  node.nic_effective_bytes_per_s = nccl_net_speed_bytes_per_s(node.nic_bytes_per_s, node.gpu.compute_capability);
  node.nccl_nvlink_channels = 16;
  node.host_us_per_kernel = kXeon8480cHostUsPerKernel;
  return node;
}

// NVIDIA DGX B200 User Guide / datasheet: 8x B200, 2x NVSwitch (fifth-generation NVLink: 1.8 TB/s bidirectional per
// GPU, 900 GB/s per direction, 14.4 TB/s in all), 8x single-port ConnectX-7 VPI at 400 Gb/s InfiniBand for compute
// (the BlueField-3 DPUs serve storage and management, not modelled).
// Effective rates (NCCL, tag v2.30.7-1): NVLink 18 links of SM100_NVLINK_BW 40.1 GB/s (src/graph/topo.h) = 721.8
// GB/s; NIC 48 GB/s for 400 Gb/s (sm100SpeedArrayInter). Channels: 8 rings at sm100SpeedArrayIntra's top 90 GB/s
// (720 of 721.8), doubled by ncclTopoDupChannels (90 >= 50) and again by the postset: 32.
NodeSpec dgx_b200() {
  NodeSpec node;
  node.name = "DGX B200";
  node.gpu = b200_sxm_180gb();
  node.gpus = 8;
  node.nvlink_bytes_per_s = 900 * kGB;
  node.nvlink_effective_bytes_per_s = 18 * 40.1 * kGB;
  node.compute_nics = 8;
  node.nic_bytes_per_s = 400 * kGiga / 8;
  node.nic_effective_bytes_per_s = nccl_net_speed_bytes_per_s(node.nic_bytes_per_s, node.gpu.compute_capability);
  node.nccl_nvlink_channels = 32;
  node.host_us_per_kernel = kXeon8480cHostUsPerKernel;
  return node;
}

// NVIDIA GB200 NVL72 specifications and DGX GB200 User Guide: 72 Blackwell GPUs and 36 Grace CPUs in one rack, one
// NVLink domain (fifth-generation NVLink: 1.8 TB/s bidirectional per GPU, 130 TB/s in all, through 9 NVLink switch
// trays), and 72 single-port ConnectX-7 at 400 Gb/s InfiniBand for compute, one per GPU (4 per compute tray).
// Effective rates and channels as DGX B200's: the same 18 links per GPU, the same NCCL tables.
NodeSpec gb200_nvl72() {
  NodeSpec node;
  node.name = "GB200 NVL72";
  node.gpu = gb200_186gb();
  node.gpus = 72;
  node.nvlink_bytes_per_s = 900 * kGB;
  node.nvlink_effective_bytes_per_s = 18 * 40.1 * kGB;
  node.compute_nics = 72;
  node.nic_bytes_per_s = 400 * kGiga / 8;
  node.nic_effective_bytes_per_s = nccl_net_speed_bytes_per_s(node.nic_bytes_per_s, node.gpu.compute_capability);
  node.nccl_nvlink_channels = 32;
  node.host_us_per_kernel = kGb200GraceHostUsPerKernel;
  return node;
}

}  // namespace twin::topology
