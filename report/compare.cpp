#include "report/compare.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <sstream>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "report/summary.hpp"

namespace twin::report {
namespace {

double number(const nlohmann::json& object, const char* key, const char* document) {
  if (!object.contains(key) || !object[key].is_number()) {
    throw CompareError(fmt::format("{}: summary has no number \"{}\"", document, key));
  }
  return object[key].get<double>();
}

}  // namespace

namespace {

// Every field compare_summaries reads, checked once with the file's name: a summary edited by hand or written by
// another tool fails here with the field named, not with a JSON library's type error or a table of nonsense.
void check_summary(const nlohmann::json& summary, const std::string& what) {
  auto fail = [&what](const std::string& field, const std::string& expected, const nlohmann::json& value) {
    throw CompareError(fmt::format("{}: \"{}\" must be {}, got {}", what, field, expected, value.dump()));
  };
  auto finite = [](const nlohmann::json& value) { return value.is_number() && std::isfinite(value.get<double>()); };
  const nlohmann::json null;
  auto field = [&summary, &null](const char* key) -> const nlohmann::json& {
    return summary.contains(key) ? summary.at(key) : null;
  };
  const nlohmann::json& time = field("iteration_time_s");
  if (!finite(time) || time.get<double>() <= 0) fail("iteration_time_s", "a positive number of seconds", time);
  if (const nlohmann::json& tflops = summary.value("tflops_per_gpu", nlohmann::json(0.0));
      !finite(tflops) || tflops.get<double>() < 0) {
    fail("tflops_per_gpu", "a number >= 0", tflops);
  }
  if (const nlohmann::json& bubble = summary.value("bubble_fraction", nlohmann::json(0.0));
      !finite(bubble) || bubble.get<double>() < 0 || bubble.get<double>() > 1) {
    fail("bubble_fraction", "a fraction in [0, 1]", bubble);
  }
  if (summary.contains("time_split")) {
    const nlohmann::json& split = summary.at("time_split");
    if (!split.is_object()) fail("time_split", "an object of fractions", split);
    for (const auto& [part, value] : split.items()) {
      if (!finite(value) || value.get<double>() < 0 || value.get<double>() > 1) {
        fail("time_split." + part, "a fraction in [0, 1]", value);
      }
    }
  }
  if (summary.contains("compute_by_kind_s")) {
    const nlohmann::json& kinds = summary.at("compute_by_kind_s");
    if (!kinds.is_object()) fail("compute_by_kind_s", "an object of seconds by kernel kind", kinds);
    for (const auto& [kind, value] : kinds.items()) {
      if (!finite(value) || value.get<double>() < 0)
        fail("compute_by_kind_s." + kind, "a number of seconds >= 0", value);
    }
  }
  const nlohmann::json& stages = field("stages");
  if (!stages.is_array()) fail("stages", "an array of stages", stages);
  for (const nlohmann::json& stage : stages) {
    if (!stage.is_object() || !stage.contains("stage") || !stage.at("stage").is_number_integer()) {
      fail("stages[]", "an object with an integer \"stage\"", stage);
    }
    if (const nlohmann::json& busy = stage.value("busy_s", nlohmann::json(0.0));
        !finite(busy) || busy.get<double>() < 0) {
      fail(fmt::format("stages[{}].busy_s", stage.at("stage").get<long long>()), "a number of seconds >= 0", busy);
    }
  }
  if (summary.contains("scenario")) {
    const nlohmann::json& scenario = summary.at("scenario");
    if (!scenario.is_object()) fail("scenario", "an object", scenario);
    for (const char* key : {"tp", "pp", "dp", "micro_batches"}) {
      if (scenario.contains(key) && !scenario.at(key).is_number_integer()) {
        fail(std::string("scenario.") + key, "an integer", scenario.at(key));
      }
    }
  }
}

}  // namespace

const nlohmann::json& find_summary(const nlohmann::json& document, const std::string& what) {
  const nlohmann::json* summary = nullptr;
  if (document.is_object() && document.contains("iteration_time_s") && document.contains("stages")) {
    summary = &document;
  } else if (document.is_object() && document.contains("summary") && document["summary"].is_object()) {
    summary = &document["summary"];
  } else {
    throw CompareError(what + ": not a twin summary (expected the JSON of `twin sim --json` or `twin run --json`)");
  }
  check_summary(*summary, what);
  return *summary;
}

std::string hardware_family(std::string_view name) {
  std::string n(name);
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char ch) { return std::tolower(ch); });
  auto has = [&n](const char* part) { return n.find(part) != std::string::npos; };
  if (has("cpu")) return "cpu";
  if (has("a100")) return has("40gb") || has("40 gb") ? "a100-40gb" : "a100-80gb";
  if (has("h100")) return "h100";
  if (has("h200")) return "h200";
  return n;
}

