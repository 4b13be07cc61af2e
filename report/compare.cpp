#include "report/compare.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "model/op_label.hpp"
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

Comparison compare_summaries(const nlohmann::json& reference, const nlohmann::json& candidate) {
  for (const char* field : {"tp", "pp", "dp", "micro_batches"}) {
    const auto& a = reference.value("scenario", nlohmann::json::object());
    const auto& b = candidate.value("scenario", nlohmann::json::object());
    if (a.value(field, -1) != b.value(field, -1)) {
      throw CompareError(fmt::format("not the same plan: {} is {} in the measurement and {} in the prediction", field,
                                     a.value(field, -1), b.value(field, -1)));
    }
  }
  Comparison c;
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
    for (const char* part : {"compute", "tp", "pp", "dp", "bubble"}) {
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

namespace {

// The relative error for JSON: null when there is no reference to be relative to.
nlohmann::json error_json(double candidate, double reference) {
  return reference != 0 ? nlohmann::json(relative_error(candidate, reference)) : nlohmann::json(nullptr);
}

}  // namespace

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
          {"predicted_engine", c.candidate_engine},
          {"measured_engine", c.reference_engine},
          {"totals", values(c.totals)},
          {"kinds", values(c.kinds)},
          {"stages", values(c.stages)}};
}

// --- Op by op ---

bool is_trace(const nlohmann::json& document) {
  return document.is_object() && document.contains("traceEvents") && document.at("traceEvents").is_array();
}

std::string op_class(std::string_view label) {
  return model::op_class(label);  // the labels both engines write (model/op_label.hpp)
}

namespace {

struct TracedOp {
  std::string label;
  double own_s = 0;  // from when its work began to its end
};

struct Trace {
  std::string engine = "?";
  std::map<int, std::map<int, TracedOp>> ranks;  // rank -> op index -> op
};

Trace read_trace(const nlohmann::json& document, const std::string& what) {
  if (!is_trace(document)) {
    throw CompareError(what + ": not a trace (expected the Chrome trace of `twin sim --trace` or `twin run --trace`)");
  }
  Trace trace;
  if (const auto other = document.find("otherData"); other != document.end() && other->is_object()) {
    if (const auto engine = other->find("engine"); engine != other->end() && engine->is_string()) {
      trace.engine = engine->get<std::string>();
    }
  }
  const nlohmann::json& events = document.at("traceEvents");
  for (std::size_t index = 0; index < events.size(); ++index) {
    const nlohmann::json& event = events[index];
    auto fail = [&](const std::string& field, const std::string& expected, const nlohmann::json& value) {
      throw CompareError(
          fmt::format("{}: traceEvents[{}].{} must be {}, got {}", what, index, field, expected, value.dump()));
    };
    if (!event.is_object()) fail("", "an object", event);
    if (event.value("ph", nlohmann::json("")) != "X") continue;  // metadata: process and track names
    const nlohmann::json null;
    auto field = [&null](const nlohmann::json& object, const char* key) -> const nlohmann::json& {
      return object.is_object() && object.contains(key) ? object.at(key) : null;
    };
    auto seconds = [&](const nlohmann::json& value, const std::string& name) {
      if (!value.is_number() || !std::isfinite(value.get<double>()) || value.get<double>() < 0) {
        fail(name, "a number of microseconds >= 0", value);
      }
      return value.get<double>() * 1e-6;
    };
    const nlohmann::json& args = field(event, "args");
    const nlohmann::json& rank = field(event, "pid");
    const nlohmann::json& op = field(args, "op");
    const nlohmann::json& name = field(event, "name");
    if (!rank.is_number_integer() || rank.get<long long>() < 0) fail("pid", "a rank (an integer >= 0)", rank);
    if (!op.is_number_integer() || op.get<long long>() < 0) fail("args.op", "an op index (an integer >= 0)", op);
    if (!name.is_string()) fail("name", "the op's label", name);
    const double duration_s = seconds(field(event, "dur"), "dur");
    const double wait_s = args.contains("wait_us") ? seconds(args.at("wait_us"), "args.wait_us") : 0.0;
    const auto [where, added] = trace.ranks[rank.get<int>()].try_emplace(
        op.get<int>(), TracedOp{name.get<std::string>(), std::max(0.0, duration_s - wait_s)});
    if (!added) {
      throw CompareError(fmt::format("{}: rank {} op {} appears twice (traceEvents[{}])", what, rank.get<int>(),
                                     op.get<int>(), index));
    }
  }
  if (trace.ranks.empty()) throw CompareError(what + ": the trace records no op");
  return trace;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += j > i ? fmt::format("{}-{}", ranks[i], ranks[j]) : fmt::format("{}", ranks[i]);
    i = j + 1;
  }
  return out;
}

std::vector<int> ranks_of(const Trace& trace) {
  std::vector<int> ranks;
  for (const auto& [rank, ops] : trace.ranks) ranks.push_back(rank);
  return ranks;
}

}  // namespace

