// parallel.schedule = "dualpipe" as data (model/plan/schedule.hpp): DeepSeek-V3's bidirectional DualPipe
// (deepseek-ai/DualPipe at 3da1bbe, dualpipe.py, DualPipe.step), its order pinned on 2 stages by hand and its
// invariants on more.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "model/plan/schedule.hpp"

namespace twin::model {
namespace {

// "F0 B0 F2.1 W0" : F/B/W, micro-batch, optional .chunk; a trailing "~" marks a forward overlapped with its backward.
std::string render_dualpipe(const StageSchedule& steps) {
  std::string out;
  for (const auto& step : steps) {
    if (!out.empty()) out += ' ';
    const char* pass = step.pass == Pass::Forward ? "F" : step.pass == Pass::Backward ? "B" : "W";
    out += pass + std::to_string(step.micro_batch);
    if (step.chunk > 0) out += "." + std::to_string(step.chunk);
    if (step.overlapped) out += "~";
  }
  return out;
}

// dualpipe.py on 2 ranks, 4 micro-batches (2 each way), traced by hand: both ranks are its middle ranks (half_rank 0
// of 1), so step 2 runs one F of each phase, step 4 once (its first F and B apart, then F1 overlapped with B0), step 6
// once (B1 whole, B0 zero-bubble), step 8 the queued W. Rank 0's phase 0 is the down pipeline (chunk 0, micro-batches
// 0 and 1), rank 1's the up one (chunk 1, micro-batches 2 and 3).
TEST(DualPipe, TwoStagesFourMicroBatchesAsDualpipePyRunsThem) {
  const auto schedule = build_schedule(ScheduleKind::DualPipe, 2, 4, 2);
  EXPECT_EQ(render_dualpipe(schedule[0]), "F0 F2.1 F1 B2.1 W2.1 F3.1~ B0 W0 B3.1 W3.1 B1 W1");
  EXPECT_EQ(render_dualpipe(schedule[1]), "F2.1 F0 F3.1 B0 W0 F1~ B2.1 W2.1 B1 W1 B3.1 W3.1");
}

// dualpipe.py asserts num_ranks % 2 == 0 and num_chunks % 2 == 0 and num_chunks >= num_ranks * 2.
TEST(DualPipe, RefusesOddStagesOddOrFewMicroBatches) {
  EXPECT_THROW(build_schedule(ScheduleKind::DualPipe, 3, 6, 2), std::invalid_argument);
  EXPECT_THROW(build_schedule(ScheduleKind::DualPipe, 4, 9, 2), std::invalid_argument);
  EXPECT_THROW(build_schedule(ScheduleKind::DualPipe, 4, 6, 2), std::invalid_argument);
  EXPECT_THROW(build_schedule(ScheduleKind::DualPipe, 4, 8, 1), std::invalid_argument);
  EXPECT_NO_THROW(build_schedule(ScheduleKind::DualPipe, 4, 8, 2));
}

// Every F, B and W of each micro-batch once, on its direction's chunk only, each W after its B; stage s and stage
// p - 1 - s mirror each other (the same steps with the directions swapped); p + 1 chunks' activations at the peak on
// every stage: the DualPipe README's "PP + 1".
TEST(DualPipe, EveryPassOnceMirroredWithItsTablesPeakActivations) {
  for (int p : {2, 4, 6, 8}) {
    for (int m = 2 * p; m <= 3 * p; m += 2) {
      const auto schedule = build_schedule(ScheduleKind::DualPipe, p, m, 2);
      for (int stage = 0; stage < p; ++stage) {
        std::vector<int> seen(3 * m, 0);
        std::vector<int> backward_done(m, 0);
        for (const auto& step : schedule[stage]) {
          EXPECT_EQ(step.chunk, step.micro_batch < m / 2 ? 0 : 1) << "the down half on chunk 0, the up half on 1";
          ++seen[static_cast<int>(step.pass) * m + step.micro_batch];
          if (step.pass == Pass::Backward) backward_done[step.micro_batch] = 1;
          if (step.pass == Pass::WeightGrad) {
            EXPECT_TRUE(backward_done[step.micro_batch]) << "W before its B";
          }
        }
        for (int count : seen) ASSERT_EQ(count, 1) << "p=" << p << " m=" << m;
        EXPECT_EQ(max_in_flight(schedule[stage]), p + 1) << "p=" << p << " m=" << m << " stage " << stage;
        const StageSchedule& mirror = schedule[p - 1 - stage];
        ASSERT_EQ(mirror.size(), schedule[stage].size());
        for (std::size_t i = 0; i < mirror.size(); ++i) {
          const PipelineStep& step = schedule[stage][i];
          const PipelineStep swapped{(step.micro_batch + m / 2) % m, 1 - step.chunk, step.pass, step.overlapped};
          EXPECT_EQ(mirror[i], swapped) << "p=" << p << " m=" << m << " stage " << stage << " step " << i;
        }
      }
    }
  }
}

// The closed form twin search orders plans by: (p/2 - 1) F idle against m (F + B + W) busy, in a block's times.
TEST(DualPipe, IdealBubbleFraction) {
  ParallelSpec parallel;
  parallel.schedule = ScheduleKind::DualPipe;
  parallel.pp = 8;
  parallel.virtual_stages = 2;
  parallel.global_batch = 16;
  EXPECT_DOUBLE_EQ(ideal_bubble_fraction(parallel), 3.0 / (3 * 16 + 3));
  parallel.pp = 2;  // one stage per direction's half: no bubble
  EXPECT_DOUBLE_EQ(ideal_bubble_fraction(parallel), 0.0);
}

}  // namespace
}  // namespace twin::model
