#include "measured/compare_measured.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace twin::measured {
namespace {

using nlohmann::json;

double number_or(const json& object, const char* key, double otherwise) {
  return object.contains(key) && object.at(key).is_number() ? object.at(key).get<double>() : otherwise;
}

// Mean over ranks of a per-rank value.
template <typename Get>
double rank_mean(const MeasuredRun& run, Get get) {
  if (run.ranks.empty()) return 0;
  double total = 0;
  for (const RankMeasurement& r : run.ranks) total += get(r);
  return total / static_cast<double>(run.ranks.size());
}

}  // namespace

std::vector<std::string> run_differences(const json& predicted, const MeasuredRun& run) {
  const json scenario = predicted.value("scenario", json::object());
  std::vector<std::string> out;
  auto differ = [&out](const std::string& field, const std::string& measured, const std::string& prediction) {
    out.push_back(fmt::format("{} is {} in the measurement and {} in the prediction", field, measured, prediction));
  };
  if (!run.device.empty() && scenario.contains("hardware") && scenario.at("hardware").is_string()) {
    const std::string predicted_hardware = scenario.at("hardware").get<std::string>();
    if (report::hardware_family(run.device) != report::hardware_family(predicted_hardware)) {
      differ("hardware", run.device, predicted_hardware);
    }
  }
  if (run.world_size > 0 && scenario.contains("gpus") && scenario.at("gpus").is_number_integer() &&
      scenario.at("gpus").get<long long>() != run.world_size) {
    differ("world size", std::to_string(run.world_size), std::to_string(scenario.at("gpus").get<long long>()));
  }
  // A log's own statement of the plan and model (Megatron's arguments, NeMo's config, torchtitan's batch line).
  static const std::vector<std::pair<std::string, std::string>> keys = {
      {"tp", "tp"},         {"pp", "pp"},          {"dp", "dp"},          {"layers", "layers"},
      {"hidden", "hidden"}, {"heads", "heads"},    {"seq_len", "seq_len"}, {"global_batch", "global_batch"},
      {"micro_batch", "micro_batch"}};
  for (const auto& [key, field] : keys) {
    const auto measured = run.plan.find(key);
    if (measured == run.plan.end() || !scenario.contains(field) || !scenario.at(field).is_number_integer()) continue;
    if (scenario.at(field).get<long long>() != measured->second) {
      differ(field, std::to_string(measured->second), std::to_string(scenario.at(field).get<long long>()));
    }
  }
  return out;
}

