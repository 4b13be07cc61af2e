// Two Chrome traces of one Program, op by op: every op both recorded, summed per rank by op class.
#include "report/compare_traces.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "model/ops/op_label.hpp"

namespace twin::report {
bool is_trace(const nlohmann::json& document) {
  return document.is_object() && document.contains("traceEvents") && document.at("traceEvents").is_array();
}

std::string op_class(std::string_view label) {
  return model::op_class(label);  // the labels both engines write (model/ops/op_label.hpp)
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
