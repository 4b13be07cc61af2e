#include "measured/calibrate.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include <fmt/format.h>

namespace twin::measured {
namespace {

// `fit` with its residual: the residuals' root mean square relative to the times' (an op of a microsecond does not
// dominate it).
LinearFit residuals_of(LinearFit fit, const std::vector<WorkSample>& samples) {
  double squares = 0, times = 0;
  for (const WorkSample& s : samples) {
    squares += (fit.predict_s(s.work) - s.seconds) * (fit.predict_s(s.work) - s.seconds);
    times += s.seconds * s.seconds;
  }
  fit.residual_rms = times > 0 ? std::sqrt(squares / times) : 0;
  return fit;
}

using ShapeKey = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t>;
ShapeKey key_of(const MatmulShape& s) {
  return {s.m, s.n, s.k, s.batch};
}

bool counted(const TracedKernel& k, const KinetoTrace& trace) {
  return trace.steps.empty() || k.iteration >= 0;
}

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

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const std::size_t half = values.size() / 2;
  return values.size() % 2 ? values[half] : (values[half - 1] + values[half]) / 2;
}

// A collective's kind, group size and span: what one bus bandwidth is measured for.
using CollectiveKey = std::tuple<CommKind, int, int>;

struct CollectiveSample {
  double bytes, bus_bytes, seconds;
};

// What the traces of one plan hold, gathered for the fits.
struct Gathered {
  std::vector<WorkSample> gemms, memory, attention;
  std::map<ShapeKey, std::vector<double>> gemm_seconds_by_shape;
  std::map<CollectiveKey, std::vector<CollectiveSample>> collectives;
  // CPU runs, per profiled step: each memory-bound class's (PyTorch) or kind's (twin's own trace) rate, and the time
  // between operators per operator. Medians over the steps are the profile's: a step other work on the machine
  // delayed moves a median less than a sum.
  std::map<KernelClass, std::vector<double>> class_rates;
  std::map<std::string, std::vector<double>> kind_rates;
  std::vector<std::pair<std::string, double>> twin_gemm_ops;  // twin's own GEMM ops: class, seconds
  std::vector<double> between_per_operator_s;
  // A PyTorch CPU run, per profiled step: each class's time, the GEMMs' with a recorded shape, the step's.
  struct Step {
    std::map<KernelClass, double> class_s;
    double shaped_gemm_s = 0, step_s = 0;
  };
  std::vector<Step> torch_steps;
  // Every CPU step's time outside the classes the Program has ops for (gaps between operators included).
  std::vector<double> outside_program_s;
};

// One CPU step's streaming rates and time between operators.
void gather_cpu_step(const KinetoTrace& trace, int step, Gathered& g) {
  std::map<KernelClass, std::pair<double, double>> by_class;  // bytes, seconds
  std::map<std::string, std::pair<double, double>> by_kind;
  double busy = 0, operators = 0;
  Gathered::Step step_totals;
  bool twin_trace = false;
  for (const TracedKernel& k : trace.kernels) {
    if (!trace.steps.empty() && k.iteration != step) continue;
    busy += k.duration_s;
    operators += 1;
    step_totals.class_s[k.kind.kind] += k.duration_s;
    if (k.kind.kind == KernelClass::Gemm && k.flops > 0 && k.shape.batch > 0) step_totals.shaped_gemm_s += k.duration_s;
    twin_trace = twin_trace || !twin_kind(k).empty();
    if (k.bytes <= 0 || !streams(k.kind.kind)) continue;
    const std::string kind = twin_kind(k);
    auto& [bytes, seconds] = kind.empty() ? by_class[k.kind.kind] : by_kind[kind];
    bytes += k.bytes;
    seconds += k.duration_s;
  }
  for (const auto& [cls, totals] : by_class) {
    if (totals.second > 0) g.class_rates[cls].push_back(totals.first / totals.second);
  }
  for (const auto& [kind, totals] : by_kind) {
    if (totals.second > 0) g.kind_rates[kind].push_back(totals.first / totals.second);
  }
  if (!trace.steps.empty() && operators > 0) {
    const double step_s = trace.steps[static_cast<std::size_t>(step)].duration_s;
    g.between_per_operator_s.push_back(std::max(0.0, step_s - busy) / operators);
    step_totals.step_s = step_s;
    double modelled = 0;
    for (const auto& [cls, seconds] : step_totals.class_s) modelled += modelled_by_twin(cls) ? seconds : 0;
    g.outside_program_s.push_back(std::max(0.0, step_s - modelled));
    if (!twin_trace) g.torch_steps.push_back(std::move(step_totals));
  }
}

// The Program's compute kinds (their names, as [memory.kind] keys them) that fall in kernel class `cls` (class_of).
std::vector<std::string> kinds_of_class(KernelClass cls) {
  std::vector<std::string> kinds;
  for (std::size_t index = 0; index < model::kComputeKindCount; ++index) {
    const auto kind = static_cast<model::ComputeKind>(index);
    if (class_of(kind) == cls) kinds.emplace_back(model::to_string(kind));
  }
  return kinds;
}

// A CPU run's rates per unit of the Program's work (CalibrateOptions::program): a PyTorch run's memory-bound classes,
// each class's measured time (its operators', beyond the GEMMs timed by shape) per byte the Program streams for that
// class, every kind of the class at that rate; and any CPU run's time outside every class the Program has ops for
// (copies, reductions, unclassified operators, the gaps between operators) per kernel the Program launches. Each a
// median over the profiled steps. In sample the simulator then sums to the measured step; out of sample it is right as
// far as the Program's bytes and kernels grow with the plan as the framework's time does.
void per_program_work(const Gathered& g, const ProgramWork& work, HardwareProfile& profile) {
  for (const auto& [cls, bytes] : work.stream_bytes) {
    if (g.torch_steps.empty()) break;
    std::vector<double> seconds;
    for (const Gathered::Step& step : g.torch_steps) {
      const auto it = step.class_s.find(cls);
      const double own = it == step.class_s.end() ? 0 : it->second;
      seconds.push_back(own - (cls == KernelClass::Gemm ? step.shaped_gemm_s : 0));
    }
    const double time_s = median(seconds);
    if (!(bytes > 0) || !(time_s > 0)) continue;
    for (const std::string& kind : kinds_of_class(cls)) profile.memory_bytes_per_s_by_kind[kind] = bytes / time_s;
  }
  if (!(work.kernel_launches > 0) || g.outside_program_s.empty()) return;
  // The simulator charges every launch the memory fit's overhead too.
  profile.host_s_per_operator =
      std::max(0.0, median(g.outside_program_s) / work.kernel_launches - profile.memory.overhead_s);
  profile.host_per_program_kernel = true;
}

// A GEMM op of twin's own trace, kept for its shape (CalibrateOptions::program): its class and time.
bool gather_twin_gemm(const TracedKernel& k, const CalibrateOptions& options, Gathered& g) {
  if (!options.program || twin_kind(k).empty() || !options.program->gemm_shape_by_op_class.contains(k.name)) {
    return false;
  }
  g.twin_gemm_ops.emplace_back(k.name, k.duration_s);
  return true;
}

// twin's own GEMM ops by the shape their Program gives their class: forward the op's GEMM [m, k] x [k, n]; backward
// its input gradient [m, n] x [n, k] and weight gradient [k, m] x [m, n], the same FLOPs each, half the op's GEMM time
// each (as the simulator times a backward op: the two GEMMs at their shapes' rates). The op's passes beyond its GEMMs
// (a bias gradient's sum) take their bytes at `pass_bytes_per_s` first, the rate the simulator times them by.
void shape_twin_gemms(const Gathered& g, const ProgramWork& work, double pass_bytes_per_s,
                      std::map<ShapeKey, std::vector<double>>& seconds_by_shape) {
  for (const auto& [op_class, duration_s] : g.twin_gemm_ops) {
    const model::GemmShape& s = work.gemm_shape_by_op_class.at(op_class);
    const auto pass = work.gemm_pass_bytes_by_op_class.find(op_class);
    const double pass_s =
        pass != work.gemm_pass_bytes_by_op_class.end() && pass_bytes_per_s > 0 ? pass->second / pass_bytes_per_s : 0;
    const double gemm_s = duration_s - pass_s;
    if (!(gemm_s > 0)) continue;
    if (op_class.rfind("backward", 0) != 0) {
      seconds_by_shape[{s.m, s.n, s.k, s.count}].push_back(gemm_s);
    } else {
      seconds_by_shape[{s.m, s.k, s.n, s.count}].push_back(gemm_s / 2);
      seconds_by_shape[{s.k, s.n, s.m, s.count}].push_back(gemm_s / 2);
    }
  }
}

void gather(const KinetoTrace& trace, const CalibrateOptions& options, Gathered& g) {
  for (const TracedKernel& k : trace.kernels) {
    if (!counted(k, trace)) continue;
    if (k.kind.kind == KernelClass::Gemm && k.flops > 0 && k.duration_s > 0) {
      g.gemms.push_back({k.flops, k.duration_s});
      if (k.shape.batch > 0) {
        g.gemm_seconds_by_shape[key_of(k.shape)].push_back(k.duration_s);
      } else {
        gather_twin_gemm(k, options, g);
      }
    } else if (memory_bound(k)) {
      g.memory.push_back({k.bytes, k.duration_s});
    } else if (k.kind.kind == KernelClass::Attention && k.flops > 0) {
      g.attention.push_back({k.flops, k.duration_s});
    } else if (k.kind.kind == KernelClass::Communication && k.collective.bytes > 0 && k.collective.group_size > 1) {
      const CollectiveKey key{k.kind.comm, k.collective.group_size, nodes_spanned(k.collective, options.gpus_per_node)};
      g.collectives[key].push_back(
          {k.collective.bytes, k.collective.bytes * bus_factor(k.kind.comm, k.collective.group_size), k.duration_s});
    }
  }
  if (trace.gpu) return;
  for (std::size_t step = 0; step < std::max<std::size_t>(1, trace.steps.size()); ++step) {
    gather_cpu_step(trace, static_cast<int>(step), g);
  }
}

CollectiveFit collective_fit(const CollectiveKey& key, const std::vector<CollectiveSample>& samples) {
  CollectiveFit out;
  std::tie(out.kind, out.ranks, out.nodes) = key;
  std::vector<WorkSample> fitted;
  std::map<double, std::vector<double>> seconds_by_size;
  for (const CollectiveSample& c : samples) {
    fitted.push_back({c.bus_bytes, c.seconds});
    seconds_by_size[c.bytes].push_back(c.seconds);
  }
  out.fit = fit_linear(fitted);
  const double factor = samples.front().bus_bytes / samples.front().bytes;
  for (const auto& [bytes, seconds] : seconds_by_size) {
    out.sizes.push_back({bytes, bytes * factor / median(seconds), seconds.size()});
  }
  return out;
}

}  // namespace

