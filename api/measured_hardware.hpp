// The hardware a measured profile describes, for twin sim: `--profile PROFILE.toml`, else the scenario's
// cluster.gpu_profile (`twin calibrate` writes both kinds):
//   - a cpu-host: the whole node from the host's profile (topology/host_profile.hpp); without one it is refused;
//   - a GPU node: the profile's GEMM, HBM and unfused-attention rates in place of the cited ones (as
//     cluster.gemm_tflops, hbm_gb_per_s and attention_gemm_hbm_fraction set them), its fused attention rate, and its
//     collectives' bus bandwidths as the node's NCCL link rates (topology/gpu_profile.hpp).
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "model/scenario/scenario.hpp"
#include "sim/cost_model.hpp"
#include "topology/gpu_profile.hpp"
#include "topology/hardware.hpp"
#include "topology/host_profile.hpp"

namespace twin::api {

struct MeasuredHardware {
  std::optional<topology::HostProfile> host;
  std::optional<topology::GpuProfile> gpu;

  // The node `node` (the scenario's) as the profile measured it: a cpu-host's of `workers` workers, a GPU node with
  // its measured link rates.
  topology::NodeSpec node(const topology::NodeSpec& node, int workers) const;
  // The cost model's parameters for `gpu` on `cluster` with the profile's rates; throws std::invalid_argument naming
  // the rate when a measurement exceeds what the GPU can do.
  sim::AnalyticalParameters parameters(const topology::GpuSpec& gpu, const model::ClusterSpec& cluster) const;
  // What the summary says of the profile, and its JSON ("host_profile" or "gpu_profile").
  std::string line() const;
  nlohmann::json json() const;
};

// The profile `flag_path` (twin sim --profile) or else `scenario`'s cluster.gpu_profile names, read for its node
// kind; none when neither names one (a cpu-host then is refused). `what_if_gpu`: --gpu was given (a GPU profile
// measures the scenario's GPU, not another). Throws UserError naming the file and field.
MeasuredHardware read_measured_hardware(const model::Scenario& scenario, const std::string& flag_path,
                                        bool what_if_gpu);

}  // namespace twin::api
