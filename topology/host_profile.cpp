#include "topology/host_profile.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/core.h>
#include <toml++/toml.h>

#include "model/scenario/files.hpp"

namespace twin::topology {

double HostProfile::gemm_time_s(double m, double n, double k, double count) const {
  if (m <= 0 || n <= 0 || k <= 0 || count <= 0) return 0;
  // The rate of the nearest measured shape (distance in log m, log n, log k): a GEMM's efficiency follows its shape,
  // and a shape the profile did not see is most like its nearest one (another batch changes one dimension).
  const HostGemmRate* nearest = nullptr;
  double best = 0;
  for (const HostGemmRate& shape : gemm_shapes) {
    const double distance =
        std::abs(std::log(shape.m / m)) + std::abs(std::log(shape.n / n)) + std::abs(std::log(shape.k / k));
    if (!nearest || distance < best) {
      nearest = &shape;
      best = distance;
    }
  }
  if (nearest) return count * 2 * m * n * k / nearest->flops_per_s;
  return count * (gemm_overhead_s + 2 * m * n * k / gemm_flops_per_s);
}

double HostProfile::memory_time_s(const std::string& kind, double bytes) const {
  const auto it = memory_bytes_per_s_by_kind.find(kind);
  return bytes / (it != memory_bytes_per_s_by_kind.end() ? it->second : memory_bytes_per_s);
}

namespace {

double positive(const toml::table& table, const std::string& path, const char* section, const char* key,
                bool zero_allowed) {
  const auto* node = table[section][key].node();
  const std::optional<double> value = node ? node->value<double>() : std::nullopt;
  if (!value || !std::isfinite(*value) || *value < 0 || (!zero_allowed && *value == 0)) {
    throw std::invalid_argument(
        fmt::format("{}: {}.{} must be a {} number", path, section, key, zero_allowed ? "non-negative" : "positive"));
  }
  return *value;
}

}  // namespace

HostProfile read_host_profile(const std::string& path) {
  toml::table table;
  try {
    table = toml::parse(model::read_input_file(path, "profile", model::kMaxProfileBytes), path);
  } catch (const toml::parse_error& error) {
    const auto& where = error.source().begin;
    throw std::invalid_argument(fmt::format("{}:{}:{}: {}", path, where.line, where.column, error.description()));
  }
  HostProfile p;
  p.path = path;
  p.device = table["profile"]["device"].value_or(std::string());
  if (p.device != "cpu") {
    throw std::invalid_argument(
        fmt::format("{}: profile.device is \"{}\": a cpu-host profile is fitted on a CPU run's "
                    "trace (device = \"cpu\")",
                    path, p.device));
  }
  p.gemm_flops_per_s = positive(table, path, "gemm", "flops_per_s", false);
  p.gemm_overhead_s = positive(table, path, "gemm", "overhead_s", true);
  p.memory_bytes_per_s = positive(table, path, "memory", "bytes_per_s", false);
  p.memory_overhead_s = positive(table, path, "memory", "overhead_s", true);
  p.host_s_per_operator = positive(table, path, "host", "seconds_per_operator", true);
  if (table["attention"]["flops_per_s"])
    p.attention_flops_per_s = positive(table, path, "attention", "flops_per_s", false);
  if (const toml::table* kinds = table["memory"]["kind"].as_table()) {
    for (const auto& [key, value] : *kinds) {
      const std::optional<double> rate = value.value<double>();
      if (!rate || !(*rate > 0) || !std::isfinite(*rate)) {
        throw std::invalid_argument(fmt::format("{}: memory.kind.{} must be a positive number", path, key.str()));
      }
      p.memory_bytes_per_s_by_kind[std::string(key.str())] = *rate;
    }
  }
  if (const toml::array* shapes = table["gemm"]["shape"].as_array()) {
    for (std::size_t i = 0; i < shapes->size(); ++i) {
      const toml::table* shape = shapes->get(i)->as_table();
      const std::string where = fmt::format("{}: gemm.shape[{}]", path, i);
      if (!shape) throw std::invalid_argument(where + " must be a table");
      HostGemmRate rate;
      for (auto [field, key] :
           {std::pair{&rate.m, "m"}, {&rate.n, "n"}, {&rate.k, "k"}, {&rate.flops_per_s, "flops_per_s"}}) {
        const std::optional<double> value = (*shape)[key].value<double>();
        if (!value || !(*value > 0) || !std::isfinite(*value)) {
          throw std::invalid_argument(fmt::format("{}.{} must be a positive number", where, key));
        }
        *field = *value;
      }
      p.gemm_shapes.push_back(rate);
    }
  }
  return p;
}

NodeSpec cpu_host_node(const HostProfile& profile, int workers) {
  NodeSpec node;
  node.name = fmt::format("CPU host of {} worker{} (profile {})", workers, workers == 1 ? "" : "s", profile.path);
  node.gpu.name = "CPU";
  // Its "peak" (what MFU divides by): the fastest GEMM rate it measured.
  double best = profile.gemm_flops_per_s;
  for (const HostGemmRate& shape : profile.gemm_shapes) best = std::max(best, shape.flops_per_s);
  const double peak = best;
  node.gpu.bf16_flops = node.gpu.fp16_flops = node.gpu.tf32_flops = node.gpu.fp32_flops = peak;
  node.gpu.hbm_bytes_per_s = profile.memory_bytes_per_s;
  node.gpu.hbm_bytes = model::gpu_memory_bytes(model::NodeKind::CpuHost);
  node.gpu.sm_count = 1;
  node.gpus = std::max(1, workers);
  node.nvlink_bytes_per_s = node.nvlink_effective_bytes_per_s = profile.memory_bytes_per_s;
  node.compute_nics = 1;
  node.nic_bytes_per_s = node.nic_effective_bytes_per_s = profile.memory_bytes_per_s;
  node.nccl_nvlink_channels = 0;  // no SMs to share: the workers' collectives take no compute from them
  return node;
}

FabricSpec cpu_host_fabric(const HostProfile& profile) {
  FabricSpec fabric;
  fabric.name = "shared memory";
  fabric.link_bytes_per_s = profile.memory_bytes_per_s;
  fabric.hop_latency_s = 0;
  fabric.switch_radix = 64;
  return fabric;
}

}  // namespace twin::topology