LinearFit fit_linear(const std::vector<WorkSample>& samples) {
  LinearFit out;
  out.samples = samples.size();
  if (samples.empty()) return out;
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const WorkSample& s : samples) {
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

int nodes_spanned(const CollectiveCall& call, int gpus_per_node) {
  if (call.ranks.empty() || gpus_per_node <= 0) return 0;
  std::vector<int> nodes;
  for (int rank : call.ranks) nodes.push_back(rank / gpus_per_node);
  std::sort(nodes.begin(), nodes.end());
  return static_cast<int>(std::unique(nodes.begin(), nodes.end()) - nodes.begin());
}

HardwareProfile calibrate(const std::vector<KinetoTrace>& traces, const CalibrateOptions& options) {
  if (traces.empty()) throw MeasuredError("calibrate: no trace given");
  HardwareProfile profile;
  profile.device = traces.front().device;
  Gathered g;
  for (const KinetoTrace& trace : traces) {
    profile.sources.push_back(trace.path);
    if (trace.device != profile.device) {
      throw MeasuredError(fmt::format("calibrate: '{}' ran on '{}' but '{}' on '{}': one profile is one device kind",
                                      traces.front().path, profile.device, trace.path, trace.device));
    }
    gather(trace, options, g);
  }
  if (g.gemms.empty() && g.memory.empty() && g.attention.empty() && g.collectives.empty()) {
    throw MeasuredError(
        "calibrate: nothing to fit: no GEMM, memory-bound or attention kernel with its shapes and no collective with "
        "its size in the traces (profile with record_shapes=True)");
  }
  for (const auto& [cls, rates] : g.class_rates) {
    for (const std::string& kind : kinds_of_class(cls)) profile.memory_bytes_per_s_by_kind[kind] = median(rates);
  }
  for (const auto& [kind, rates] : g.kind_rates) profile.memory_bytes_per_s_by_kind[kind] = median(rates);
  if (options.program && !g.twin_gemm_ops.empty()) {
    // A GEMM op's bias pass streams as the Program's other elementwise passes do on this host (their median rate).
    std::vector<double> elementwise;
    for (const std::string& kind : kinds_of_class(KernelClass::Elementwise)) {
      const auto it = profile.memory_bytes_per_s_by_kind.find(kind);
      if (it != profile.memory_bytes_per_s_by_kind.end()) elementwise.push_back(it->second);
    }
    const double pass_bytes_per_s = median(elementwise);
    shape_twin_gemms(g, *options.program, pass_bytes_per_s, g.gemm_seconds_by_shape);
    if (pass_bytes_per_s > 0) {
      for (const std::string& kind : kinds_of_class(KernelClass::Gemm)) {
        profile.memory_bytes_per_s_by_kind[kind] = pass_bytes_per_s;
      }
    }
  }
  profile.gemm = fit_linear(g.gemms);
  if (g.gemm_seconds_by_shape.empty() && !g.gemms.empty()) {
    // No shapes (twin's own traces give each GEMM op's FLOPs, not its shape): the rate is the median of the ops'
    // rates, which one op that other work on the machine delayed does not move, as it moves a least-squares line.
    std::vector<double> rates;
    for (const WorkSample& s : g.gemms) rates.push_back(s.work / s.seconds);
    profile.gemm = residuals_of({0, median(rates), 0, g.gemms.size()}, g.gemms);
  }
  // Each shape at the median of its calls' times: one call that other work on the machine delayed does not move it.
  for (const auto& [key, seconds] : g.gemm_seconds_by_shape) {
    const auto& [m, n, k, batch] = key;
    const MatmulShape shape{m, n, k, batch};
    profile.gemm_shapes.push_back({shape, shape.flops() / median(seconds), seconds.size()});
  }
  std::sort(profile.gemm_shapes.begin(), profile.gemm_shapes.end(),
            [](const ShapeRate& a, const ShapeRate& b) { return a.shape.flops() > b.shape.flops(); });
  profile.memory = fit_linear(g.memory);
  profile.attention = fit_linear(g.attention);
  if (!traces.front().gpu && !g.attention.empty()) {
    // A CPU run's attention core (twin's executor runs it as one fused kernel): its FLOPs over its time, summed over
    // the forward and backward ops, which a line's intercept fitted on two sizes of op would only split between them.
    double flops = 0, seconds = 0;
    for (const WorkSample& s : g.attention) {
      flops += s.work;
      seconds += s.seconds;
    }
    profile.attention = residuals_of({0, seconds > 0 ? flops / seconds : 0, 0, g.attention.size()}, g.attention);
  }
  for (const auto& [key, samples] : g.collectives) profile.collectives.push_back(collective_fit(key, samples));
  profile.host_s_per_operator = median(g.between_per_operator_s);
  if (options.program) per_program_work(g, *options.program, profile);
  return profile;
}

OutOfSample check_profile(const HardwareProfile& profile, const KinetoTrace& trace, const CalibrateOptions& options) {
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
  auto collective_of = [&profile, &options](const TracedKernel& k) -> const CollectiveFit* {
    const int nodes = nodes_spanned(k.collective, options.gpus_per_node);
    for (const CollectiveFit& c : profile.collectives) {
      if (c.kind == k.kind.comm && c.ranks == k.collective.group_size && c.nodes == nodes) return &c;
    }
    return nullptr;
  };
  OutOfSample out;
  out.path = trace.path;
  const double n = iterations_of(trace);
  for (const TracedKernel& k : trace.kernels) {
    if (!counted(k, trace)) continue;
    if (k.kind.kind == KernelClass::Gemm && k.flops > 0 && profile.gemm.samples > 0) {
      const double rate = k.shape.batch > 0 ? rate_of(k.shape) : 0;
      out.gemm_predicted_s += (rate > 0 ? k.flops / rate : profile.gemm.predict_s(k.flops)) / n;
      out.gemm_measured_s += k.duration_s / n;
    } else if (memory_bound(k) && profile.memory.samples > 0) {
      out.memory_predicted_s += profile.memory.predict_s(k.bytes) / n;
      out.memory_measured_s += k.duration_s / n;
    } else if (k.kind.kind == KernelClass::Attention && k.flops > 0 && profile.attention.samples > 0) {
      out.attention_predicted_s += profile.attention.predict_s(k.flops) / n;
      out.attention_measured_s += k.duration_s / n;
    } else if (k.kind.kind == KernelClass::Communication && k.collective.bytes > 0) {
      if (const CollectiveFit* c = collective_of(k)) {
        out.collective_predicted_s +=
            c->fit.predict_s(k.collective.bytes * bus_factor(k.kind.comm, k.collective.group_size)) / n;
        out.collective_measured_s += k.duration_s / n;
      }
    }
  }
  return out;
}

}  // namespace twin::measured
