// Rows of sweeps and searches: the plan or the varied values first, then what the simulation said.
#include "report/plan_documents.hpp"

namespace twin::report {

nlohmann::json sweep_row_json(const SweepRow& row, bool goodput, bool training) {
  nlohmann::json set = nlohmann::json::object();
  for (const auto& [key, value] : row.set) set[key] = value;
  nlohmann::json entry{{"set", set},
                       {"gpus", row.gpus},
                       {"iteration_time_s", 0.0},
                       {"tflops_per_gpu", 0.0},
                       {"bubble_fraction", 0.0},
                       {"memory_per_gpu_bytes", 0.0},
                       {"fits", false},
                       {"tokens_per_s", 0.0}};
  if (row.error.empty()) {
    const auto& summary = row.summary;
    const double seconds = summary.at("iteration_time_s").get<double>();
    entry["iteration_time_s"] = seconds;
    entry["tflops_per_gpu"] = summary.at("tflops_per_gpu").get<double>();
    entry["bubble_fraction"] = summary.at("bubble_fraction").get<double>();
    entry["time_split"] = summary.value("time_split", nlohmann::json::object());
    entry["memory_per_gpu_bytes"] = summary.at("memory_per_gpu_bytes").get<double>();
    entry["fits"] = summary.at("memory").at("fits").get<bool>();
    entry["tokens_per_s"] = seconds > 0 ? row.tokens_per_iteration / seconds : 0.0;
    if (goodput) entry["goodput"] = summary.at("goodput");
    if (training) entry["training"] = summary.at("training");
  }
  entry["error"] = row.error;
  return entry;
}

nlohmann::json sweep_document(const std::string& model_name, const std::vector<std::string>& varied,
                              const nlohmann::json& variants) {
  return nlohmann::json{{"scenario", model_name}, {"varied", varied}, {"variants", variants}};
}

nlohmann::json search_row_json(const SearchRow& row, bool training, bool goodput) {
  const model::Plan& plan = row.plan;
  const bool simulated = row.error.empty();
  const auto number = [&](const char* key) { return simulated ? row.summary.at(key).get<double>() : 0.0; };
  nlohmann::json entry{
      {"node", row.node},
      {"nodes", row.nodes},
      {"tp", plan.tp},
      {"pp", plan.pp},
      {"dp", plan.dp},
      {"cp", plan.cp},
      {"ep", plan.ep},
      {"etp", plan.etp},
      {"micro_batch", plan.micro_batch},
      {"schedule", model::to_string(plan.schedule)},
      {"virtual_stages", plan.chunks},
      {"recompute", model::to_string(plan.recompute)},
      {"recompute_num_layers", plan.recompute_layers},
      {"sequence_parallel", plan.sequence_parallel},
      {"zero_stage", plan.zero_stage},
      {"overlap_param_gather", plan.overlap_param_gather},
      {"memory_per_gpu_bytes", plan.peak_memory_bytes},
      {"fits", simulated && row.summary.at("memory").at("fits").get<bool>()},
      {"iteration_time_s", number("iteration_time_s")},
      {"iteration_time_bound_s", plan.iteration_time_bound_s},
      {"tflops_per_gpu", number("tflops_per_gpu")},
      {"bubble_fraction", number("bubble_fraction")},
      {"time_split", simulated ? row.summary.value("time_split", nlohmann::json::object()) : nlohmann::json::object()},
      {"error", row.error}};
  if (training && simulated) entry["training"] = row.summary.at("training");
  if (goodput && simulated) entry["goodput"] = row.summary.at("goodput");
  return entry;
}

nlohmann::json search_document(const std::string& model_name, const nlohmann::json& plans, const SearchCounts& counts,
                               const std::string& memory_headroom, bool explain,
                               const std::vector<model::Rejection>& rejections) {
  nlohmann::json document{{"scenario", model_name},
                          {"plans", plans},
                          {"plans_enumerated", counts.enumerated},
                          {"plans_pruned_rules", counts.invalid},
                          {"plans_pruned_memory", counts.pruned_memory},
                          {"plans_pruned_bound", counts.pruned_bound},
                          {"plans_simulated", counts.simulated},
                          {"plans_that_fit", counts.that_fit},
                          {"rejected_for_memory", counts.pruned_memory},
                          {"memory_headroom", memory_headroom}};
  if (explain) {
    nlohmann::json rejected = nlohmann::json::array();
    for (const model::Rejection& r : rejections) {
      rejected.push_back({{"plan", r.plan}, {"reason", r.reason}, {"memory", r.memory}});
    }
    document["rejected"] = rejected;
  }
  return document;
}

}  // namespace twin::report
