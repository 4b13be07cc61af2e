#include "measured/microbenchmarks.hpp"

#include <algorithm>
#include <map>
#include <regex>
#include <sstream>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

namespace twin::measured {
namespace {

using nlohmann::json;

// The kinds of twin's Program each memory-bound benchmark of bench/kernels_cpu_bench.cpp times (by its function).
const std::map<std::string, std::vector<model::ComputeKind>>& memory_benchmark_kinds() {
  using K = model::ComputeKind;
  static const std::map<std::string, std::vector<K>> kKinds = {
      {"BM_LayerNormForward", {K::LayerNormAttention, K::LayerNormMlp, K::FinalLayerNorm}},
      {"BM_LayerNormBackward", {K::LayerNormAttention, K::LayerNormMlp, K::FinalLayerNorm}},
      {"BM_GeluForward", {K::Gelu}},
      {"BM_GeluBackward", {K::Gelu}},
      {"BM_ResidualForward", {K::AttentionResidual, K::MlpResidual}},
      {"BM_AdamW", {K::OptimizerStep}},
      {"BM_EmbeddingForwardBackward", {K::Embedding}},
      {"BM_CrossEntropy", {K::CrossEntropy}},
  };
  return kKinds;
}

double seconds_per_unit(const std::string& unit) {
  if (unit == "ns") return 1e-9;
  if (unit == "us") return 1e-6;
  if (unit == "ms") return 1e-3;
  if (unit == "s") return 1;
  return 0;
}

double counter(const json& benchmark, const char* key) {
  const auto it = benchmark.find(key);
  return it != benchmark.end() && it->is_number() ? it->get<double>() : 0;
}

}  // namespace

SourceKind source_kind(const std::string& text) {
  const std::size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return SourceKind::ProfilerTrace;  // the trace reader names what is wrong with it
  // Google Benchmark's JSON opens with its "context" object; a Chrome trace never has one.
  const std::size_t context = text.find("\"context\"");
  if (text[first] == '{' && context != std::string::npos && text.find_first_not_of(" \t\r\n{", first) == context) {
    return SourceKind::GoogleBenchmark;
  }
  if (text.compare(first, 7, "device ") == 0 || text.compare(first, 5, "gemm ") == 0) return SourceKind::GemmPeak;
  return SourceKind::ProfilerTrace;
}

namespace {

// The linear fits of each kind's samples, and the measured GEMM shapes largest first (both readers end so).
void fit_rates(HardwareProfile& profile, const std::vector<WorkSample>& gemms, const std::vector<WorkSample>& memory,
               const std::vector<WorkSample>& attention) {
  profile.gemm = fit_linear(gemms);
  std::sort(profile.gemm_shapes.begin(), profile.gemm_shapes.end(),
            [](const ShapeRate& a, const ShapeRate& b) { return a.shape.flops() > b.shape.flops(); });
  profile.memory = fit_linear(memory);
  profile.attention = fit_linear(attention);
}

}  // namespace

HardwareProfile profile_from_gemm_peak(const std::string& path, const std::string& text) {
  static const std::regex device(R"(^device (.+), \d+ SMs, [\d.]+ MiB$)");
  static const std::regex gemm(
      R"(^gemm \S+ m (\d+) n (\d+) k (\d+): median ([\d.]+) ms \(min [\d.]+\), [\d.]+ TFLOP/s$)");
  static const std::regex hbm(R"(^hbm scale \S+ (\d+) MiB in place: median ([\d.]+) ms, [\d.]+ GB/s read \+ write$)");
  static const std::regex fraction(R"(^attention_gemm_hbm_fraction ([\d.]+)$)");
  static const std::regex flash(R"(^flash attention \S+ (causal|full), (\d+) x (\d+) heads of (\d+), seq (\d+): )"
                                R"(forward median ([\d.]+) ms [\d.]+ TFLOP/s, backward ([\d.]+) ms [\d.]+ TFLOP/s$)");
  HardwareProfile profile;
  profile.sources.push_back(path);
  std::vector<WorkSample> gemms, memory, attention;
  std::istringstream lines(text);
  std::smatch m;
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (std::regex_match(line, m, device)) {
      profile.device = m[1];
    } else if (std::regex_match(line, m, gemm)) {
      const MatmulShape shape{std::stoll(m[1]), std::stoll(m[2]), std::stoll(m[3]), 1};
      const double seconds = std::stod(m[4]) * 1e-3;
      gemms.push_back({shape.flops(), seconds});
      profile.gemm_shapes.push_back({shape, shape.flops() / seconds, 20});  // the median of 20 timed runs
    } else if (std::regex_match(line, m, hbm)) {
      memory.push_back({2 * std::stod(m[1]) * 1048576.0, std::stod(m[2]) * 1e-3});  // read and written
    } else if (std::regex_match(line, m, fraction)) {
      profile.attention_gemm_hbm_fraction = std::min(1.0, std::stod(m[1]));
    } else if (std::regex_match(line, m, flash)) {
      // Forward 4 b h s^2 d FLOPs, half under the causal mask; backward 2.5 times the forward.
      const double b = std::stod(m[2]), h = std::stod(m[3]), d = std::stod(m[4]), s = std::stod(m[5]);
      const double forward = 4 * b * h * s * s * d * (m[1] == "causal" ? 0.5 : 1.0);
      attention.push_back({forward, std::stod(m[6]) * 1e-3});
      attention.push_back({2.5 * forward, std::stod(m[7]) * 1e-3});
    }
  }
  if (gemms.empty() && memory.empty() && attention.empty()) {
    throw MeasuredError(
        fmt::format("'{}': no measurement in twin_gemm_peak's format (\"gemm bf16 m M n N k K: median "
                    "T ms ...\", \"hbm scale ...\", \"flash attention ...\")",
                    path));
  }
  fit_rates(profile, gemms, memory, attention);
  return profile;
}

