// The sections of a simulation's page (summary, time split, stages, pipeline) and of a comparison's (summary,
// predicted against measured, stages or ranks).
#include <cmath>

#include <fmt/format.h>

#include "report/html_parts.hpp"
#include "report/html_report.hpp"
#include "report/html_sections.hpp"
#include "report/pipeline.hpp"
#include "report/svg.hpp"

namespace twin::report::html {

namespace {

using nlohmann::json;

constexpr double kGiB = 1024.0 * 1024 * 1024;

// "TP 8 x PP 35 x DP 8", with CP and EP when the plan has them: the plan as a header names it.
std::string plan_line(const json& scenario) {
  std::string plan =
      fmt::format("TP {} x PP {} x DP {}", scenario.value("tp", 1), scenario.value("pp", 1), scenario.value("dp", 1));
  if (scenario.value("cp", 1) > 1) plan += fmt::format(" x CP {}", scenario.value("cp", 1));
  if (scenario.value("ep", 1) > 1) plan += fmt::format(", EP {}", scenario.value("ep", 1));
  return plan;
}

std::string band_text(const json& document) {
  const auto band = document.find("iteration_time_band_s");
  if (band == document.end() || !band->is_array() || band->size() != 2) {
    return "none (no published runs of this kind in bench/accuracy/bands.json to say how far off twin is)";
  }
  return fmt::format("{:.3f} to {:.3f} s (twin's error on published runs of this kind)", band->at(0).get<double>(),
                     band->at(1).get<double>());
}

std::string sim_summary(const json& d) {
  const json& scenario = required(d, "scenario");
  const json& memory = required(d, "memory");
  std::vector<std::pair<std::string, std::string>> facts_list = {
      {"model", scenario.value("name", "")},
      {"GPUs", fmt::format("{} ({})", scenario.value("gpus", 0), scenario.value("hardware", ""))},
      {"plan", plan_line(scenario)},
      {"precision", scenario.value("precision", "")},
      {"batch",
       fmt::format("global {}, micro-batch {}, {} micro-batches per pipeline", scenario.value("global_batch", 0),
                   scenario.value("micro_batch", 0), scenario.value("micro_batches", 0))},
      {"engine", fmt::format("{}; {} granularity", d.value("engine", ""), d.value("granularity", "-"))},
      {"iteration time", fmt::format("{:.4f} s", required_number(d, "iteration_time_s"))},
      {"band", band_text(d)},
      {"model TFLOP/s per GPU", fmt::format("{:.1f}", d.value("tflops_per_gpu", 0.0))},
      {"MFU", fmt::format("{:.1f} %", 100 * d.value("mfu", 0.0))},
      {"bubble (mean of stages)", fmt::format("{:.1f} %", 100 * d.value("bubble_fraction", 0.0))},
      {"memory per GPU",
       fmt::format("{:.1f} GiB of {:.0f} GiB ({})", memory.value("peak_bytes", 0.0) / kGiB,
                   memory.value("capacity_bytes", 0.0) / kGiB, memory.value("fits", false) ? "fits" : "does NOT fit")}};
  if (d.contains("training")) {
    const json& t = d.at("training");
    std::string line = fmt::format("{:.3g} tokens in {:.1f} days, {:.3g} GPU-hours", t.value("tokens", 0.0),
                                   t.value("days", 0.0), t.value("gpu_hours", 0.0));
    if (t.contains("cost_usd")) line += fmt::format(", ${:.3g}", t.value("cost_usd", 0.0));
    facts_list.emplace_back("training run", line);
  }
  return section("summary", "Summary", facts(facts_list));
}

std::vector<double> stage_split(const json& stage) {
  return split_seconds(stage.value("time_split", json::object()), 0);
}

std::string sim_time_split(const json& d) {
  const double seconds = required_number(d, "iteration_time_s");
  std::vector<StackedBar> bars = {{"mean of stages", split_seconds(d.value("time_split", json::object()), seconds)}};
  for (const json& stage : required(d, "stages")) {
    bars.push_back(
        {fmt::format("stage {} (rank {})", stage.value("stage", 0), stage.value("rank", 0)), stage_split(stage)});
  }
  return section("time-split", "Where the iteration goes",
                 "<p class=\"note\">The compute stream of each stage's representative rank, each instant counted "
                 "once (report/summary.hpp).</p>\n<div class=\"scroll\">" +
                     stacked_bars(bars, time_split_parts(), "s") + "</div>\n");
}

std::string sim_stages(const json& d) {
  const double seconds = required_number(d, "iteration_time_s");
  std::vector<std::string> header = {"stage", "rank", "busy s", "bubble %"};
  for (const Part& part : time_split_parts()) header.push_back(part.name + " %");
  std::vector<std::vector<std::string>> rows;
  for (const json& stage : required(d, "stages")) {
    std::vector<std::string> row = {std::to_string(stage.value("stage", 0)), std::to_string(stage.value("rank", 0)),
                                    fmt::format("{:.4f}", stage.value("busy_s", 0.0)),
                                    fmt::format("{:.1f}", 100 * stage.value("bubble_fraction", 0.0))};
    for (const double part : stage_split(stage))
      row.push_back(fmt::format("{:.1f}", seconds > 0 ? 100 * part / seconds : 0));
    rows.push_back(std::move(row));
  }
  return section("stages", "Stages", table(header, rows));
}

std::string sim_pipeline(const json& d) {
  const auto found = d.find("pipeline");
  if (found == d.end()) {
    return section("pipeline", "Pipeline",
                   "<p class=\"note\">This summary has no \"pipeline\" (written by a twin sim before it kept one): "
                   "simulate again with twin sim --json to draw it.</p>\n");
  }
  const Pipeline pipeline = pipeline_from_json(*found, required(d, "scenario").value("name", ""));
  PipelineLayout layout;
  layout.row_per_chunk = layout.fit_boxes = layout.escape_text = true;
  return section("pipeline", "Pipeline",
                 "<p class=\"note\">One row per stage and model chunk, time to the right; each box a micro-batch's "
                 "forward or backward pass (numbered from 1), white is bubble. Scroll sideways on long "
                 "iterations.</p>\n<div class=\"scroll\">" +
                     pipeline_svg(pipeline, layout) + "</div>\n");
}

std::string compared_rows(const json& values) {
  std::vector<std::vector<std::string>> rows;
  for (const json& v : values) {
    const json& error = v.at("error");
    rows.push_back({v.value("name", ""), fmt::format("{:.4g}", v.value("predicted", 0.0)),
                    fmt::format("{:.4g}", v.value("measured", 0.0)),
                    error.is_number() ? fmt::format("{:+.1f}", 100 * error.get<double>()) : "-"});
  }
  return table({"", "predicted", "measured", "error %"}, rows);
}

}  // namespace

const json& required(const json& document, const char* key) {
  const auto found = document.find(key);
  if (found == document.end() || found->is_null()) throw ReportError(fmt::format("the field \"{}\" is missing", key));
  return *found;
}

double required_number(const json& document, const char* key) {
  const json& value = required(document, key);
  if (!value.is_number()) throw ReportError(fmt::format("the field \"{}\" is not a number", key));
  return value.get<double>();
}

std::vector<double> split_seconds(const json& split, double iteration_time_s) {
  std::vector<double> out;
  for (const char* key : {"compute", "tp", "cp", "ep", "dp", "pp", "host", "bubble"}) {
    const std::string seconds_key = std::string(key) + "_s";
    if (split.contains(seconds_key)) {
      out.push_back(split.value(seconds_key, 0.0));
    } else {
      out.push_back(split.value(key, 0.0) * iteration_time_s);
    }
  }
  return out;
}

std::string sim_sections(const json& document) {
  return sim_summary(document) + sim_time_split(document) + sim_stages(document) + sim_pipeline(document);
}

std::string compare_sections(const json& d) {
  const json& totals = required(d, "totals");
  std::vector<std::pair<std::string, std::string>> facts_list = {{"predicted by", d.value("predicted_engine", "")},
                                                                 {"measured by", d.value("measured_engine", "")}};
  std::vector<Pair> pairs;
  for (const json& v : totals) {
    const json& error = v.at("error");
    const std::string error_text = error.is_number() ? fmt::format("{:+.1f} %", 100 * error.get<double>()) : "-";
    const std::string name = v.value("name", "");
    if (name.find("iteration time") != std::string::npos) {
      facts_list.emplace_back("iteration time",
                              fmt::format("{:.4g} s predicted, {:.4g} s measured ({})", v.value("predicted", 0.0),
                                          v.value("measured", 0.0), error_text));
    }
    pairs.push_back(
        {name, v.value("predicted", 0.0), v.value("measured", 0.0),
         fmt::format("{:.4g} / {:.4g} ({})", v.value("predicted", 0.0), v.value("measured", 0.0), error_text)});
  }
  for (const json& mismatch : d.value("mismatches", json::array()))
    facts_list.emplace_back("differs", mismatch.get<std::string>());
  for (const json& note : d.value("notes", json::array())) facts_list.emplace_back("note", note.get<std::string>());
  const char* per = d.contains("ranks") ? "ranks" : "stages";
  const json per_part = d.value(per, json::array());
  std::string details = per_part.empty() ? fmt::format(
                                               "<p class=\"note\">The measurement has no times per {} (a log "
                                               "or an iteration time: the totals alone).</p>\n",
                                               per == std::string("ranks") ? "rank" : "stage")
                                         : compared_rows(per_part);
  if (!d.value("kinds", json::array()).empty())
    details += "<h3>Compute by kernel kind (s)</h3>\n" + compared_rows(d.at("kinds"));
  return section("summary", "Summary", facts(facts_list)) +
         section("predicted-vs-measured", "Predicted against measured",
                 "<p class=\"note\">Each pair scaled to its larger value; error relative to the measurement.</p>\n" +
                     paired_bars(pairs)) +
         section("stages", d.contains("ranks") ? "Ranks" : "Stages", details);
}

}  // namespace twin::report::html
