#include "measured/measured_run.hpp"

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <unordered_map>

#include <fmt/core.h>

namespace twin::measured {
namespace {

using Interval = std::pair<double, double>;

// The union of intervals, sorted and merged.
std::vector<Interval> merged(std::vector<Interval> intervals) {
  std::sort(intervals.begin(), intervals.end());
  std::vector<Interval> out;
  for (const Interval& i : intervals) {
    if (!out.empty() && i.first <= out.back().second) {
      out.back().second = std::max(out.back().second, i.second);
    } else {
      out.push_back(i);
    }
  }
  return out;
}

double length(const std::vector<Interval>& intervals) {
  double total = 0;
  for (const auto& [begin, end] : intervals) total += end - begin;
  return total;
}

// Length of the intersection of two merged interval lists.
double overlap(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  double total = 0;
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    total += std::max(0.0, std::min(a[i].second, b[j].second) - std::max(a[i].first, b[j].first));
    if (a[i].second < b[j].second) {
      ++i;
    } else {
      ++j;
    }
  }
  return total;
}

std::vector<NamedTime> largest(const std::unordered_map<std::string, NamedTime>& by_name, double iterations,
                               std::size_t keep) {
  std::vector<NamedTime> out;
  for (const auto& [name, time] : by_name) out.push_back({name, time.seconds / iterations, time.count / iterations});
  std::sort(out.begin(), out.end(), [](const NamedTime& a, const NamedTime& b) {
    return a.seconds != b.seconds ? a.seconds > b.seconds : a.name < b.name;
  });
  if (out.size() > keep) out.resize(keep);
  return out;
}

}  // namespace

RankMeasurement measure_rank(const KinetoTrace& trace, int iterations_given) {
  RankMeasurement r;
  r.rank = trace.rank;
  r.path = trace.path;
  const bool by_steps = !trace.steps.empty();
  if (!by_steps && iterations_given <= 0) {
    throw MeasuredError(fmt::format("'{}' has no ProfilerStep#N ranges (the profiler records them at each "
                                    "profiler.step()): give the number of iterations it holds (--iterations N)",
                                    trace.path));
  }
  std::vector<const TracedKernel*> counted;
  for (const TracedKernel& k : trace.kernels) {
    if (!by_steps || k.iteration >= 0) {
      counted.push_back(&k);
    } else {
      ++r.kernels_outside_iterations;
    }
  }
  if (counted.empty()) {
    throw MeasuredError(fmt::format("'{}' has no {} inside its profiled iterations", trace.path,
                                    trace.gpu ? "GPU kernels" : "CPU operators"));
  }
  if (by_steps) {
    for (const ProfilerStep& step : trace.steps) r.iteration_s.push_back(step.duration_s);
  } else {
    double begin = counted.front()->start_s, end = begin;
    for (const TracedKernel* k : counted) {
      begin = std::min(begin, k->start_s);
      end = std::max(end, k->start_s + k->duration_s);
    }
    r.iteration_s.assign(static_cast<std::size_t>(iterations_given), (end - begin) / iterations_given);
  }
  r.iterations = static_cast<int>(r.iteration_s.size());
  const double n = r.iterations;
  r.iteration_time_s = std::accumulate(r.iteration_s.begin(), r.iteration_s.end(), 0.0) / n;

  std::unordered_map<std::string, NamedTime> unclassified, every;
  std::vector<Interval> compute, communication;
  std::map<std::int64_t, double> busy_by_stream;
  for (const TracedKernel* k : counted) {
    const auto kind = static_cast<std::size_t>(k->kind.kind);
    r.class_s[kind] += k->duration_s / n;
    r.kernel_s += k->duration_s / n;
    busy_by_stream[k->stream] += k->duration_s;
    NamedTime& named = every[k->name];
    named.seconds += k->duration_s;
    named.count += 1;
    if (k->kind.kind == KernelClass::Unclassified) {
      NamedTime& u = unclassified[k->name];
      u.seconds += k->duration_s;
      u.count += 1;
    }
    const Interval span{k->start_s, k->start_s + k->duration_s};
    if (k->kind.kind == KernelClass::Communication) {
      r.communication_s[std::string(to_string(k->kind.comm))] += k->duration_s / n;
      r.communication_total_s += k->duration_s / n;
      communication.push_back(span);
    } else {
      compute.push_back(span);
    }
  }
  r.streams = static_cast<int>(busy_by_stream.size());
  if (trace.gpu) {
    const auto comm_union = merged(std::move(communication));
    r.exposed_communication_s = (length(comm_union) - overlap(comm_union, merged(std::move(compute)))) / n;
  } else {
    // One thread runs the operators (PyTorch's CPU autograd runs the backward on the caller's thread); the rest of
    // the iteration on it is Python and the framework between operators.
    double busiest = 0;
    for (const auto& [stream, busy] : busy_by_stream) busiest = std::max(busiest, busy);
    r.outside_operators_s = std::max(0.0, r.iteration_time_s - busiest / n);
  }
  r.unclassified = largest(unclassified, n, 1000);
  r.top_kernels = largest(every, n, 20);
  return r;
}

