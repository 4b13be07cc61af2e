#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "model/plan/schedule.hpp"

namespace twin::model {
namespace {

// "F0 B0 F1.1 W0" : F/B/W, micro-batch, optional .chunk
std::string render(const StageSchedule& steps) {
  std::string out;
  for (const auto& step : steps) {
    if (!out.empty()) out += ' ';
    const char* pass = step.pass == Pass::Forward ? "F" : step.pass == Pass::Backward ? "B" : "W";
    out += pass + std::to_string(step.micro_batch);
    if (step.chunk > 0) out += "." + std::to_string(step.chunk);
  }
  return out;
}

TEST(Schedule, GPipeRunsAllForwardsThenAllBackwards) {
  const auto schedule = build_schedule(ScheduleKind::GPipe, 2, 3, 1);
  EXPECT_EQ(render(schedule[0]), "F0 F1 F2 B0 B1 B2");
  EXPECT_EQ(render(schedule[1]), "F0 F1 F2 B0 B1 B2");
}

TEST(Schedule, OneFOneBMatchesMegatronOnFourStages) {
  const auto schedule = build_schedule(ScheduleKind::OneFOneB, 4, 8, 1);
  EXPECT_EQ(render(schedule[0]), "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  EXPECT_EQ(render(schedule[2]), "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7");
  EXPECT_EQ(render(schedule[3]), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
}

TEST(Schedule, OneFOneBWithFewerMicroBatchesThanStages) {
  const auto schedule = build_schedule(ScheduleKind::OneFOneB, 4, 2, 1);
  EXPECT_EQ(render(schedule[0]), "F0 F1 B0 B1");
  EXPECT_EQ(render(schedule[3]), "F0 B0 F1 B1");
}

TEST(Schedule, InterleavedMatchesTheStyleGuideTable) {
  // p = 2, m = 4, v = 2: forward micro-batches 0 1 0 1 2 3 2 3 on chunks 0 0 1 1 0 0 1 1; backward chunks reversed.
  const auto schedule = build_schedule(ScheduleKind::Interleaved, 2, 4, 2);
  EXPECT_EQ(render(schedule[0]), "F0 F1 F0.1 F1.1 F2 B0.1 F3 B1.1 F2.1 B0 F3.1 B1 B2.1 B3.1 B2 B3");
  EXPECT_EQ(render(schedule[1]), "F0 F1 F0.1 B0.1 F1.1 B1.1 F2 B0 F3 B1 F2.1 B2.1 F3.1 B3.1 B2 B3");
  EXPECT_EQ(warmup_steps(ScheduleKind::Interleaved, 0, 2, 4, 2), 4);
  EXPECT_EQ(warmup_steps(ScheduleKind::Interleaved, 1, 2, 4, 2), 2);
}

TEST(Schedule, InterleavedWithAsManyMicroBatchesAsStagesIsAllWarmup) {
  const auto schedule = build_schedule(ScheduleKind::Interleaved, 2, 2, 2);
  EXPECT_EQ(render(schedule[1]), "F0 F1 F0.1 F1.1 B0.1 B1.1 B0 B1");
}

TEST(Schedule, EveryStepRunsExactlyOnce) {
  for (auto kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved}) {
    for (int p : {1, 2, 3, 4, 8}) {
      for (int m = 1; m <= 16; ++m) {
        for (int v : {1, 2, 3}) {
          if ((kind == ScheduleKind::Interleaved) != (v > 1) || (v > 1 && m % p != 0)) continue;
          const auto schedule = build_schedule(kind, p, m, v);
          for (int stage = 0; stage < p; ++stage) {
            std::vector<int> seen(2 * m * v, 0);
            for (const auto& step : schedule[stage]) {
              ++seen[(step.pass == Pass::Forward ? 0 : m * v) + step.chunk * m + step.micro_batch];
            }
            for (int count : seen) ASSERT_EQ(count, 1) << "p=" << p << " m=" << m << " v=" << v;
          }
        }
      }
    }
  }
}

TEST(Schedule, OneFOneBKeepsAtMostPMinusStageMicroBatchesInFlight) {
  for (int p : {1, 2, 4, 8}) {
    for (int m = 1; m <= 16; ++m) {
      const auto one_f_one_b = build_schedule(ScheduleKind::OneFOneB, p, m, 1);
      const auto gpipe = build_schedule(ScheduleKind::GPipe, p, m, 1);
      for (int stage = 0; stage < p; ++stage) {
        EXPECT_EQ(max_in_flight(one_f_one_b[stage]), std::min(p - stage, m)) << "p=" << p << " m=" << m;
        EXPECT_EQ(max_in_flight(gpipe[stage]), m);
      }
    }
  }
}

// Megatron-Core's combined 1F1B (framework.moe_a2a_overlap) runs one more warm-up forward and merges each steady
// forward with the backward after it, layer by layer in opposite orders: counted one step after the other the stage
// would hold one micro-batch more than 1F1B; merged it holds the same plus the one layer both have at once.
TEST(Schedule, AMergedForwardStashesItsLayersAsTheBackwardBesideItFreesTheirs) {
  const std::int64_t layers = 48;
  const auto plain = build_schedule(ScheduleKind::OneFOneB, 1, 4, 1);
  const auto combined = build_schedule(ScheduleKind::OneFOneB, 1, 4, 1, 0, 1);
  ASSERT_EQ(render(combined[0]), "F0 F1 B0 F2 B1 F3 B2 B3");
  const std::vector<bool> pairs = {false, true, false, true, false, true, false, false};
  EXPECT_EQ(max_in_flight_weighted(plain[0], {layers}), layers);
  EXPECT_EQ(max_in_flight_weighted(combined[0], {layers}), 2 * layers);  // one step after the other
  EXPECT_EQ(max_in_flight_weighted(combined[0], {layers}, pairs), layers + 1);
  EXPECT_EQ(max_in_flight_weighted(combined[0], {layers}, std::vector<bool>(8, false)), 2 * layers);
  // Chunks of unequal layers (interleaved, the first chunk with the embedding counted as a layer): a merged pair adds
  // what its forward stashes beyond what its backward frees.
  const StageSchedule uneven = {{0, 1, Pass::Forward}, {1, 0, Pass::Forward}, {0, 1, Pass::Backward},
                                {1, 0, Pass::Backward}};
  const std::vector<bool> middle = {false, true, false, false};
  EXPECT_EQ(max_in_flight_weighted(uneven, {5, 3}), 8);
  EXPECT_EQ(max_in_flight_weighted(uneven, {5, 3}, middle), 3 + (5 - 3) + 1);
  EXPECT_EQ(max_in_flight_weighted(uneven, {3, 5}), 8);
  EXPECT_EQ(max_in_flight_weighted(uneven, {3, 5}, middle), 5 + 0 + 1);  // its backward frees more than it stashes
}

// Megatron-Core's example of its tunable schedule table (schedules.py, forward_backward_pipelining_with_interleaving):
// PP 2, N 3, M 5, VP 2: forward micro-batches 0 1 2 0 1 2 3 4 3 4 on chunks 0 0 0 1 1 1 0 0 1 1.
TEST(Schedule, InterleavedInGroupsOfNMicroBatches) {
  const auto schedule = build_schedule(ScheduleKind::Interleaved, 2, 5, 2, 3);
  EXPECT_EQ(render(schedule[0]), "F0 F1 F2 F0.1 F1.1 F2.1 B0.1 F3 B1.1 F4 B2.1 F3.1 B0 F4.1 B1 B2 B3.1 B4.1 B3 B4");
  EXPECT_EQ(render(schedule[1]), "F0 F1 F2 F0.1 B0.1 F1.1 B1.1 F2.1 B2.1 F3 B0 F4 B1 F3.1 B2 F4.1 B3.1 B4.1 B3 B4");
  EXPECT_EQ(warmup_steps(ScheduleKind::Interleaved, 0, 2, 5, 2, 3), 5);  // 2 (p - 1) + (v - 1) N
  EXPECT_EQ(warmup_steps(ScheduleKind::Interleaved, 1, 2, 5, 2, 3), 3);
  // Groups of p are Megatron-LM's schedule whenever m is a multiple of p other than p itself.
  for (int m : {4, 6, 8})
    EXPECT_EQ(build_schedule(ScheduleKind::Interleaved, 2, m, 2, 2),
              build_schedule(ScheduleKind::Interleaved, 2, m, 2));
  // m == p: Megatron-LM ran all of it as warmup, Megatron-Core starts the last stage's 1F1B after (v - 1) N forwards.
  EXPECT_EQ(render(build_schedule(ScheduleKind::Interleaved, 2, 2, 2, 2)[1]), "F0 F1 F0.1 B0.1 F1.1 B1.1 B0 B1");
  // Any number of micro-batches: one group of all of them (N = m). Fewer than the stages (Llama 3): every forward
  // first, where Megatron-Core's warmup would leave a stage waiting.
  EXPECT_EQ(render(build_schedule(ScheduleKind::Interleaved, 2, 7, 2, 7)[1]),
            "F0 F1 F2 F3 F4 F5 F6 F0.1 B0.1 F1.1 B1.1 F2.1 B2.1 F3.1 B3.1 F4.1 B4.1 F5.1 B5.1 F6.1 B6.1 B0 B1 B2 B3 B4 "
            "B5 B6");
  EXPECT_EQ(render(build_schedule(ScheduleKind::Interleaved, 4, 3, 2, 3)[3]),
            "F0 F1 F2 F0.1 F1.1 F2.1 B0.1 B1.1 B2.1 B0 B1 B2");
}

// Every stage runs its steps in order; a forward waits for the previous virtual stage's forward of its micro-batch,
// a backward for the next virtual stage's backward (or its own forward on the last). No schedule may wait forever.
bool runs_to_the_end(const std::vector<StageSchedule>& schedule, int p, int m, int v) {
  std::vector<std::size_t> next(p, 0);
  std::vector<char> forward_done(m * p * v, 0), backward_done(m * p * v, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int stage = 0; stage < p; ++stage) {
      while (next[stage] < schedule[stage].size()) {
        const PipelineStep& step = schedule[stage][next[stage]];
        const int vs = step.chunk * p + stage, at = step.micro_batch * p * v + vs;
        const bool ready = step.pass == Pass::Forward ? vs == 0 || forward_done[at - 1]
                                                      : forward_done[at] && (vs == p * v - 1 || backward_done[at + 1]);
        if (!ready) break;
        (step.pass == Pass::Forward ? forward_done : backward_done)[at] = 1;
        ++next[stage];
        progress = true;
      }
    }
  }
  for (int stage = 0; stage < p; ++stage) {
    if (next[stage] != schedule[stage].size()) return false;
  }
  return true;
}

TEST(Schedule, EveryGroupSizeRunsEveryStepOnceWithoutWaitingForever) {
  int cases = 0;
  for (int p : {2, 3, 4}) {
    for (int m = 1; m <= 10; ++m) {
      for (int v : {2, 3}) {
        for (int group = 1; group <= m; ++group) {
          const auto schedule = build_schedule(ScheduleKind::Interleaved, p, m, v, group);
          for (int stage = 0; stage < p; ++stage) ASSERT_EQ(schedule[stage].size(), 2u * m * v);
          ASSERT_TRUE(runs_to_the_end(schedule, p, m, v)) << "p=" << p << " m=" << m << " v=" << v << " N=" << group;
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, 3 * 55 * 2);
  // The check catches a schedule that waits forever: the last stage's backward before any forward.
  auto broken = build_schedule(ScheduleKind::Interleaved, 2, 4, 2, 2);
  std::swap(broken[1].front(), broken[1].back());
  EXPECT_FALSE(runs_to_the_end(broken, 2, 4, 2));
}

TEST(Schedule, GroupsWithoutDependencyBubblesAreMegatronCoresRule) {
  EXPECT_TRUE(group_without_dependency_bubbles(16, 32, 16));
  EXPECT_TRUE(group_without_dependency_bubbles(16, 20, 20));   // one group of all 20
  EXPECT_FALSE(group_without_dependency_bubbles(16, 20, 16));  // a last group of 4 < 16
  EXPECT_FALSE(group_without_dependency_bubbles(4, 13, 5));    // groups of 5, 5 and 3 < 4
  EXPECT_TRUE(group_without_dependency_bubbles(4, 14, 5));     // 5, 5 and 4
  EXPECT_FALSE(group_without_dependency_bubbles(16, 8, 8));    // fewer micro-batches than stages (Llama 3 allows)
}

TEST(Schedule, RejectsInvalidArguments) {
  EXPECT_THROW(build_schedule(ScheduleKind::OneFOneB, 0, 4, 1), std::invalid_argument);
  EXPECT_THROW(build_schedule(ScheduleKind::OneFOneB, 2, 4, 2), std::invalid_argument);
  EXPECT_THROW(build_schedule(ScheduleKind::Interleaved, 4, 6, 2), std::invalid_argument);
  EXPECT_THROW(build_schedule(ScheduleKind::Interleaved, 4, 6, 2, 7), std::invalid_argument);  // more than m
  EXPECT_THROW(build_schedule(ScheduleKind::OneFOneB, 4, 6, 1, 4), std::invalid_argument);     // not interleaved
}

// ZB-H1 on 4 stages, 8 micro-batches (Qi et al., ICLR 2024, Figure 3, top): 1F1B's warmup, stage s defers the W of
// its first s steady pairs, and the cooldown ends with them.
TEST(ZeroBubbleH1, FourStagesEightMicroBatches) {
  const auto schedule = build_schedule(ScheduleKind::ZeroBubbleH1, 4, 8, 1);
  EXPECT_EQ(render(schedule[0]), "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7");
  EXPECT_EQ(render(schedule[1]), "F0 F1 F2 B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 F6 B4 W3 F7 B5 W4 B6 W5 B7 W6 W7");
  EXPECT_EQ(render(schedule[2]), "F0 F1 B0 F2 B1 F3 B2 W0 F4 B3 W1 F5 B4 W2 F6 B5 W3 F7 B6 W4 B7 W5 W6 W7");
  EXPECT_EQ(render(schedule[3]), "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7");
}

// Every F, B and W once, W after its B; activations in flight as 1F1B's (p - s), and at most s + 1 W inputs kept
// on stage s: the paper's "same peak memory as 1F1B", p M_B, is stage 0's.
TEST(ZeroBubbleH1, EveryPassOnceWithOneFOneBsActivationsInFlight) {
  for (int p : {2, 3, 4, 8}) {
    for (int m = 1; m <= 16; ++m) {
      const auto schedule = build_schedule(ScheduleKind::ZeroBubbleH1, p, m, 1);
      for (int stage = 0; stage < p; ++stage) {
        std::vector<int> seen(3 * m, 0);
        std::vector<int> backward_done(m, 0);
        for (const auto& step : schedule[stage]) {
          ++seen[static_cast<int>(step.pass) * m + step.micro_batch];
          if (step.pass == Pass::Backward) backward_done[step.micro_batch] = 1;
          if (step.pass == Pass::WeightGrad) {
            EXPECT_TRUE(backward_done[step.micro_batch]) << "W before its B";
          }
        }
        for (int count : seen) ASSERT_EQ(count, 1) << "p=" << p << " m=" << m;
        EXPECT_EQ(max_in_flight(schedule[stage]), std::min(p - stage, m)) << "p=" << p << " m=" << m;
        EXPECT_LE(max_deferred_weight_grads(schedule[stage]), std::min(stage + 1, m)) << "p=" << p << " m=" << m;
        if (m >= p) {
          EXPECT_EQ(max_deferred_weight_grads(schedule[stage]), stage + 1) << "p=" << p << " m=" << m;
        }
      }
    }
  }
  EXPECT_EQ(max_deferred_weight_grads(build_schedule(ScheduleKind::OneFOneB, 4, 8, 1)[0]), 0);
}

}  // namespace
// ZB-V on 2 stages, 4 micro-batches (".1": chunk 1, which on stage s holds virtual stage 2p - 1 - s): the authors'
// handcrafted_zb_v (schedule.hpp). Stage 0 holds both ends: its chunk 1 runs the loss, so its first B is chunk 1's.
TEST(ZeroBubbleV, TwoStagesFourMicroBatches) {
  const auto schedule = build_schedule(ScheduleKind::ZeroBubbleV, 2, 4, 2);
  EXPECT_EQ(render(schedule[0]),
            "F0 F1 F2 F0.1 B0.1 W0.1 F1.1 B1.1 W1.1 F3 B0 W0 F2.1 B2.1 W2.1 B1 W1 F3.1 B3.1 W3.1 B2 W2 B3 W3");
  EXPECT_EQ(render(schedule[1]),
            "F0 F0.1 F1 F1.1 B0.1 W0.1 F2 B0 W0 F2.1 B1.1 W1.1 F3 B1 W1 F3.1 B2.1 W2.1 B2 B3.1 B3 W2 W3.1 W3");
  EXPECT_THROW(build_schedule(ScheduleKind::ZeroBubbleV, 2, 4, 1), std::invalid_argument);
  EXPECT_EQ(warmup_steps(ScheduleKind::ZeroBubbleV, 1, 2, 4, 2), 4);
}

// Every F, B and W of both chunks once, each W after its B; with m >= 2p - 1 every stage holds 2p chunks' activations
// at its peak, p stages' worth: the paper's "same peak memory as 1F1B" (p M_B, 1F1B's stage 0).
TEST(ZeroBubbleV, EveryPassOnceWithOneFOneBsPeakActivations) {
  for (int p : {2, 3, 4, 8}) {
    for (int m = 1; m <= 3 * p; ++m) {
      const auto schedule = build_schedule(ScheduleKind::ZeroBubbleV, p, m, 2);
      for (int stage = 0; stage < p; ++stage) {
        std::vector<int> seen(6 * m, 0);
        std::vector<int> backward_done(2 * m, 0);
        for (const auto& step : schedule[stage]) {
          const int at = step.chunk * m + step.micro_batch;
          ++seen[static_cast<int>(step.pass) * 2 * m + at];
          if (step.pass == Pass::Backward) backward_done[at] = 1;
          if (step.pass == Pass::WeightGrad) {
            EXPECT_TRUE(backward_done[at]) << "W before its B";
          }
        }
        for (int count : seen) ASSERT_EQ(count, 1) << "p=" << p << " m=" << m;
        if (m >= 2 * p - 1) {
          EXPECT_EQ(max_in_flight(schedule[stage]), 2 * p) << "p=" << p << " m=" << m;
        }
        EXPECT_LE(max_in_flight(schedule[stage]), 2 * std::min(p, m)) << "p=" << p << " m=" << m;
      }
    }
  }
}

// DualPipeV on 2 stages, 4 micro-batches (dualpipev.py's DualPipeV.step, schedule.hpp): a whole backward is its B and
// W at once; a zero-bubble one's W waits for the next lone W (stage 0's W0.1 in step 3, W2 in step 7).
TEST(DualPipeV, TwoStagesFourMicroBatches) {
  const auto schedule = build_schedule(ScheduleKind::DualPipeV, 2, 4, 2);
  EXPECT_EQ(render(schedule[0]),
            "F0 F1 F2 F0.1 B0.1 W0.1 F1.1 F3 B1.1 W1.1 F2.1 B0 W0 B2.1 W2.1 F3.1 B1 W1 B3.1 W3.1 B2 W2 B3 W3");
  EXPECT_EQ(render(schedule[1]),
            "F0 F0.1 F1 F1.1 F2 B0.1 W0.1 F2.1 B0 W0 F3 B1.1 W1.1 F3.1 B1 W1 B2.1 W2.1 B2 W2 B3.1 B3 W3.1 W3");
  EXPECT_THROW(build_schedule(ScheduleKind::DualPipeV, 2, 3, 2), std::invalid_argument);  // m < 2p
}

// Every F, B and W of both chunks once, each W after its B; 2p + 1 chunks' activations at the peak on every stage:
// the DualPipe README's "PP + 1" (PP = 2p virtual stages).
TEST(DualPipeV, EveryPassOnceWithItsTablesPeakActivations) {
  for (int p : {2, 3, 4, 8}) {
    for (int m = 2 * p; m <= 3 * p; ++m) {
      const auto schedule = build_schedule(ScheduleKind::DualPipeV, p, m, 2);
      for (int stage = 0; stage < p; ++stage) {
        std::vector<int> seen(6 * m, 0);
        std::vector<int> backward_done(2 * m, 0);
        for (const auto& step : schedule[stage]) {
          const int at = step.chunk * m + step.micro_batch;
          ++seen[static_cast<int>(step.pass) * 2 * m + at];
          if (step.pass == Pass::Backward) backward_done[at] = 1;
          if (step.pass == Pass::WeightGrad) {
            EXPECT_TRUE(backward_done[at]) << "W before its B";
          }
        }
        for (int count : seen) ASSERT_EQ(count, 1) << "p=" << p << " m=" << m;
        EXPECT_EQ(max_in_flight(schedule[stage]), 2 * p + 1) << "p=" << p << " m=" << m << " stage " << stage;
      }
    }
  }
}

}  // namespace twin::model