// With profiler traces: compute by class, exposed communication, unclassified kernels, and each rank's iteration.
static void add_trace_rows(MeasuredComparison& c, const json& predicted, const MeasuredRun& run, double predicted_s,
                           std::size_t top) {
  report::Comparison& v = c.values;
  const json split = predicted.value("time_split", json::object());
  const double exposed_predicted =
      predicted_s * (number_or(split, "tp", 0) + number_or(split, "cp", 0) + number_or(split, "ep", 0) +
                     number_or(split, "pp", 0) + number_or(split, "dp", 0));
  const double exposed_measured = rank_mean(run, [](const RankMeasurement& r) { return r.exposed_communication_s; });
  if (run.gpu) {
    v.totals.push_back({"exposed communication (s)", exposed_measured, exposed_predicted});
  } else {
    // A CPU run's operators run one at a time: what the prediction calls host time is the time between operators.
    v.totals.push_back({"between operators (s)",
                        rank_mean(run, [](const RankMeasurement& r) { return r.outside_operators_s; }),
                        predicted_s * number_or(split, "host", 0)});
  }
  std::array<double, kKernelClassCount> predicted_class{};
  const json kinds = predicted.value("compute_by_kind_s", json::object());
  for (std::size_t index = 0; index < model::kComputeKindCount; ++index) {
    const auto kind = static_cast<model::ComputeKind>(index);
    const std::string name(model::to_string(kind));
    if (const auto cls = class_of(kind); cls && kinds.contains(name)) {
      predicted_class[static_cast<std::size_t>(*cls)] += number_or(kinds, name.c_str(), 0);
    }
  }
  const double kernel_s = rank_mean(run, [](const RankMeasurement& r) { return r.kernel_s; });
  for (std::size_t index = 0; index < kKernelClassCount; ++index) {
    const auto cls = static_cast<KernelClass>(index);
    const double measured = rank_mean(run, [index](const RankMeasurement& r) { return r.class_s[index]; });
    if (cls == KernelClass::Communication) {
      if (measured > 0) c.notes.push_back(fmt::format("communication kernels ran {:.4f} s per iteration, {:.4f} s of "
                                                      "it under no other kernel", measured, exposed_measured));
      continue;
    }
    if (modelled_by_twin(cls)) {
      if (measured > 0 || predicted_class[index] > 0) {
        v.kinds.push_back({std::string(to_string(cls)) + " (s)", measured, predicted_class[index]});
      }
    } else if (cls != KernelClass::Unclassified && measured > 0) {
      c.unmatched.push_back({"class " + std::string(to_string(cls)) + " (no op of the Program)", measured,
                             kernel_s > 0 ? measured / kernel_s : 0});
    }
  }
  // Unclassified kernels by name, over every rank.
  std::map<std::string, double> by_name;
  for (const RankMeasurement& r : run.ranks) {
    for (const NamedTime& u : r.unclassified) by_name[u.name] += u.seconds / static_cast<double>(run.ranks.size());
  }
  std::vector<UnmatchedKernels> names;
  for (const auto& [name, seconds] : by_name) names.push_back({name, seconds, kernel_s > 0 ? seconds / kernel_s : 0});
  std::sort(names.begin(), names.end(), [](const auto& a, const auto& b) { return a.seconds > b.seconds; });
  if (names.size() > top && top > 0) {
    UnmatchedKernels rest{fmt::format("{} more unclassified kernels", names.size() - top), 0, 0};
    for (std::size_t i = top; i < names.size(); ++i) {
      rest.seconds += names[i].seconds;
      rest.share += names[i].share;
    }
    names.resize(top);
    names.push_back(rest);
  }
  c.unmatched.insert(c.unmatched.end(), names.begin(), names.end());
  c.classified_share = classified_share(run);

  double slowest = 0, fastest = 1e300;
  for (const RankMeasurement& r : run.ranks) {
    v.stages.push_back({fmt::format("rank {} iteration (s)", r.rank), r.iteration_time_s, predicted_s});
    slowest = std::max(slowest, r.iteration_time_s);
    fastest = std::min(fastest, r.iteration_time_s);
  }
  if (run.ranks.size() > 1) {
    c.notes.push_back(fmt::format("ranks' iteration times spread by {:.1f} % of their mean ({:.4f} to {:.4f} s)",
                                  100 * (slowest - fastest) / run.iteration_time_s, fastest, slowest));
  }
  for (const RankMeasurement& r : run.ranks) {
    if (r.kernels_outside_iterations > 0) {
      c.notes.push_back(fmt::format("rank {}: {} kernels outside the profiled iterations, not counted", r.rank,
                                    r.kernels_outside_iterations));
    }
  }
}

