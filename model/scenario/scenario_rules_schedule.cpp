// The zero-bubble schedules' rules (parallel.schedule = "zb-h1", "zb-v", "dualpipev", "dualpipe"): where their split
// of each backward into B and W is defined, and where a plan runs something the split does not cover yet, refused by
// name.
#include <fmt/format.h>

#include "model/scenario/scenario_rules.hpp"

namespace twin::model {
namespace {

// ZB-V's and DualPipeV's two chunks per stage in a V (ParallelSpec::virtual_stage): exactly two, each stage's layers split evenly
// between them (the uneven ends and the interleaved schedule's groups place layers by the interleaved order).
void check_v_shape(const Scenario& scenario, const std::string& key, std::vector<std::string>& problems) {
  const ParallelSpec& p = scenario.parallel;
  const std::string& src = scenario.source;
  if (p.virtual_stages != 2) {
    problems.push_back(fmt::format("{}: {} needs parallel.virtual_stages = 2 (two chunks per stage in a V), got {}",
                                   src, key, p.virtual_stages));
  }
  if (p.first_stage_layers > 0 || p.last_stage_layers > 0) {
    problems.push_back(fmt::format("{}: {} splits layers evenly over its V: parallel.first_stage_layers and "
                                   "parallel.last_stage_layers must be 0",
                                   src, key));
  }
  // dualpipev.py asserts num_chunks >= num_ranks * 2: its steps 4 would run a negative number of times.
  const bool batch_ok = p.dp > 0 && p.micro_batch > 0 && p.global_batch % (p.dp * p.micro_batch) == 0;
  if (p.schedule == ScheduleKind::DualPipeV && batch_ok && p.micro_batches() < 2 * p.pp) {
    problems.push_back(fmt::format("{}: {} needs at least 2 * parallel.pp ({}) micro-batches per pipeline, got {}",
                                   src, key, 2 * p.pp, p.micro_batches()));
  }
  // Its overlapped pairs merge a forward and a backward layer by layer where the model has expert all-to-alls to hide
  // (model/program/moe_a2a_overlap.hpp, overlaps_pairs), as Megatron-Core's combined 1F1B does, which recomputes no
  // whole layer (scenario_rules_moe.cpp).
  if (p.schedule == ScheduleKind::DualPipeV && scenario.model.is_moe() && p.ep > 1 &&
      (p.recompute == Recompute::Full || p.recompute_num_layers != 0)) {
    problems.push_back(fmt::format("{}: {} overlaps each forward with a backward layer by layer, without full "
                                   "recompute: set parallel.recompute to \"none\" or \"selective\"",
                                   src, key));
  }
  if (p.microbatch_group != 0) {
    problems.push_back(fmt::format("{}: {} has no micro-batch groups: parallel.microbatch_group must be 0, got {}",
                                   src, key, p.microbatch_group));
  }
}

// DualPipe's two directions (ParallelSpec::bidirectional): dualpipe.py asserts an even number of ranks and of
// micro-batches (half enter at each end), and at least two per rank; each direction splits the model into pp blocks,
// one per stage, evenly or with the end blocks parallel.first_stage_layers and last_stage_layers give.
void check_dual_pipe(const Scenario& scenario, const std::string& key, std::vector<std::string>& problems) {
  const ParallelSpec& p = scenario.parallel;
  const std::string& src = scenario.source;
  if (p.virtual_stages != 2) {
    problems.push_back(fmt::format("{}: {} needs parallel.virtual_stages = 2 (a block of each direction per stage), "
                                   "got {}",
                                   src, key, p.virtual_stages));
  }
  if (p.pp % 2 != 0) {
    problems.push_back(fmt::format("{}: {} needs an even parallel.pp (dualpipe.py pairs stage s with pp - 1 - s), "
                                   "got {}",
                                   src, key, p.pp));
  }
  const bool batch_ok = p.dp > 0 && p.micro_batch > 0 && p.global_batch % (p.dp * p.micro_batch) == 0;
  if (batch_ok && (p.micro_batches() % 2 != 0 || p.micro_batches() < 2 * p.pp)) {
    problems.push_back(fmt::format("{}: {} needs an even number of micro-batches per pipeline, at least 2 * "
                                   "parallel.pp ({}), half entering at each end; got {}",
                                   src, key, 2 * p.pp, p.micro_batches()));
  }
  // Uneven end blocks (parallel.first_stage_layers / last_stage_layers) size each direction's first and last block;
  // both end stages hold one of each, so the two stay alike. Megatron's account_for_* counts the embedding and the
  // loss as layers of one end stage each, which DualPipe's two directions would put on both ends twice.
  if (p.account_for_embedding || p.account_for_loss) {
    problems.push_back(fmt::format("{}: {} splits each direction's layers over the stages without counting the "
                                   "embedding and loss as layers: parallel.account_for_embedding and "
                                   "account_for_loss must be unset (parallel.first_stage_layers and "
                                   "last_stage_layers size its end blocks)",
                                   src, key));
  }
  if (p.microbatch_group != 0) {
    problems.push_back(fmt::format("{}: {} has no micro-batch groups: parallel.microbatch_group must be 0, got {}",
                                   src, key, p.microbatch_group));
  }
  // Its F&B pairs merge as DualPipeV's do (overlaps_pairs), with the same limit.
  if (scenario.model.is_moe() && p.ep > 1 && (p.recompute == Recompute::Full || p.recompute_num_layers != 0)) {
    problems.push_back(fmt::format("{}: {} overlaps each forward with a backward layer by layer, without full "
                                   "recompute: set parallel.recompute to \"none\" or \"selective\"",
                                   src, key));
  }
}

}  // namespace

void check_zero_bubble(const Scenario& scenario, std::vector<std::string>& problems) {
  const ParallelSpec& p = scenario.parallel;
  if (p.schedule != ScheduleKind::ZeroBubbleH1 && !p.v_shape() && !p.bidirectional()) return;
  const std::string& src = scenario.source;
  const std::string key = fmt::format("parallel.schedule = \"{}\"", to_string(p.schedule));
  if (p.v_shape()) check_v_shape(scenario, key, problems);
  if (p.bidirectional()) check_dual_pipe(scenario, key, problems);
  // With one stage there is no bubble for the deferred W to fill: the schedule would be 1F1B by another name.
  if (p.pp < 2) problems.push_back(fmt::format("{}: {} needs parallel.pp >= 2, got {}", src, key, p.pp));
  if (scenario.framework.name != Framework::Megatron) {
    // The reference implementation (sail-sg/zero-bubble-pipeline-parallelism) is a Megatron-LM fork; DeepSpeed's
    // TrainSchedule and Composer have no B/W split.
    problems.push_back(fmt::format("{}: {} runs in framework.name = \"megatron\" (the paper's implementation is a "
                                   "Megatron-LM fork), got \"{}\"",
                                   src, key, to_string(scenario.framework.name)));
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
