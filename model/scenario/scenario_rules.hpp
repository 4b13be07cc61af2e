// The rules a valid scenario obeys (model/scenario/scenario_rules.cpp), for the TOML reader, which checks them once the fields
// were read. Internal to model/: everyone else calls validation_problems (scenario.hpp).
#pragma once

#include <string>
#include <vector>

#include "model/scenario/scenario.hpp"

namespace twin::model {

// Every rule `scenario` breaks; `check_world_size` false leaves out whether the plan fills the cluster (when dp could
// not be derived, the reader has said why already).
std::vector<std::string> scenario_rule_violations(const Scenario& scenario, bool check_world_size);

// Which sizes the general rules found valid, so that a later rule divides only by those.
struct SizesKnown {
  bool layers = false, hidden = false, tp = false, dp = false;
};
// Mixture-of-Experts' rules (model/scenario/scenario_rules_moe.cpp), appended to `problems`.
void check_mixture_of_experts(const Scenario& scenario, SizesKnown known, std::vector<std::string>& problems);
// The reliability keys' rules (model/scenario/scenario_rules_goodput.cpp), appended to `problems`.
void check_failure_model(const Scenario& scenario, std::vector<std::string>& problems);
// The zero-bubble schedule's rules (model/scenario/scenario_rules_schedule.cpp), appended to `problems`.
void check_zero_bubble(const Scenario& scenario, std::vector<std::string>& problems);
// framework.fp8_param_gather's rules (model/scenario/scenario_rules_memory.cpp), appended to `problems`.
void check_fp8_param_gather(const Scenario& scenario, std::vector<std::string>& problems);
// framework.cuda_graphs's and framework.transformer_engine's rules (model/scenario/scenario_rules_host.cpp),
// appended to `problems`.
void check_cuda_graphs(const Scenario& scenario, std::vector<std::string>& problems);
void check_transformer_engine(const Scenario& scenario, std::vector<std::string>& problems);

}  // namespace twin::model