std::vector<std::string> run_differences(const nlohmann::json& reference, const nlohmann::json& candidate) {
  const nlohmann::json a = reference.value("scenario", nlohmann::json::object());
  const nlohmann::json b = candidate.value("scenario", nlohmann::json::object());
  std::vector<std::string> out;
  auto differ = [&out](const std::string& field, const nlohmann::json& x, const nlohmann::json& y) {
    out.push_back(fmt::format("{} is {} in the measurement and {} in the prediction", field,
                              x.is_string() ? x.get<std::string>() : x.dump(),
                              y.is_string() ? y.get<std::string>() : y.dump()));
  };
  // The plan's fields are compared as before: absent on one side reads as -1.
  for (const char* field : {"tp", "pp", "dp", "micro_batches"}) {
    if (a.value(field, -1) != b.value(field, -1)) differ(field, a.value(field, -1), b.value(field, -1));
  }
  for (const char* field : {"name", "layers", "hidden", "heads", "seq_len", "micro_batch", "global_batch", "gpus"}) {
    if (a.contains(field) && b.contains(field) && a.at(field) != b.at(field)) {
      differ(std::string(field == std::string("name") ? "model" : field), a.at(field), b.at(field));
    }
  }
  if (a.contains("hardware") && b.contains("hardware") && a.at("hardware").is_string() &&
      b.at("hardware").is_string() &&
      hardware_family(a.at("hardware").get<std::string>()) != hardware_family(b.at("hardware").get<std::string>())) {
    differ("hardware", a.at("hardware"), b.at("hardware"));
  }
  return out;
}