MeasuredComparison compare_with_measured(const json& predicted, const MeasuredRun& run, bool allow_mismatch,
                                         std::size_t top) {
  MeasuredComparison c;
  report::Comparison& v = c.values;
  v.mismatches = run_differences(predicted, run);
  if (!v.mismatches.empty() && !allow_mismatch) {
    std::string all;
    for (const std::string& m : v.mismatches) all += (all.empty() ? "" : "; ") + m;
    throw report::CompareError(fmt::format("not the same run: {} (--allow-mismatch compares them anyway)", all));
  }
  v.candidate_engine = predicted.value("engine", "?");
  v.reference_engine = fmt::format("{}{}", run.source, run.device.empty() ? "" : ", " + run.device);
  const double predicted_s = number_or(predicted, "iteration_time_s", 0);
  const double tflops = number_or(predicted, "tflops_per_gpu", 0);
  const json scenario = predicted.value("scenario", json::object());
  const double gpus = number_or(scenario, "gpus", 1);
  const double tokens_per_iteration = number_or(scenario, "global_batch", 0) * number_or(scenario, "seq_len", 0);

  double measured_s = run.iteration_time_s;
  if (measured_s <= 0 && run.tokens_per_s_per_gpu > 0 && tokens_per_iteration > 0) {
    measured_s = tokens_per_iteration / (gpus * run.tokens_per_s_per_gpu);
    c.notes.push_back(fmt::format("measured iteration time from the log's {:.0f} tokens/s per GPU and the "
                                  "prediction's {:.0f} tokens per iteration on {:.0f} GPUs",
                                  run.tokens_per_s_per_gpu, tokens_per_iteration, gpus));
  }
  if (measured_s > 0) v.totals.push_back({"iteration time (s)", measured_s, predicted_s});
  if (run.tokens_per_s_per_gpu > 0 && predicted_s > 0 && tokens_per_iteration > 0) {
    v.totals.push_back({"tokens/s per GPU", run.tokens_per_s_per_gpu, tokens_per_iteration / (gpus * predicted_s)});
  }
  if (run.tflops_per_gpu > 0) {
    v.totals.push_back({"model TFLOP/s per GPU", run.tflops_per_gpu, tflops});
    c.notes.push_back("TFLOP/s as the log counts them: Megatron-LM counts the recompute's forward when it ran, "
                      "torchtitan never; twin's are Narayanan's count for the scenario's recompute");
  } else if (measured_s > 0 && predicted_s > 0) {
    v.totals.push_back({"model TFLOP/s per GPU", tflops * predicted_s / measured_s, tflops});
  }
  if (run.mfu > 0) v.totals.push_back({"MFU", run.mfu, number_or(predicted, "mfu", 0)});
  if (run.logged_iterations > 0) {
    c.notes.push_back(
        run.used_iterations < run.logged_iterations
            ? fmt::format("measured: the mean of the last {} of the log's {} iteration lines (the first holds start-up: "
                          "compilation, allocator warm-up, first connections)",
                          run.used_iterations, run.logged_iterations)
            : fmt::format("measured: the mean of all {} iteration lines of the log (with fewer than 3, none is left "
                          "out as start-up)",
                          run.logged_iterations));
  }
  const double predicted_memory_gib = number_or(predicted, "memory_per_gpu_bytes", 0) / (1024.0 * 1024 * 1024);
  if (run.max_allocated_bytes > 0 && predicted_memory_gib > 0) {
    v.totals.push_back({"peak memory per GPU (GiB)", run.max_allocated_bytes / (1024.0 * 1024 * 1024),
                        predicted_memory_gib});
    c.notes.push_back("peak memory: the log's \"max allocated\" (live tensors at their peak, rank 0) against "
                      "twin's peak of the busiest stage");
  } else if (run.max_reserved_bytes > 0 && predicted_memory_gib > 0) {
    v.totals.push_back({"peak memory per GPU (GiB)", run.max_reserved_bytes / (1024.0 * 1024 * 1024),
                        predicted_memory_gib});
    c.notes.push_back("peak memory: the log's reserved peak (the caching allocator's cache included, so above the "
                      "live tensors twin counts)");
  }
  if (!run.ranks.empty()) add_trace_rows(c, predicted, run, predicted_s, top);
  return c;
}

std::string measured_comparison_table(const MeasuredComparison& c) {
  std::string out = report::comparison_table(c.values);
  auto line = std::back_inserter(out);
  if (!c.unmatched.empty() || c.classified_share > 0) {
    fmt::format_to(line, "\n  kernel time classified: {:.1f} %; not in the Program's kinds (name, s per iteration, "
                   "share of kernel time):\n", 100 * c.classified_share);
    for (const UnmatchedKernels& u : c.unmatched) {
      fmt::format_to(line, "    {:>10.6f}  {:>5.1f} %  {}\n", u.seconds, 100 * u.share, u.name);
    }
  }
  if (!c.notes.empty()) out += "\n";
  for (const std::string& note : c.notes) fmt::format_to(line, "  note: {}\n", note);
  return out;
}

json measured_comparison_to_json(const MeasuredComparison& c) {
  json out = report::comparison_to_json(c.values);
  out["mode"] = "measured";
  out["ranks"] = out["stages"];
  out.erase("stages");
  json unmatched = json::array();
  for (const UnmatchedKernels& u : c.unmatched) {
    unmatched.push_back({{"name", u.name}, {"seconds", u.seconds}, {"share", u.share}});
  }
  out["unmatched"] = unmatched;
  out["notes"] = c.notes;
  out["classified_share"] = c.classified_share;
  return out;
}

}  // namespace twin::measured
