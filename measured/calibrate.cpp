#include "measured/calibrate.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include <fmt/format.h>

namespace twin::measured {
namespace {

struct Sample {
  double work, seconds;
};

// `fit` with its residual: the residuals' root mean square relative to the times' (an op of a microsecond does not
// dominate it).
LinearFit residuals_of(LinearFit fit, const std::vector<Sample>& samples) {
  double squares = 0, times = 0;
  for (const Sample& s : samples) {
    squares += (fit.predict_s(s.work) - s.seconds) * (fit.predict_s(s.work) - s.seconds);
    times += s.seconds * s.seconds;
  }
  fit.residual_rms = times > 0 ? std::sqrt(squares / times) : 0;
  return fit;
}

// Least squares of seconds = a + work / rate; a is kept >= 0 (a negative per-op time has no meaning: then the line
// through the origin).
LinearFit fit(const std::vector<Sample>& samples) {
  LinearFit out;
  out.samples = samples.size();
  if (samples.empty()) return out;
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const Sample& s : samples) {
    n += 1;
    sx += s.work;
    sy += s.seconds;
    sxx += s.work * s.work;
    sxy += s.work * s.seconds;
  }
  const double denominator = n * sxx - sx * sx;
  double slope = denominator > 0 ? (n * sxy - sx * sy) / denominator : 0;
  double intercept = (sy - slope * sx) / n;
  if (intercept < 0 || slope <= 0) {
    intercept = 0;
    slope = sxx > 0 ? sxy / sxx : 0;
  }
  out.overhead_s = intercept;
  out.rate_per_s = slope > 0 ? 1 / slope : 0;
  return residuals_of(out, samples);
}

using ShapeKey = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t>;
ShapeKey key_of(const MatmulShape& s) { return {s.m, s.n, s.k, s.batch}; }

bool counted(const TracedKernel& k, const KinetoTrace& trace) { return trace.steps.empty() || k.iteration >= 0; }

bool memory_bound(const TracedKernel& k) {
  return (k.kind.kind == KernelClass::Elementwise || k.kind.kind == KernelClass::Norm) && k.bytes > 0;
}

// The memory-bound classes whose rate is measured kind by kind.
bool streams(KernelClass kind) {
  return kind == KernelClass::Elementwise || kind == KernelClass::Norm || kind == KernelClass::Optimizer ||
         kind == KernelClass::Embedding || kind == KernelClass::Loss;
}

// twin's kind of a kernel of twin's own trace ("forward optimizer_step" -> "optimizer_step"), or "".
std::string twin_kind(const TracedKernel& k) {
  const std::size_t space = k.name.find(' ');
  if (space == std::string::npos) return "";
  const std::string kind = k.name.substr(space + 1);
  for (std::size_t index = 0; index < model::kComputeKindCount; ++index) {
    if (model::to_string(static_cast<model::ComputeKind>(index)) == kind) return kind;
  }
  return "";
}

double iterations_of(const KinetoTrace& trace) {
  return trace.steps.empty() ? 1.0 : static_cast<double>(trace.steps.size());
}

}  // namespace