MeasuredRun measure_traces(const std::vector<std::string>& paths, int iterations_given, bool fastest_step) {
  if (paths.empty()) throw MeasuredError("no trace to measure");
  MeasuredRun run;
  run.source = "pytorch profiler";
  for (std::size_t i = 0; i < paths.size(); ++i) {
    KinetoTrace trace = read_kineto_trace(paths[i]);
    if (fastest_step) keep_fastest_step(trace);
    RankMeasurement rank = measure_rank(trace, iterations_given);
    if (rank.rank < 0) rank.rank = static_cast<int>(i);
    for (const RankMeasurement& other : run.ranks) {
      if (other.rank == rank.rank) {
        throw MeasuredError(fmt::format("'{}' and '{}' are both rank {}: give one trace per rank", other.path,
                                        rank.path, rank.rank));
      }
    }
    if (i == 0) {
      run.device = trace.device;
      run.device_memory_bytes = trace.device_memory_bytes;
      run.gpu = trace.gpu;
    } else if (trace.device != run.device) {
      throw MeasuredError(fmt::format("'{}' ran on '{}' but '{}' on '{}': traces of one run share a device kind",
                                      paths[0], run.device, paths[i], trace.device));
    }
    run.world_size = std::max(run.world_size, trace.world_size);
    run.ranks.push_back(std::move(rank));
  }
  std::sort(run.ranks.begin(), run.ranks.end(),
            [](const RankMeasurement& a, const RankMeasurement& b) { return a.rank < b.rank; });
  double total = 0;
  for (const RankMeasurement& r : run.ranks) total += r.iteration_time_s;
  run.iteration_time_s = total / static_cast<double>(run.ranks.size());
  return run;
}

void use_fastest_iteration(MeasuredRun& run) {
  if (run.ranks.empty()) return;
  double total = 0;
  for (RankMeasurement& r : run.ranks) {
    r.iteration_time_s = *std::min_element(r.iteration_s.begin(), r.iteration_s.end());
    total += r.iteration_time_s;
  }
  run.iteration_time_s = total / static_cast<double>(run.ranks.size());
}

double classified_share(const MeasuredRun& run) {
  double all = 0, unclassified = 0;
  for (const RankMeasurement& r : run.ranks) {
    all += r.kernel_s;
    unclassified += r.class_s[static_cast<std::size_t>(KernelClass::Unclassified)];
  }
  return all > 0 ? 1 - unclassified / all : 0;
}

namespace {

bool is_trace_file(const std::filesystem::path& path) {
  const std::string name = path.filename().string();
  auto ends_with = [&name](std::string_view suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return ends_with(".json") || ends_with(".json.gz");
}

}  // namespace

bool is_measured_input(const std::string& path) {
  std::error_code ignored;
  if (std::filesystem::is_directory(path, ignored)) return true;
  if (!std::filesystem::is_regular_file(path, ignored)) return false;
  std::string text;
  try {
    text = read_maybe_gzipped(path);
  } catch (const MeasuredError&) {
    return false;
  }
  if (looks_like_chrome_trace(text)) {
    // twin's own traces (twin sim --trace, twin run --trace) carry "otherData": {"engine": ...}; the op-by-op
    // comparison reads those.
    return text.find("\"otherData\":{\"engine\"") == std::string::npos;
  }
  // A log may begin with '[' too ("[W socket.cpp ...]", "[2024-05-01 ...] torch.distributed.run", "[NeMo I ...]"):
  // what parses as JSON is twin's own document, anything else is read as a log (by its iteration lines).
  const std::size_t open = text.find_first_not_of(" \t\r\n");
  if (open == std::string::npos) return false;
  if (text[open] != '{' && text[open] != '[') return true;
  return !nlohmann::json::accept(text);
}

MeasuredRun read_measured(const std::string& path, int iterations_given, bool fastest_step) {
  std::error_code ignored;
  if (std::filesystem::is_directory(path, ignored)) {
    std::vector<std::string> traces;
    for (const auto& entry : std::filesystem::directory_iterator(path, ignored)) {
      if (entry.is_regular_file(ignored) && is_trace_file(entry.path())) traces.push_back(entry.path().string());
    }
    std::sort(traces.begin(), traces.end());
    if (traces.empty()) throw MeasuredError(fmt::format("'{}' holds no trace (*.json, *.json.gz)", path));
    return measure_traces(traces, iterations_given, fastest_step);
  }
  const std::string text = read_maybe_gzipped(path);
  if (looks_like_chrome_trace(text)) return measure_traces({path}, iterations_given, fastest_step);
  return read_training_log(path);
}

nlohmann::json measured_to_json(const MeasuredRun& run) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const RankMeasurement& r : run.ranks) {
    nlohmann::json classes = nlohmann::json::object();
    for (std::size_t c = 0; c < kKernelClassCount; ++c) {
      if (r.class_s[c] > 0) classes[std::string(to_string(static_cast<KernelClass>(c)))] = r.class_s[c];
    }
    nlohmann::json unclassified = nlohmann::json::array();
    for (const NamedTime& u : r.unclassified) {
      unclassified.push_back({{"name", u.name}, {"seconds", u.seconds}, {"count", u.count}});
    }
    ranks.push_back({{"rank", r.rank},
                     {"file", r.path},
                     {"iterations", r.iterations},
                     {"iteration_time_s", r.iteration_time_s},
                     {"kernel_s", r.kernel_s},
                     {"class_s", classes},
                     {"communication_s", r.communication_s},
                     {"exposed_communication_s", r.exposed_communication_s},
                     {"outside_operators_s", r.outside_operators_s},
                     {"streams", r.streams},
                     {"unclassified", unclassified}});
  }
  return {{"source", run.source},         {"device", run.device},
          {"world_size", run.world_size}, {"iteration_time_s", run.iteration_time_s},
          {"tokens_per_s_per_gpu", run.tokens_per_s_per_gpu}, {"tflops_per_gpu", run.tflops_per_gpu},
          {"mfu", run.mfu},               {"plan", run.plan},
          {"classified_share", run.ranks.empty() ? nlohmann::json(nullptr) : nlohmann::json(classified_share(run))},
          {"ranks", ranks}};
}

}  // namespace twin::measured
