// The search's lower bound in closed form (model/program/iteration_bound.hpp): with equal stages it is the busiest
// stage's GEMM work over 1 - the ideal bubble, the LM head's stage adds its own, full recompute one more forward, and a
// zero-bubble schedule is given no drain.
#include <gtest/gtest.h>

#include "model/plan/schedule.hpp"
#include "model/program/iteration_bound.hpp"
#include "tests/model/test_scenarios.hpp"

namespace twin::model {
namespace {

constexpr double kRate = 1e14;  // FLOP/s; any rate: the bound is FLOPs over it

// 8 layers of h = 1024 on 4 stages, 8 micro-batches; a vocabulary of 256 (Megatron's padding keeps it at tp 1 and 2),
// whose LM head (2 h V per token) is 2 % of a layer's 24 h^2.
Scenario four_stages() { return testing::make_scenario(8, 1024, 16, 1024, 256, 1, 4, 1, 1, 8); }

// One layer's weight GEMMs for one micro-batch, forward: 2 x (3h h + h h + 4h h + 4h h) = 24 h^2 per token.
double layer_forward_s(const Scenario& s) {
  const double h = static_cast<double>(s.model.hidden), tokens = static_cast<double>(s.model.seq_len);
  return 24 * h * h * tokens / kRate;
}

TEST(IterationBound, EqualStagesGiveTheIdealBubble) {
  const Scenario s = four_stages();
  const double head_s = virtual_stage_forward_gemm_flops(s, 3) / kRate - 2 * layer_forward_s(s);  // the LM head
  EXPECT_GT(head_s, 0);
  EXPECT_LT(head_s, 0.03 * layer_forward_s(s));
  const double busiest_s = 8 * 3 * (2 * layer_forward_s(s) + head_s);  // the last stage: m x (F + 2F)
  const double bound_s = iteration_time_lower_bound_s(s, kRate);
  // The last stage's work, after the fill of the three before it and before their drain (3 x 2 layers, F + 2F).
  EXPECT_NEAR(bound_s, busiest_s + 3 * 3 * 2 * layer_forward_s(s), 1e-12);
  // The ideal bubble's form charges the head on every stage's fill and drain: 1 % covers its 2 % of one layer.
  EXPECT_NEAR(bound_s, busiest_s / (1 - ideal_bubble_fraction(s.parallel)), 1e-2 * bound_s);
}

TEST(IterationBound, InterleavingShortensTheFillAndRecomputeAddsAForward) {
  const Scenario plain = four_stages();
  Scenario interleaved = plain;
  interleaved.parallel.schedule = ScheduleKind::Interleaved;
  interleaved.parallel.virtual_stages = 2;
  const double f = layer_forward_s(plain);
  // Stage 3 holds virtual stages 3 and 7 (one layer each); its first chunk waits for virtual stages 0-2.
  EXPECT_NEAR(iteration_time_lower_bound_s(interleaved, kRate), iteration_time_lower_bound_s(plain, kRate) - 9 * f,
              1e-3 * f);
  Scenario recomputed = plain;
  recomputed.parallel.recompute = Recompute::Full;
  EXPECT_NEAR(iteration_time_lower_bound_s(recomputed, kRate) - iteration_time_lower_bound_s(plain, kRate),
              8 * 2 * f, 1e-3 * f);  // m x the stage's 2 layers, once more forward; the drain has no recompute
}

TEST(IterationBound, ZeroBubbleSchedulesHaveNoDrainAndTpDividesTheWork) {
  const Scenario plain = four_stages();
  Scenario zero_bubble = plain;
  zero_bubble.parallel.schedule = ScheduleKind::ZeroBubbleH1;
  const double f = layer_forward_s(plain);
  EXPECT_NEAR(iteration_time_lower_bound_s(plain, kRate) - iteration_time_lower_bound_s(zero_bubble, kRate),
              3 * 2 * 2 * f, 1e-3 * f);  // the three earlier stages' backward (2F each of 2 layers)
  Scenario tensor_parallel = plain;
  tensor_parallel.parallel.tp = 2;
  EXPECT_NEAR(iteration_time_lower_bound_s(tensor_parallel, kRate), iteration_time_lower_bound_s(plain, kRate) / 2,
              1e-3 * f);
}

// DualPipe: each chunk (a block of 2 layers) runs its direction's m / 2 = 4 micro-batches, 2 x 4 x 3 x 2 F = 48 F a
// stage, as 1F1B's; a middle stage's nearer direction reaches it after one block's forward, 2 F, and there is no drain:
// 50 F, the busy time over 1 - (p/2 - 1) / (3m + p/2 - 1) = 24/25. The end stages' heads (2 % of a layer each) stay
// below that fill.
TEST(IterationBound, DualPipeRunsHalfTheMicroBatchesOnEachChunk) {
  Scenario dual = four_stages();
  dual.parallel.schedule = ScheduleKind::DualPipe;
  dual.parallel.virtual_stages = 2;
  const double f = layer_forward_s(dual);
  EXPECT_NEAR(iteration_time_lower_bound_s(dual, kRate), 50 * f, 1e-3 * f);
  EXPECT_NEAR(iteration_time_lower_bound_s(dual, kRate), 48 * f / (1 - ideal_bubble_fraction(dual.parallel)),
              1e-3 * f);
}

}  // namespace
}  // namespace twin::model