HardwareProfile calibrate(const std::vector<KinetoTrace>& traces) {
  if (traces.empty()) throw MeasuredError("calibrate: no trace given");
  HardwareProfile profile;
  profile.device = traces.front().device;
  std::vector<Sample> gemms, memory;
  std::map<ShapeKey, std::vector<double>> by_shape;  // each call's seconds
  std::map<KernelClass, std::pair<double, double>> by_class;  // bytes, seconds (PyTorch's operators)
  std::map<std::string, std::pair<double, double>> by_kind;   // bytes, seconds (twin's own ops)
  double between_s = 0, operators = 0;
  for (const KinetoTrace& trace : traces) {
    profile.sources.push_back(trace.path);
    if (trace.device != profile.device) {
      throw MeasuredError(fmt::format("calibrate: '{}' ran on '{}' but '{}' on '{}': one profile is one device kind",
                                      traces.front().path, profile.device, trace.path, trace.device));
    }
    double busy = 0, ops = 0;
    for (const TracedKernel& k : trace.kernels) {
      if (!counted(k, trace)) continue;
      busy += k.duration_s;
      ops += 1;
      if (k.kind.kind == KernelClass::Gemm && k.flops > 0 && k.duration_s > 0) {
        gemms.push_back({k.flops, k.duration_s});
        if (k.shape.batch > 0) by_shape[key_of(k.shape)].push_back(k.duration_s);
      } else if (!trace.gpu && memory_bound(k)) {
        memory.push_back({k.bytes, k.duration_s});
      }
      if (!trace.gpu && k.bytes > 0 && streams(k.kind.kind)) {
        const std::string kind = twin_kind(k);
        auto& [bytes, seconds] = kind.empty() ? by_class[k.kind.kind] : by_kind[kind];
        bytes += k.bytes;
        seconds += k.duration_s;
      }
    }
    if (!trace.gpu && !trace.steps.empty()) {
      double steps_s = 0;
      for (const ProfilerStep& step : trace.steps) steps_s += step.duration_s;
      between_s += std::max(0.0, steps_s - busy);
      operators += ops;
    }
  }
  if (gemms.empty()) {
    throw MeasuredError(
        "calibrate: no GEMM with a recorded shape or FLOP count in the traces (profile with record_shapes=True)");
  }
  profile.gemm = fit(gemms);
  if (by_shape.empty()) {
    // No shapes (twin's own traces give each GEMM op's FLOPs, not its shape): the rate is the median of the ops'
    // rates, which one op that other work on the machine delayed does not move, as it moves a least-squares line.
    std::vector<double> rates;
    for (const Sample& g : gemms) rates.push_back(g.work / g.seconds);
    std::sort(rates.begin(), rates.end());
    const std::size_t half = rates.size() / 2;
    const double median = rates.size() % 2 ? rates[half] : (rates[half - 1] + rates[half]) / 2;
    profile.gemm = residuals_of({0, median, 0, gemms.size()}, gemms);
  }
  // Each shape at the median of its calls' times: one call that other work on the machine delayed does not move it.
  for (auto& [key, seconds] : by_shape) {
    const auto& [m, n, k, batch] = key;
    std::sort(seconds.begin(), seconds.end());
    const std::size_t half = seconds.size() / 2;
    const double median = seconds.size() % 2 ? seconds[half] : (seconds[half - 1] + seconds[half]) / 2;
    const MatmulShape shape{m, n, k, batch};
    profile.gemm_shapes.push_back({shape, shape.flops() / median, seconds.size()});
  }
  std::sort(profile.gemm_shapes.begin(), profile.gemm_shapes.end(),
            [](const ShapeRate& a, const ShapeRate& b) { return a.shape.flops() > b.shape.flops(); });
  profile.memory = fit(memory);
  for (std::size_t index = 0; index < model::kComputeKindCount; ++index) {
    const auto kind = static_cast<model::ComputeKind>(index);
    const auto cls = class_of(kind);
    if (!cls) continue;
    if (const auto it = by_class.find(*cls); it != by_class.end() && it->second.second > 0) {
      profile.memory_bytes_per_s_by_kind[std::string(model::to_string(kind))] = it->second.first / it->second.second;
    }
  }
  for (const auto& [kind, totals] : by_kind) {
    if (totals.second > 0) profile.memory_bytes_per_s_by_kind[kind] = totals.first / totals.second;
  }
  profile.host_s_per_operator = operators > 0 ? between_s / operators : 0;
  return profile;
}

OutOfSample check_profile(const HardwareProfile& profile, const KinetoTrace& trace) {
  // As the simulator times them (topology::HostProfile::gemm_time_s): at the nearest measured shape's rate.
  auto rate_of = [&profile](const MatmulShape& shape) {
    const ShapeRate* nearest = nullptr;
    double best = 0;
    for (const ShapeRate& s : profile.gemm_shapes) {
      const double distance = std::abs(std::log(static_cast<double>(s.shape.m) / static_cast<double>(shape.m))) +
                              std::abs(std::log(static_cast<double>(s.shape.n) / static_cast<double>(shape.n))) +
                              std::abs(std::log(static_cast<double>(s.shape.k) / static_cast<double>(shape.k)));
      if (!nearest || distance < best) {
        nearest = &s;
        best = distance;
      }
    }
    return nearest ? nearest->flops_per_s : 0.0;
  };
  OutOfSample out;
  out.path = trace.path;
  const double n = iterations_of(trace);
  for (const TracedKernel& k : trace.kernels) {
    if (!counted(k, trace)) continue;
    if (k.kind.kind == KernelClass::Gemm && k.flops > 0) {
      const double rate = k.shape.batch > 0 ? rate_of(k.shape) : 0;
      out.gemm_predicted_s += (rate > 0 ? k.flops / rate : profile.gemm.predict_s(k.flops)) / n;
      out.gemm_measured_s += k.duration_s / n;
    } else if (!trace.gpu && memory_bound(k) && profile.memory.samples > 0) {
      out.memory_predicted_s += profile.memory.predict_s(k.bytes) / n;
      out.memory_measured_s += k.duration_s / n;
    }
  }
  return out;
}

