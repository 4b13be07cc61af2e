// A GPU as a profile measured it (`twin calibrate` on GPU profiler traces or on bench/gpu's twin_gemm_peak, written as
// TOML by measured/profile_text.cpp), read for the simulator (cluster.gpu_profile, twin sim --profile):
//   [profile]       device                                 CUDA's name of the GPU ("NVIDIA H200")
//   [[gemm.shape]]  m, n, k, flops_per_s                   the fastest is the GEMM measurement (cluster.gemm_tflops)
//   [memory]        bytes_per_s                            a streaming kernel's HBM rate (cluster.hbm_gb_per_s)
//   [attention]     flops_per_s, gemm_hbm_fraction         the fused attention kernel's rate; the unfused attention's
//                                                          GEMMs' share of the streaming rate
//   [[collective]]  kind, ranks, nodes, latency_s, bus_bytes_per_s, [[collective.size]] bytes
// Every section is optional: what a profile did not measure keeps its cited value.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "topology/hardware.hpp"

namespace twin::topology {

struct MeasuredCollective {
  std::string kind;  // "all_reduce", "all_gather", ...
  int ranks = 0;
  int nodes = 0;  // 0: the span was not recorded
  double latency_s = 0;
  double bus_bytes_per_s = 0;
  double largest_bytes = 0;  // the largest message measured
};

struct GpuProfile {
  std::string path;
  std::string device;
  double gemm_flops_per_s = 0;  // 0: not measured
  std::array<double, 3> gemm_shape{};
  double hbm_bytes_per_s = 0;
  double attention_flops_per_s = 0;
  double attention_gemm_hbm_fraction = 0;
  std::vector<MeasuredCollective> collectives;
};

// Reads a profile; throws std::invalid_argument naming the file and the field that is malformed, and for a CPU's
// profile (device = "cpu": topology/host_profile.hpp reads those).
GpuProfile read_gpu_profile(const std::string& path);

// Throws std::invalid_argument naming the file and field when `profile` measured nothing at all, or a rate past what
// `gpu`'s datasheet allows or under 5 % of it (a unit slip), as the scenario's own measurement keys are bounded
// (sim/cost_model.cpp): GEMM FLOP/s against the 16-bit tensor-core peak, attention FLOP/s against the fastest, the memory rate against HBM,
// the attention GEMMs' share of it in (5 %, 100 %]. A collective's latency past 1 s is no network's.
void check_against_datasheet(const GpuProfile& profile, const GpuSpec& gpu);

// The collective whose bus bandwidth stands for the links of groups within one node (`across_nodes` false) or across
// nodes: of the profile's fits of that span, the one measured on the largest message (the bandwidth a fit of small
// messages gives is mostly latency); nullptr when the profile measured none.
const MeasuredCollective* link_measurement(const GpuProfile& profile, bool across_nodes);

// `node` with the profile's measured bus bandwidths as its NCCL link rates: within a node the NVLink rate (the bus
// bandwidth NCCL's model gives one node's rings, sim/collectives.cpp), across nodes each NIC's (per GPU: the bus
// bandwidth over the group's ranks per node). Throws std::invalid_argument when a measurement exceeds its link's
// datasheet rate or is under 1 % of it (a unit slip).
NodeSpec with_measured_links(NodeSpec node, const GpuProfile& profile);

}  // namespace twin::topology
