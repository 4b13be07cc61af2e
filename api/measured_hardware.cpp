#include "api/measured_hardware.hpp"

#include <cmath>
#include <stdexcept>

#include <fmt/core.h>

#include "model/scenario/errors.hpp"
#include "model/scenario/files.hpp"
#include "report/compare.hpp"

namespace twin::api {

MeasuredHardware read_measured_hardware(const model::Scenario& scenario, const std::string& flag_path,
                                        bool what_if_gpu) {
  const std::string path = flag_path.empty() ? scenario.cluster.gpu_profile : flag_path;
  const std::string named_by = flag_path.empty() ? "cluster.gpu_profile" : "--profile";
  MeasuredHardware measured;
  // The input policy first, so that a FIFO or a device is refused naming the flag or key that gave it.
  if (!path.empty()) model::InputFile checked(path, named_by, model::kMaxProfileBytes);
  try {
    if (scenario.cluster.node == model::NodeKind::CpuHost) {
      // A CPU host is simulated from its own measured rates only: no cited constants exist for "a CPU".
      if (path.empty()) {
        throw UserError(
            "twin sim of a cpu-host needs the host's measured rates: cluster.gpu_profile = "
            "\"PROFILE.toml\" or --profile PROFILE.toml (twin calibrate fits one on a profiler trace of a "
            "run on this machine, or on bench/kernels_cpu_bench's JSON)");
      }
      if (what_if_gpu) throw UserError("--gpu replaces a DGX node's GPU; this scenario runs on a cpu-host");
      measured.host = topology::read_host_profile(path);
      return measured;
    }
    if (path.empty()) return measured;
    if (what_if_gpu) {
      throw UserError(
          fmt::format("{} measured the scenario's GPU; --gpu asks for another GPU's cited values: give "
                      "one of them",
                      named_by));
    }
    measured.gpu = topology::read_gpu_profile(path);
    // Its bus bandwidths against the node's datasheet links now, so that the error names where the file came from.
    topology::with_measured_links(topology::node_spec(scenario.cluster), *measured.gpu);
  } catch (const std::invalid_argument& error) {
    throw UserError(fmt::format("{}: {}", named_by, error.what()));
  }
  const std::string gpu_name = topology::node_spec(scenario.cluster.node).gpu.name;
  if (!measured.gpu->device.empty() &&
      report::hardware_family(measured.gpu->device) != report::hardware_family(gpu_name)) {
    throw UserError(fmt::format("{} {} measured {}; this scenario runs on {} ({}): not the same GPU", named_by, path,
                                measured.gpu->device, gpu_name, model::to_string(scenario.cluster.node)));
  }
  try {  // the GPU's own datasheet bounds its measurement, once it is known to be this GPU's
    topology::check_against_datasheet(*measured.gpu, topology::node_spec(scenario.cluster.node).gpu);
  } catch (const std::invalid_argument& error) {
    throw UserError(fmt::format("{}: {}", named_by, error.what()));
  }
  if (measured.gpu->device.empty()) {
    fmt::print(stderr,
               "twin sim: warning: {} {} does not name its GPU (the trace had no deviceProperties): taken "
               "as the scenario's {}\n",
               named_by, path, gpu_name);
  }
  return measured;
}

topology::NodeSpec MeasuredHardware::node(const topology::NodeSpec& node, int workers) const {
  if (host) return topology::cpu_host_node(*host, workers);
  if (gpu) return topology::with_measured_links(node, *gpu);
  return node;
}

sim::AnalyticalParameters MeasuredHardware::parameters(const topology::GpuSpec& gpu_spec,
                                                       const model::ClusterSpec& cluster) const {
  if (host) return sim::host_parameters(*host);
  if (!gpu) return sim::analytical_parameters(gpu_spec, cluster);
  // The profile's rates where the cluster's own measurement keys would go (the scenario rules refuse both at once):
  // the same checks against the datasheet, the same derivation of the cost model's efficiencies.
  model::ClusterSpec measured = cluster;
  measured.gemm_tflops = gpu->gemm_flops_per_s / 1e12;
  for (std::size_t d = 0; d < 3; ++d)
    measured.gemm_shape[d] = static_cast<std::int64_t>(std::llround(gpu->gemm_shape[d]));
  measured.hbm_gb_per_s = gpu->hbm_bytes_per_s / 1e9;
  measured.attention_gemm_hbm_fraction = gpu->attention_gemm_hbm_fraction;
  sim::AnalyticalParameters p = sim::analytical_parameters(gpu_spec, measured);
  p.attention_flops_per_s = gpu->attention_flops_per_s;
  return p;
}

std::string MeasuredHardware::line() const {
  if (host) {
    return fmt::format(
        "host profile {}: GEMM {:.2f} GFLOP/s fitted ({} shapes at their own measured rates), memory "
        "{:.2f} GB/s, {:.1f} us per operator and {:.1f} us between operators (twin calibrate)",
        host->path, host->gemm_flops_per_s / 1e9, host->gemm_shapes.size(), host->memory_bytes_per_s / 1e9,
        host->memory_overhead_s * 1e6, host->host_s_per_operator * 1e6);
  }
  if (!gpu) return "";
  std::string measured;
  auto add = [&measured](const std::string& part) { measured += (measured.empty() ? "" : ", ") + part; };
  if (gpu->gemm_flops_per_s > 0) add("GEMM");
  if (gpu->hbm_bytes_per_s > 0) add("HBM");
  if (gpu->attention_flops_per_s > 0)
    add(fmt::format("fused attention {:.1f} TFLOP/s", gpu->attention_flops_per_s / 1e12));
  if (gpu->attention_gemm_hbm_fraction > 0) add("attention GEMMs");
  for (const bool across : {false, true}) {
    if (const topology::MeasuredCollective* c = topology::link_measurement(*gpu, across)) {
      add(fmt::format("{} bus {:.1f} GB/s ({} of {} ranks on {} node{})", across ? "network" : "NVLink",
                      c->bus_bytes_per_s / 1e9, c->kind, c->ranks, c->nodes, c->nodes == 1 ? "" : "s"));
    }
  }
  return fmt::format("GPU profile {} ({}): {} measured (twin calibrate); the rest cited", gpu->path,
                     gpu->device.empty() ? "GPU unnamed" : gpu->device, measured.empty() ? "nothing" : measured);
}

nlohmann::json MeasuredHardware::json() const {
  if (host) {
    return {{"path", host->path},
            {"gemm_flops_per_s", host->gemm_flops_per_s},
            {"gemm_shapes", host->gemm_shapes.size()},
            {"memory_bytes_per_s", host->memory_bytes_per_s},
            {"seconds_per_operator", host->memory_overhead_s},
            {"seconds_between_operators", host->host_s_per_operator}};
  }
  if (!gpu) return nullptr;
  nlohmann::json collectives = nlohmann::json::array();
  for (const topology::MeasuredCollective& c : gpu->collectives) {
    collectives.push_back({{"kind", c.kind},
                           {"ranks", c.ranks},
                           {"nodes", c.nodes},
                           {"latency_s", c.latency_s},
                           {"bus_bytes_per_s", c.bus_bytes_per_s}});
  }
  return {{"path", gpu->path},
          {"device", gpu->device},
          {"gemm_flops_per_s", gpu->gemm_flops_per_s},
          {"hbm_bytes_per_s", gpu->hbm_bytes_per_s},
          {"attention_flops_per_s", gpu->attention_flops_per_s},
          {"attention_gemm_hbm_fraction", gpu->attention_gemm_hbm_fraction},
          {"collectives", collectives}};
}

}  // namespace twin::api