std::string profile_to_toml(const HardwareProfile& p) {
  std::string out;
  auto line = std::back_inserter(out);
  fmt::format_to(line, "# A hardware profile fitted by `twin calibrate` from {} trace(s); a fit's residual is the root "
                 "mean square of its ops' errors over that of their times.\n", p.sources.size());
  fmt::format_to(line, "[profile]\ndevice = \"{}\"\nsources = [", p.device);
  for (std::size_t i = 0; i < p.sources.size(); ++i) fmt::format_to(line, "{}\"{}\"", i ? ", " : "", p.sources[i]);
  out += "]\n\n";
  fmt::format_to(line, "[gemm]\nflops_per_s = {:.6e}\noverhead_s = {:.6e}\nresidual_rms = {:.4f}\nsamples = {}\n\n",
                 p.gemm.rate_per_s, p.gemm.overhead_s, p.gemm.residual_rms, p.gemm.samples);
  for (const ShapeRate& s : p.gemm_shapes) {
    fmt::format_to(line, "[[gemm.shape]]\nm = {}\nn = {}\nk = {}\nbatch = {}\nflops_per_s = {:.6e}\ncalls = {}\n\n",
                   s.shape.m, s.shape.n, s.shape.k, s.shape.batch, s.flops_per_s, s.calls);
  }
  if (p.memory.samples > 0) {
    fmt::format_to(line, "[memory]\nbytes_per_s = {:.6e}\noverhead_s = {:.6e}\nresidual_rms = {:.4f}\nsamples = {}\n\n",
                   p.memory.rate_per_s, p.memory.overhead_s, p.memory.residual_rms, p.memory.samples);
    fmt::format_to(line, "[host]\nseconds_per_operator = {:.6e}\n\n", p.host_s_per_operator);
  }
  if (!p.memory_bytes_per_s_by_kind.empty()) {
    out += "[memory.kind]  # bytes per second each memory-bound kind of the Program streams at\n";
    for (const auto& [kind, rate] : p.memory_bytes_per_s_by_kind) fmt::format_to(line, "{} = {:.6e}\n", kind, rate);
    out += "\n";
  }
  for (const OutOfSample& c : p.checks) {
    fmt::format_to(line,
                   "[[check]]  # another plan's trace, timed by this profile: the out-of-sample error\ntrace = \"{}\"\n"
                   "gemm_predicted_s = {:.6e}\ngemm_measured_s = {:.6e}\nmemory_predicted_s = {:.6e}\n"
                   "memory_measured_s = {:.6e}\n\n",
                   c.path, c.gemm_predicted_s, c.gemm_measured_s, c.memory_predicted_s, c.memory_measured_s);
  }
  return out;
}

std::string profile_table(const HardwareProfile& p) {
  std::string out;
  auto line = std::back_inserter(out);
  fmt::format_to(line, "profile of {} from {} trace(s)\n", p.device.empty() ? "an unnamed device" : p.device,
                 p.sources.size());
  fmt::format_to(line, "  GEMM    {:.3f} GFLOP/s + {:.1f} us per call over {} calls (fit residual {:.1f} %), {} shapes\n",
                 p.gemm.rate_per_s / 1e9, p.gemm.overhead_s * 1e6, p.gemm.samples, 100 * p.gemm.residual_rms,
                 p.gemm_shapes.size());
  if (p.memory.samples > 0) {
    fmt::format_to(line, "  memory  {:.3f} GB/s + {:.1f} us per operator over {} operators (fit residual {:.1f} %)\n",
                   p.memory.rate_per_s / 1e9, p.memory.overhead_s * 1e6, p.memory.samples,
                   100 * p.memory.residual_rms);
    fmt::format_to(line, "  host    {:.1f} us between operators, per operator\n", p.host_s_per_operator * 1e6);
  }
  auto error = [](double predicted, double measured) { return measured > 0 ? 100 * (predicted / measured - 1) : 0.0; };
  for (const OutOfSample& c : p.checks) {
    fmt::format_to(line, "  out of sample, {}: GEMMs {:.4f} s predicted, {:.4f} s measured ({:+.1f} %)", c.path,
                   c.gemm_predicted_s, c.gemm_measured_s, error(c.gemm_predicted_s, c.gemm_measured_s));
    if (c.memory_measured_s > 0) {
      fmt::format_to(line, "; memory-bound {:.4f} s predicted, {:.4f} s measured ({:+.1f} %)", c.memory_predicted_s,
                     c.memory_measured_s, error(c.memory_predicted_s, c.memory_measured_s));
    }
    out += "\n";
  }
  return out;
}

}  // namespace twin::measured
