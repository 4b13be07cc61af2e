// The zero-bubble schedule's rules (parallel.schedule = "zb-h1"): where its split of each backward into B and W is
// defined, and where a plan runs something the split does not cover yet, refused by name.
#include <fmt/format.h>

#include "model/scenario/scenario_rules.hpp"

namespace twin::model {

void check_zero_bubble(const Scenario& scenario, std::vector<std::string>& problems) {
  const ParallelSpec& p = scenario.parallel;
  if (p.schedule != ScheduleKind::ZeroBubbleH1) return;
  const std::string& src = scenario.source;
  const std::string key = "parallel.schedule = \"zb-h1\"";
  // With one stage there is no bubble for the deferred W to fill: the schedule would be 1F1B by another name.
  if (p.pp < 2) problems.push_back(fmt::format("{}: {} needs parallel.pp >= 2, got {}", src, key, p.pp));
  if (scenario.framework.name != Framework::Megatron) {
    // The reference implementation (sail-sg/zero-bubble-pipeline-parallelism) is a Megatron-LM fork; DeepSpeed's
    // TrainSchedule and Composer have no B/W split.
    problems.push_back(fmt::format("{}: {} runs in framework.name = \"megatron\" (the paper's implementation is a "
                                   "Megatron-LM fork), got \"{}\"",
                                   src, key, to_string(scenario.framework.name)));
  }
  if (scenario.model.fp8 != Fp8Format::None) {
    problems.push_back(fmt::format("{}: {} does not split FP8 GEMMs into B and W: set model.fp8 = \"none\"", src, key));
  }
  if (scenario.shards_parameters()) {
    problems.push_back(fmt::format("{}: {} with parallel.zero_stage = 3: FSDP reduce-scatters each layer's gradient "
                                   "after its backward, before a deferred W has added to it",
                                   src, key));
  }
  if (p.zero_stage == 2) {
    problems.push_back(fmt::format("{}: {} with parallel.zero_stage = 2: ZeRO-2 reduce-scatters each micro-batch's "
                                   "gradients after its backward, before a deferred W has made them",
                                   src, key));
  }
  if (scenario.framework.moe_a2a_overlap) {
    problems.push_back(fmt::format("{}: {} and framework.moe_a2a_overlap (the combined 1F1B) are two schedules: pick "
                                   "one",
                                   src, key));
  }
}

}  // namespace twin::model