TraceComparison compare_traces(const nlohmann::json& reference, const std::string& reference_what,
                               const nlohmann::json& candidate, const std::string& candidate_what, std::size_t top) {
  const Trace measured = read_trace(reference, reference_what);
  const Trace predicted = read_trace(candidate, candidate_what);
  TraceComparison c;
  c.reference_engine = measured.engine;
  c.candidate_engine = predicted.engine;
  std::map<std::string, ComparedClass> classes;
  std::vector<ComparedOp> all;
  for (const auto& [rank, measured_ops] : measured.ranks) {
    const auto found = predicted.ranks.find(rank);
    if (found == predicted.ranks.end()) continue;
    const auto& predicted_ops = found->second;
    if (measured_ops.size() != predicted_ops.size()) {
      throw CompareError(fmt::format(
          "rank {} has {} ops in {} and {} in {}: the traces are of different Programs (trace one scenario, at one "
          "--granularity, in both)",
          rank, measured_ops.size(), reference_what, predicted_ops.size(), candidate_what));
    }
    c.ranks.push_back(rank);
    for (const auto& [index, m] : measured_ops) {
      const auto p = predicted_ops.find(index);
      if (p == predicted_ops.end() || p->second.label != m.label) {
        throw CompareError(fmt::format(
            "rank {} op {} is '{}' in {} and '{}' in {}: the traces are of different Programs (trace one scenario, at "
            "one --granularity, in both)",
            rank, index, m.label, reference_what, p == predicted_ops.end() ? "nothing" : p->second.label,
            candidate_what));
      }
      all.push_back({rank, index, m.label, m.own_s, p->second.own_s});
      ComparedClass& cls = classes[op_class(m.label)];
      cls.ops += 1;
      cls.reference_s += m.own_s;
      cls.candidate_s += p->second.own_s;
    }
  }
  if (c.ranks.empty()) {
    throw CompareError(fmt::format("no rank is in both traces: {} records ranks {}, {} ranks {} (see --trace-ranks)",
                                   reference_what, rank_list(ranks_of(measured)), candidate_what,
                                   rank_list(ranks_of(predicted))));
  }
  c.ops = all.size();
  const double ranks = static_cast<double>(c.ranks.size());
  c.total.name = "all ops";
  for (auto& [name, cls] : classes) {
    cls.name = name;
    cls.ops /= ranks;
    cls.reference_s /= ranks;
    cls.candidate_s /= ranks;
    c.total.ops += cls.ops;
    c.total.reference_s += cls.reference_s;
    c.total.candidate_s += cls.candidate_s;
    c.classes.push_back(cls);
  }
  std::stable_sort(c.classes.begin(), c.classes.end(),
                   [](const ComparedClass& a, const ComparedClass& b) { return a.reference_s > b.reference_s; });
  const auto difference = [](const ComparedOp& op) { return std::abs(op.candidate_s - op.reference_s); };
  std::stable_sort(all.begin(), all.end(),
                   [&](const ComparedOp& a, const ComparedOp& b) { return difference(a) > difference(b); });
  all.resize(std::min(top, all.size()));
  c.largest = std::move(all);
  return c;
}

std::string trace_comparison_table(const TraceComparison& c) {
  std::string out;
  auto line = std::back_inserter(out);
  auto error = [](double candidate, double reference) {
    return reference > 0 ? fmt::format("{:>+8.1f}%", 100 * relative_error(candidate, reference))
                         : fmt::format("{:>9}", "-");
  };
  fmt::format_to(line, "  predicted: {}\n  measured:  {}\n\n", c.candidate_engine, c.reference_engine);
  fmt::format_to(line,
                 "  {} ops on {} rank{} ({}), each from when its work began to its end; seconds per rank, summed over "
                 "layers and micro-batches\n\n",
                 c.ops, c.ranks.size(), c.ranks.size() == 1 ? "" : "s", rank_list(c.ranks));
  fmt::format_to(line, "  {:<40} {:>7} {:>12} {:>12} {:>9}\n", "op", "ops", "predicted", "measured", "error");
  fmt::format_to(line, "  {:<40} {:>7.4g} {:>12.6f} {:>12.6f} {}\n\n", c.total.name, c.total.ops, c.total.candidate_s,
                 c.total.reference_s, error(c.total.candidate_s, c.total.reference_s));
  for (const ComparedClass& cls : c.classes) {
    fmt::format_to(line, "  {:<40} {:>7.4g} {:>12.6f} {:>12.6f} {}\n", cls.name, cls.ops, cls.candidate_s,
                   cls.reference_s, error(cls.candidate_s, cls.reference_s));
  }
  if (!c.largest.empty()) {
    fmt::format_to(line, "\n  the {} op{} that differ most:\n  {:>6} {:>6}  {:<40} {:>12} {:>12} {:>9}\n",
                   c.largest.size(), c.largest.size() == 1 ? "" : "s", "rank", "op", "", "predicted", "measured",
                   "error");
    for (const ComparedOp& op : c.largest) {
      fmt::format_to(line, "  {:>6} {:>6}  {:<40} {:>12.6f} {:>12.6f} {}\n", op.rank, op.op, op.label, op.candidate_s,
                     op.reference_s, error(op.candidate_s, op.reference_s));
    }
  }
  return out;
}

nlohmann::json trace_comparison_to_json(const TraceComparison& c) {
  nlohmann::json classes = nlohmann::json::array(), largest = nlohmann::json::array();
  auto row = [](const ComparedClass& cls) {
    return nlohmann::json{{"name", cls.name},
                          {"ops", cls.ops},
                          {"predicted_s", cls.candidate_s},
                          {"measured_s", cls.reference_s},
                          {"error", error_json(cls.candidate_s, cls.reference_s)}};
  };
  for (const ComparedClass& cls : c.classes) classes.push_back(row(cls));
  for (const ComparedOp& op : c.largest) {
    largest.push_back({{"rank", op.rank},
                       {"op", op.op},
                       {"label", op.label},
                       {"predicted_s", op.candidate_s},
                       {"measured_s", op.reference_s},
                       {"error", error_json(op.candidate_s, op.reference_s)}});
  }
  return {{"mode", "ops"},
          {"predicted_engine", c.candidate_engine},
          {"measured_engine", c.reference_engine},
          {"ranks", c.ranks},
          {"ops", c.ops},
          {"total", row(c.total)},
          {"classes", classes},
          {"largest", largest}};
}

}  // namespace twin::report