HardwareProfile profile_from_google_benchmark(const std::string& path, const std::string& text) {
  json document;
  try {
    document = json::parse(text);
  } catch (const json::parse_error& error) {
    throw MeasuredError(fmt::format("'{}' is not valid JSON: {}", path, error.what()));
  }
  if (!document.is_object() || !document.contains("benchmarks") || !document["benchmarks"].is_array()) {
    throw MeasuredError(fmt::format("'{}': not Google Benchmark's JSON (no \"benchmarks\" array)", path));
  }
  HardwareProfile profile;
  profile.device = "cpu";
  profile.sources.push_back(path);
  std::vector<WorkSample> gemms, memory, attention;
  std::map<model::ComputeKind, std::pair<double, double>> by_kind;  // bytes, seconds
  for (const json& b : document["benchmarks"]) {
    if (!b.is_object() || b.value("run_type", std::string("iteration")) != "iteration") continue;
    const std::string name = b.value("name", std::string());
    const std::string function = name.substr(0, name.find('/'));
    const double seconds = counter(b, "real_time") * seconds_per_unit(b.value("time_unit", std::string("ns")));
    if (seconds <= 0) continue;
    const double m = counter(b, "m"), n = counter(b, "n"), k = counter(b, "k");
    if (m > 0 && n > 0 && k > 0) {
      if (counter(b, "blas_threads") > 1) continue;
      const MatmulShape shape{static_cast<std::int64_t>(m), static_cast<std::int64_t>(n), static_cast<std::int64_t>(k),
                              1};
      gemms.push_back({shape.flops(), seconds});
      profile.gemm_shapes.push_back({shape, shape.flops() / seconds, 1});
    } else if (function.rfind("BM_Attention", 0) == 0 && counter(b, "FLOP/s") > 0) {
      attention.push_back({counter(b, "FLOP/s") * seconds, seconds});
    } else if (const auto kinds = memory_benchmark_kinds().find(function);
               kinds != memory_benchmark_kinds().end() && counter(b, "bytes_per_second") > 0) {
      const double bytes = counter(b, "bytes_per_second") * seconds;
      memory.push_back({bytes, seconds});
      for (model::ComputeKind kind : kinds->second) {
        by_kind[kind].first += bytes;
        by_kind[kind].second += seconds;
      }
    }
  }
  if (gemms.empty()) {
    throw MeasuredError(
        fmt::format("'{}': no GEMM benchmark with its shape (counters m, n, k: "
                    "bench/kernels_cpu_bench.cpp) at one BLAS thread",
                    path));
  }
  fit_rates(profile, gemms, memory, attention);
  for (const auto& [kind, totals] : by_kind) {
    profile.memory_bytes_per_s_by_kind[std::string(model::to_string(kind))] = totals.first / totals.second;
  }
  return profile;
}

}  // namespace twin::measured