Comparison compare_summaries(const nlohmann::json& reference, const nlohmann::json& candidate, bool allow_mismatch) {
  Comparison c;
  c.mismatches = run_differences(reference, candidate);
  if (!c.mismatches.empty() && !allow_mismatch) {
    std::string all;
    for (const std::string& m : c.mismatches) all += (all.empty() ? "" : "; ") + m;
    throw CompareError(fmt::format("not the same run: {} (--allow-mismatch compares them anyway)", all));
  }
  c.reference_engine = reference.value("engine", "?");
  c.candidate_engine = candidate.value("engine", "?");
  c.totals.push_back({"iteration time (s)", number(reference, "iteration_time_s", "measured"),
                      number(candidate, "iteration_time_s", "predicted")});
  c.totals.push_back({"model TFLOP/s per GPU", number(reference, "tflops_per_gpu", "measured"),
                      number(candidate, "tflops_per_gpu", "predicted")});
  c.totals.push_back({"bubble fraction", number(reference, "bubble_fraction", "measured"),
                      number(candidate, "bubble_fraction", "predicted")});
  const double t_ref = number(reference, "iteration_time_s", "measured");
  const double t_can = number(candidate, "iteration_time_s", "predicted");
  if (reference.contains("time_split") && candidate.contains("time_split")) {
    // Fractions of the iteration in each, shown as seconds so that the errors add up to the time's error.
    for (const char* part : {"compute", "tp", "cp", "ep", "pp", "dp", "bubble"}) {
      // CP's and EP's exchanges where either side has them (summaries written before they were split count them as DP)
      if ((part == std::string_view("cp") || part == std::string_view("ep")) &&
          reference["time_split"].value(part, 0.0) == 0 && candidate["time_split"].value(part, 0.0) == 0) {
        continue;
      }
      const std::string name = std::string(part) == "bubble" ? "fill/drain (s)" : std::string(part) + " (s)";
      c.totals.push_back(
          {name, reference["time_split"].value(part, 0.0) * t_ref, candidate["time_split"].value(part, 0.0) * t_can});
    }
  }
  if (reference.contains("compute_by_kind_s") && candidate.contains("compute_by_kind_s")) {
    // Kernel kinds both engines timed (a fused layer op the prediction did not split matches nothing measured).
    const nlohmann::json& measured = reference["compute_by_kind_s"];
    const nlohmann::json& predicted = candidate["compute_by_kind_s"];
    for (std::size_t index = 0; index < model::kComputeKindCount; ++index) {  // in the order of a layer's ops
      const std::string kind(model::to_string(static_cast<model::ComputeKind>(index)));
      if (measured.contains(kind) && predicted.contains(kind)) {
        c.kinds.push_back({kind + " (s)", measured[kind].get<double>(), predicted[kind].get<double>()});
      }
    }
  }
  for (const auto& a : reference.at("stages")) {
    for (const auto& b : candidate.at("stages")) {
      if (a.value("stage", -1) == b.value("stage", -2)) {
        c.stages.push_back(
            {fmt::format("stage {} busy (s)", a.value("stage", -1)), a.value("busy_s", 0.0), b.value("busy_s", 0.0)});
      }
    }
  }
  return c;
}

std::string comparison_table(const Comparison& c) {
  std::string out;
  auto line = std::back_inserter(out);
  for (const std::string& m : c.mismatches) {
    fmt::format_to(line, "  WARNING: not the same run: {}; the errors below compare different things\n", m);
  }
  if (!c.mismatches.empty()) out += "\n";
  fmt::format_to(line, "  predicted: {}\n  measured:  {}\n\n", c.candidate_engine, c.reference_engine);
  fmt::format_to(line, "  {:<24} {:>14} {:>14} {:>9}\n", "", "predicted", "measured", "error");
  auto row = [&line](const ComparedValue& v) {
    fmt::format_to(line, "  {:<24} {:>14.4f} {:>14.4f} {:>+8.1f}%\n", v.name, v.candidate, v.reference,
                   100 * v.error());
  };
  for (const auto& v : c.totals) row(v);
  if (!c.kinds.empty()) fmt::format_to(line, "\n  compute by kernel (mean of stages):\n");
  for (const auto& v : c.kinds) row(v);
  if (!c.stages.empty()) fmt::format_to(line, "\n");
  for (const auto& v : c.stages) row(v);
  return out;
}

nlohmann::json error_json(double candidate, double reference) {
  return reference != 0 ? nlohmann::json(relative_error(candidate, reference)) : nlohmann::json(nullptr);
}

nlohmann::json comparison_to_json(const Comparison& c) {
  auto values = [](const std::vector<ComparedValue>& list) {
    nlohmann::json out = nlohmann::json::array();
    for (const ComparedValue& v : list) {
      out.push_back({{"name", v.name},
                     {"predicted", v.candidate},
                     {"measured", v.reference},
                     {"error", error_json(v.candidate, v.reference)}});
    }
    return out;
  };
  return {{"mode", "summary"},
          {"mismatches", c.mismatches},
          {"predicted_engine", c.candidate_engine},
          {"measured_engine", c.reference_engine},
          {"totals", values(c.totals)},
          {"kinds", values(c.kinds)},
          {"stages", values(c.stages)}};
}

}  // namespace twin::report
