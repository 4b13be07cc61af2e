#include "topology/gpu_profile.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>

#include <fmt/core.h>
#include <toml++/toml.h>

#include "model/scenario/files.hpp"

namespace twin::topology {
namespace {

// A positive finite number at `key` of `table`, or nullopt when absent; throws naming `where` when malformed.
std::optional<double> positive(const toml::table& table, const char* key, const std::string& where) {
  const toml::node* node = table.get(key);
  if (!node) return std::nullopt;
  const std::optional<double> value = node->value<double>();
  if (!value || !std::isfinite(*value) || *value <= 0) {
    throw std::invalid_argument(fmt::format("{}.{} must be a positive number", where, key));
  }
  return value;
}

// A count at `key` of `table` (ranks, nodes): a TOML integer from 0 to 2^30, 0 when absent; throws naming `where`
// otherwise. A float is refused rather than converted: toml++ casts one to an integer unchecked (9e91 is undefined
// behaviour, found by fuzz_gpu_profile), and no count of ranks is written as one.
int count(const toml::table& table, const char* key, const std::string& where) {
  const toml::node* node = table.get(key);
  if (!node) return 0;
  const std::optional<std::int64_t> value = node->is_integer() ? node->value<std::int64_t>() : std::nullopt;
  if (!value || *value < 0 || *value > (std::int64_t{1} << 30)) {
    throw std::invalid_argument(fmt::format("{}.{} must be a whole number from 0 to 2^30", where, key));
  }
  return static_cast<int>(*value);
}

void read_gemm(const toml::table& root, const std::string& path, GpuProfile& p) {
  const toml::array* shapes = root["gemm"]["shape"].as_array();
  if (!shapes) return;
  for (std::size_t i = 0; i < shapes->size(); ++i) {
    const std::string where = fmt::format("{}: gemm.shape[{}]", path, i);
    const toml::table* shape = shapes->get(i)->as_table();
    if (!shape) throw std::invalid_argument(where + " must be a table");
    const double rate = positive(*shape, "flops_per_s", where).value_or(0);
    std::array<double, 3> mnk{};
    for (std::size_t d = 0; d < 3; ++d) {
      const char* key = d == 0 ? "m" : d == 1 ? "n" : "k";
      const std::optional<double> value = positive(*shape, key, where);
      if (!value) throw std::invalid_argument(fmt::format("{}.{} must be a positive number", where, key));
      // cuBLAS takes a GEMM's m, n and k as ints (cublasGemmEx): a dimension past that was measured by no GEMM.
      if (*value > std::numeric_limits<int>::max()) {
        throw std::invalid_argument(
            fmt::format("{}.{} = {:g} is past {}, the largest GEMM dimension cuBLAS takes", where, key, *value,
                        std::numeric_limits<int>::max()));
      }
      mnk[d] = *value;
    }
    if (rate > p.gemm_flops_per_s) {  // the fastest measured: what a "large GEMM" measurement is
      p.gemm_flops_per_s = rate;
      p.gemm_shape = mnk;
    }
  }
}

void read_collectives(const toml::table& root, const std::string& path, GpuProfile& p) {
  const toml::array* collectives = root["collective"].as_array();
  if (!collectives) return;
  for (std::size_t i = 0; i < collectives->size(); ++i) {
    const std::string where = fmt::format("{}: collective[{}]", path, i);
    const toml::table* c = collectives->get(i)->as_table();
    if (!c) throw std::invalid_argument(where + " must be a table");
    MeasuredCollective m;
    m.kind = (*c)["kind"].value_or(std::string());
    m.ranks = count(*c, "ranks", where);
    m.nodes = count(*c, "nodes", where);
    if (m.kind.empty() || m.ranks < 2 || m.nodes < 0) {
      throw std::invalid_argument(where + ": kind (a name), ranks (at least 2) and nodes (0: unknown) are required");
    }
    m.bus_bytes_per_s = positive(*c, "bus_bytes_per_s", where).value_or(0);
    if (m.bus_bytes_per_s == 0) throw std::invalid_argument(where + ".bus_bytes_per_s must be a positive number");
    const toml::node* latency = c->get("latency_s");
    m.latency_s = latency ? latency->value<double>().value_or(-1) : 0;
    // NCCL's own model of a ring over thousands of ranks gives tens of milliseconds (src/graph/tuning.cc: a base
    // latency plus one hop's per step); a second is no network's latency but a unit slip (ms, us).
    if (!(m.latency_s >= 0) || !std::isfinite(m.latency_s) || m.latency_s > 1.0) {
      throw std::invalid_argument(where + ".latency_s must be a latency in seconds, from 0 to 1");
    }
    if (const toml::array* sizes = (*c)["size"].as_array()) {
      for (const toml::node& size : *sizes) {
        if (const toml::table* s = size.as_table()) {
          m.largest_bytes = std::max(m.largest_bytes, (*s)["bytes"].value_or(0.0));
        }
      }
    }
    p.collectives.push_back(m);
  }
}

void check_rate(const char* what, double measured, double datasheet, const std::string& path) {
  if (measured > datasheet) {
    throw std::invalid_argument(
        fmt::format("{}: the {} bus bandwidth measured, {:.1f} GB/s, exceeds the link's "
                    "datasheet rate of {:.1f} GB/s; a measured one cannot (is it this "
                    "cluster's profile?)",
                    path, what, measured / 1e9, datasheet / 1e9));
  }
  if (measured < 0.01 * datasheet) {
    throw std::invalid_argument(
        fmt::format("{}: the {} bus bandwidth measured, {:g} bytes/s, is under 1 % of the "
                    "link's {:.1f} GB/s: is it in bytes per second?",
                    path, what, measured, datasheet / 1e9));
  }
}

}  // namespace

GpuProfile read_gpu_profile(const std::string& path) {
  toml::table root;
  try {
    root = toml::parse(model::read_input_file(path, "profile", model::kMaxProfileBytes), path);
  } catch (const toml::parse_error& error) {
    const auto& where = error.source().begin;
    throw std::invalid_argument(fmt::format("{}:{}:{}: {}", path, where.line, where.column, error.description()));
  }
  GpuProfile p;
  p.path = path;
  p.device = root["profile"]["device"].value_or(std::string());
  if (p.device == "cpu") {
    throw std::invalid_argument(
        fmt::format("{}: profile.device is \"cpu\": a CPU host's profile describes a "
                    "cluster.node = \"cpu-host\", not a GPU",
                    path));
  }
  read_gemm(root, path, p);
  if (const toml::table* memory = root["memory"].as_table()) {
    p.hbm_bytes_per_s = positive(*memory, "bytes_per_s", path + ": memory").value_or(0);
  }
  if (const toml::table* attention = root["attention"].as_table()) {
    p.attention_flops_per_s = positive(*attention, "flops_per_s", path + ": attention").value_or(0);
    p.attention_gemm_hbm_fraction = positive(*attention, "gemm_hbm_fraction", path + ": attention").value_or(0);
  }
  read_collectives(root, path, p);
  return p;
}

namespace {

void check_within(const std::string& path, const char* field, double value, double ceiling, const char* ceiling_name,
                  const std::string& gpu) {
  if (value <= 0) return;  // not measured
  if (value > ceiling) {
    throw std::invalid_argument(fmt::format("{}: {} = {:g} exceeds the {}'s {} of {:g}; a measured rate cannot (is it "
                                            "this GPU's profile?)",
                                            path, field, value, gpu, ceiling_name, ceiling));
  }
  if (value < 0.05 * ceiling) {
    throw std::invalid_argument(fmt::format("{}: {} = {:g} is under 5 % of the {}'s {} of {:g}: a unit slip?", path,
                                            field, value, gpu, ceiling_name, ceiling));
  }
}

}  // namespace

void check_against_datasheet(const GpuProfile& p, const GpuSpec& gpu) {
  if (p.gemm_flops_per_s <= 0 && p.hbm_bytes_per_s <= 0 && p.attention_flops_per_s <= 0 &&
      p.attention_gemm_hbm_fraction <= 0 && p.collectives.empty()) {
    throw std::invalid_argument(fmt::format("{}: the profile measures nothing (no [[gemm.shape]], [memory], [attention] "
                                            "or [[collective]]): is it the file twin calibrate wrote?",
                                            p.path));
  }
  // The GEMM measurement is a 16-bit one (twin_gemm_peak, a trace's BF16 GEMMs), bounded as cluster.gemm_tflops is; a
  // fused attention kernel at most the fastest tensor-core peak (FlashAttention-3's FP8 kernels pass the 16-bit one).
  const double tensor_peak = std::max(gpu.bf16_flops, gpu.fp8_flops);
  check_within(p.path, "gemm.shape flops_per_s", p.gemm_flops_per_s, gpu.bf16_flops, "16-bit tensor-core peak FLOP/s",
               gpu.name);
  check_within(p.path, "attention.flops_per_s", p.attention_flops_per_s, tensor_peak, "tensor-core peak FLOP/s",
               gpu.name);
  check_within(p.path, "memory.bytes_per_s", p.hbm_bytes_per_s, gpu.hbm_bytes_per_s, "HBM bytes/s", gpu.name);
  if (p.attention_gemm_hbm_fraction > 1 ||
      (p.attention_gemm_hbm_fraction > 0 && p.attention_gemm_hbm_fraction < 0.05)) {
    throw std::invalid_argument(fmt::format("{}: attention.gemm_hbm_fraction = {:g} must be a fraction of the streaming "
                                            "rate in [0.05, 1]",
                                            p.path, p.attention_gemm_hbm_fraction));
  }
}

const MeasuredCollective* link_measurement(const GpuProfile& profile, bool across_nodes) {
  const MeasuredCollective* best = nullptr;
  for (const MeasuredCollective& c : profile.collectives) {
    if (c.nodes == 0 || (c.nodes > 1) != across_nodes) continue;
    if (!best || c.largest_bytes > best->largest_bytes) best = &c;
  }
  return best;
}

NodeSpec with_measured_links(NodeSpec node, const GpuProfile& profile) {
  if (const MeasuredCollective* within = link_measurement(profile, false)) {
    check_rate("NVLink", within->bus_bytes_per_s, node.nvlink_bytes_per_s, profile.path);
    node.nvlink_effective_bytes_per_s = within->bus_bytes_per_s;
  }
  if (const MeasuredCollective* across = link_measurement(profile, true)) {
    // NCCL's rings across nodes run one channel per NIC in use; the bus bandwidth is the node's ranks' NICs together.
    const double per_node = static_cast<double>(across->ranks) / across->nodes;
    const double per_gpu_datasheet = node.nic_bytes_per_s * node.compute_nics / node.gpus;
    const double per_gpu = across->bus_bytes_per_s / per_node;
    check_rate("network (per GPU)", per_gpu, per_gpu_datasheet, profile.path);
    node.nic_effective_bytes_per_s = per_gpu;
  }
  return node;
}

}  // namespace twin::topology
