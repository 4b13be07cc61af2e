#include <gtest/gtest.h>

#include <string>

#include "model/schedule.hpp"

namespace twin::model {
namespace {

// "F0 B0 F1.1" : F/B, micro-batch, optional .chunk
std::string render(const StageSchedule& steps) {
  std::string out;
  for (const auto& step : steps) {
    if (!out.empty()) out += ' ';
    out += (step.pass == Pass::Forward ? "F" : "B") + std::to_string(step.micro_batch);
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

TEST(Schedule, RejectsInvalidArguments) {
  EXPECT_THROW(build_schedule(ScheduleKind::OneFOneB, 0, 4, 1), std::invalid_argument);
  EXPECT_THROW(build_schedule(ScheduleKind::OneFOneB, 2, 4, 2), std::invalid_argument);
  EXPECT_THROW(build_schedule(ScheduleKind::Interleaved, 4, 6, 2), std::invalid_argument);
}

}  // namespace
}  // namespace twin::model
