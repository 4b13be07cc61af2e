// The memory keys' rules that stand apart from the plan's: where Megatron-Core's --fp8-param-gather applies.
#include <fmt/format.h>

#include "model/scenario/scenario_rules.hpp"

namespace twin::model {

// Megatron-Core's --fp8-param-gather: FP8 weights, gathered by the distributed optimizer ("--fp8-param-gather only
// supported with distributed optimizer", megatron/training/arguments.py).
void check_fp8_param_gather(const Scenario& scenario, std::vector<std::string>& problems) {
  if (!scenario.framework.fp8_param_gather) return;
  const std::string& src = scenario.source;
  const std::string needs = "framework.fp8_param_gather is Megatron-Core's --fp8-param-gather: it needs";
  if (scenario.framework.name != Framework::Megatron) {
    problems.push_back(
        fmt::format("{}: {} framework.name = \"megatron\", got \"{}\"", src, needs, to_string(scenario.framework.name)));
  }
  if (scenario.model.fp8 == Fp8Format::None) {
    problems.push_back(fmt::format("{}: {} FP8 training (model.fp8)", src, needs));
  }
  if (scenario.parallel.zero_stage != 1) {
    problems.push_back(fmt::format("{}: {} the distributed optimizer, parallel.zero_stage = 1, got {}", src, needs,
                                   scenario.parallel.zero_stage));
  }
}

}  // namespace twin::model
