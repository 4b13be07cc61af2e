// A hardware profile as the TOML file `twin calibrate --out` writes and as the table it prints.
#include <iterator>
#include <string>
#include <tuple>

#include <fmt/format.h>

#include "measured/calibrate.hpp"

namespace twin::measured {
namespace {

double error_percent(double predicted, double measured) {
  return measured > 0 ? 100 * (predicted / measured - 1) : 0;
}

void fit_lines(std::string& out, const LinearFit& fit, const char* rate_key) {
  fmt::format_to(std::back_inserter(out), "{} = {:.6e}\noverhead_s = {:.6e}\nresidual_rms = {:.4f}\nsamples = {}\n",
                 rate_key, fit.rate_per_s, fit.overhead_s, fit.residual_rms, fit.samples);
}

void collectives_toml(std::string& out, const HardwareProfile& p) {
  auto line = std::back_inserter(out);
  for (const CollectiveFit& c : p.collectives) {
    fmt::format_to(line,
                   "[[collective]]  # time = latency_s + size x bus factor / bus_bytes_per_s (nccl-tests' bus "
                   "bandwidth)\nkind = \"{}\"\nranks = {}\nnodes = {}\nlatency_s = {:.6e}\nbus_bytes_per_s = {:.6e}\n"
                   "residual_rms = {:.4f}\nsamples = {}\n\n",
                   to_string(c.kind), c.ranks, c.nodes, c.fit.overhead_s, c.fit.rate_per_s, c.fit.residual_rms,
                   c.fit.samples);
    for (const MessageRate& size : c.sizes) {
      fmt::format_to(line, "[[collective.size]]\nbytes = {:.0f}\nbus_bytes_per_s = {:.6e}\ncalls = {}\n\n", size.bytes,
                     size.bus_bytes_per_s, size.calls);
    }
  }
}

}  // namespace

std::string profile_to_toml(const HardwareProfile& p) {
  std::string out;
  auto line = std::back_inserter(out);
  fmt::format_to(line,
                 "# A hardware profile fitted by `twin calibrate` from {} source(s); a fit's residual is the root "
                 "mean square of its ops' errors over that of their times.\n",
                 p.sources.size());
  fmt::format_to(line, "[profile]\ndevice = \"{}\"\nsources = [", p.device);
  for (std::size_t i = 0; i < p.sources.size(); ++i) fmt::format_to(line, "{}\"{}\"", i ? ", " : "", p.sources[i]);
  out += "]\n\n";
  if (p.gemm.samples > 0) {
    out += "[gemm]\n";
    fit_lines(out, p.gemm, "flops_per_s");
    out += "\n";
  }
  for (const ShapeRate& s : p.gemm_shapes) {
    fmt::format_to(line, "[[gemm.shape]]\nm = {}\nn = {}\nk = {}\nbatch = {}\nflops_per_s = {:.6e}\ncalls = {}\n\n",
                   s.shape.m, s.shape.n, s.shape.k, s.shape.batch, s.flops_per_s, s.calls);
  }
  if (p.memory.samples > 0) {
    out += "[memory]\n";
    fit_lines(out, p.memory, "bytes_per_s");
    out += "\n";
  }
  if (p.device == "cpu") {
    fmt::format_to(
        line, "[host]{}\nseconds_per_operator = {:.6e}\n\n",
        p.host_per_program_kernel ? "  # the time no op of the Program stands for, per kernel it launches" : "",
        p.host_s_per_operator);
  }
  if (!p.memory_bytes_per_s_by_kind.empty()) {
    out += "[memory.kind]  # bytes per second each memory-bound kind of the Program streams at\n";
    for (const auto& [kind, rate] : p.memory_bytes_per_s_by_kind) fmt::format_to(line, "{} = {:.6e}\n", kind, rate);
    out += "\n";
  }
  if (p.attention.samples > 0 || p.attention_gemm_hbm_fraction > 0) {
    out += "[attention]  # fused attention: FLOPs as the cost model counts them (causal half, backward 2.5x)\n";
    if (p.attention.samples > 0) fit_lines(out, p.attention, "flops_per_s");
    if (p.attention_gemm_hbm_fraction > 0) {
      fmt::format_to(line, "gemm_hbm_fraction = {:.4f}\n", p.attention_gemm_hbm_fraction);
    }
    out += "\n";
  }
  collectives_toml(out, p);
  for (const OutOfSample& c : p.checks) {
    fmt::format_to(line,
                   "[[check]]  # another plan's trace, timed by this profile: the out-of-sample error\ntrace = \"{}\"\n"
                   "gemm_predicted_s = {:.6e}\ngemm_measured_s = {:.6e}\nmemory_predicted_s = {:.6e}\n"
                   "memory_measured_s = {:.6e}\nattention_predicted_s = {:.6e}\nattention_measured_s = {:.6e}\n"
                   "collective_predicted_s = {:.6e}\ncollective_measured_s = {:.6e}\n\n",
                   c.path, c.gemm_predicted_s, c.gemm_measured_s, c.memory_predicted_s, c.memory_measured_s,
                   c.attention_predicted_s, c.attention_measured_s, c.collective_predicted_s, c.collective_measured_s);
  }
  return out;
}

std::string profile_table(const HardwareProfile& p) {
  std::string out;
  auto line = std::back_inserter(out);
  fmt::format_to(line, "profile of {} from {} source(s)\n", p.device.empty() ? "an unnamed device" : p.device,
                 p.sources.size());
  if (p.gemm.samples > 0) {
    fmt::format_to(line,
                   "  GEMM       {:.3f} GFLOP/s + {:.1f} us per call over {} calls (fit residual {:.1f} %), {} "
                   "shapes\n",
                   p.gemm.rate_per_s / 1e9, p.gemm.overhead_s * 1e6, p.gemm.samples, 100 * p.gemm.residual_rms,
                   p.gemm_shapes.size());
  }
  if (p.memory.samples > 0) {
    fmt::format_to(line, "  memory     {:.3f} GB/s + {:.1f} us per {} over {} (fit residual {:.1f} %)\n",
                   p.memory.rate_per_s / 1e9, p.memory.overhead_s * 1e6, p.device == "cpu" ? "operator" : "kernel",
                   p.memory.samples, 100 * p.memory.residual_rms);
  }
  if (p.device == "cpu") {
    fmt::format_to(line, "  host       {:.1f} us {}\n", p.host_s_per_operator * 1e6,
                   p.host_per_program_kernel ? "outside the Program's ops, per kernel it launches (--scenario)"
                                             : "between operators, per operator");
  }
  if (p.attention.samples > 0) {
    fmt::format_to(line, "  attention  {:.3f} TFLOP/s + {:.1f} us per kernel over {} kernels (fit residual {:.1f} %)\n",
                   p.attention.rate_per_s / 1e12, p.attention.overhead_s * 1e6, p.attention.samples,
                   100 * p.attention.residual_rms);
  }
  if (p.attention_gemm_hbm_fraction > 0) {
    fmt::format_to(line, "  attention  GEMMs at {:.2f} of the streaming rate\n", p.attention_gemm_hbm_fraction);
  }
  for (const CollectiveFit& c : p.collectives) {
    fmt::format_to(line,
                   "  {:<10} {} ranks on {} node(s): {:.1f} GB/s bus bandwidth + {:.1f} us latency over {} calls "
                   "(fit residual {:.1f} %); by size:",
                   to_string(c.kind), c.ranks, c.nodes == 0 ? "?" : std::to_string(c.nodes), c.fit.rate_per_s / 1e9,
                   c.fit.overhead_s * 1e6, c.fit.samples, 100 * c.fit.residual_rms);
    for (const MessageRate& size : c.sizes) {
      fmt::format_to(line, " {:.3g} MB {:.1f} GB/s", size.bytes / 1e6, size.bus_bytes_per_s / 1e9);
    }
    out += "\n";
  }
  for (const OutOfSample& c : p.checks) {
    fmt::format_to(line, "  out of sample, {}:", c.path);
    const char* separator = "";
    for (const auto& [name, predicted, measured] :
         {std::tuple{"GEMMs", c.gemm_predicted_s, c.gemm_measured_s},
          {"memory-bound", c.memory_predicted_s, c.memory_measured_s},
          {"attention", c.attention_predicted_s, c.attention_measured_s},
          {"collectives", c.collective_predicted_s, c.collective_measured_s}}) {
      if (measured <= 0) continue;
      fmt::format_to(line, "{} {} {:.4f} s predicted, {:.4f} s measured ({:+.1f} %)", separator, name, predicted,
                     measured, error_percent(predicted, measured));
      separator = ";";
    }
    out += "\n";
  }
  return out;
}

}  // namespace twin::measured
