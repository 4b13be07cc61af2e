// The plan space of a search: every plan valid and within memory, ordered by ideal bubble; cp taking its share of the
// GPUs before dp; the headroom's two spellings; rejections with their reasons.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "model/plan/schedule.hpp"
#include "model/program/estimates.hpp"
#include "model/program/plan_space.hpp"
#include "model/scenario/errors.hpp"
#include "test_scenarios.hpp"

namespace twin::model {
namespace {

Scenario gpt3_175b() {
  return load_scenario(testing::source_dir() + "/scenarios/gpt3-175b.toml");
}
Scenario llama2() {
  return load_scenario(testing::source_dir() + "/scenarios/llama2-70b.toml");
}

TEST(PlanSpace, EveryPlanIsValidFitsAndComesInOrderOfIdealBubble) {
  const Scenario base = gpt3_175b();
  const PlanEnumeration found = enumerate_plans(base, {}, false);
  ASSERT_FALSE(found.plans.empty());
  EXPECT_TRUE(found.rejections.empty());  // only listed when asked
  for (std::size_t i = 0; i < found.plans.size(); ++i) {
    const Plan& plan = found.plans[i];
    EXPECT_EQ(plan.tp * plan.pp * plan.dp * plan.cp, base.cluster.total_gpus()) << plan.label();
    EXPECT_LE(plan.peak_memory_bytes, estimate_memory(base).capacity_bytes) << plan.label();
    if (i > 0) {
      EXPECT_LE(found.plans[i - 1].ideal_bubble, plan.ideal_bubble) << plan.label();
    }
  }
}

TEST(PlanSpace, VaryingCpGivesItsShareBeforeDataParallelism) {
  PlanSpace space;
  space.vary_cp = true;
  bool cp_seen = false;
  for (const Plan& plan : enumerate_plans(llama2(), space, false).plans) {
    EXPECT_EQ(plan.tp * plan.pp * plan.cp * plan.dp, llama2().cluster.total_gpus()) << plan.label();
    cp_seen |= plan.cp > 1;
  }
  EXPECT_TRUE(cp_seen);
}

TEST(PlanSpace, HeadroomIsAShareOrGiBAndMoreOfItRejectsMorePlans) {
  constexpr double GiB = 1024.0 * 1024 * 1024;
  EXPECT_DOUBLE_EQ(headroom_bytes("5%", 80 * GiB), 4 * GiB);
  EXPECT_DOUBLE_EQ(headroom_bytes("4", 80 * GiB), 4 * GiB);
  EXPECT_DOUBLE_EQ(headroom_bytes("4GiB", 80 * GiB), 4 * GiB);
  EXPECT_THROW(headroom_bytes("100%", 80 * GiB), UserError);
  EXPECT_THROW(headroom_bytes("lots", 80 * GiB), UserError);
  PlanSpace tight;
  tight.memory_headroom = "50%";
  const PlanEnumeration loose = enumerate_plans(gpt3_175b(), {}, true),
                        strict = enumerate_plans(gpt3_175b(), tight, true);
  EXPECT_LT(strict.plans.size(), loose.plans.size());
  EXPECT_GT(strict.rejected_for_memory, loose.rejected_for_memory);
  bool memory_reason = false;
  for (const Rejection& r : strict.rejections) memory_reason |= r.memory && r.reason.find("GiB") != std::string::npos;
  EXPECT_TRUE(memory_reason);
}

// --vary-schedule: ZB-V, DualPipeV and DualPipe beside the interleaved schedule on two chunks per stage (never on other
// chunk counts; DualPipeV and DualPipe with at least 2 pp micro-batches, DualPipe on an even pp with an even number),
// and without the flag none of them.
TEST(PlanSpace, VaryingTheScheduleAddsTheVsOnTwoChunks) {
  PlanSpace varied;
  varied.vary_schedule = true;
  int zb_v = 0, dualpipev = 0, dualpipe = 0;
  const Scenario base = gpt3_175b();
  for (const Plan& plan : enumerate_plans(base, varied, false).plans) {
    if (plan.schedule == ScheduleKind::DualPipe) {
      ++dualpipe;
      const std::int64_t m = base.parallel.global_batch / (plan.dp * plan.micro_batch);
      EXPECT_EQ(plan.chunks, 2) << plan.label();
      EXPECT_EQ(plan.pp % 2, 0) << plan.label();
      EXPECT_EQ(m % 2, 0) << plan.label();
      EXPECT_GE(m, 2 * plan.pp) << plan.label();
    }
    if (plan.schedule != ScheduleKind::ZeroBubbleV && plan.schedule != ScheduleKind::DualPipeV) continue;
    (plan.schedule == ScheduleKind::ZeroBubbleV ? zb_v : dualpipev) += 1;
    EXPECT_EQ(plan.chunks, 2) << plan.label();
    EXPECT_GT(plan.pp, 1) << plan.label();
    if (plan.schedule == ScheduleKind::DualPipeV) {
      EXPECT_GE(base.parallel.global_batch / (plan.dp * plan.micro_batch), 2 * plan.pp) << plan.label();
    }
  }
  EXPECT_GT(zb_v, 0);
  EXPECT_GT(dualpipev, 0);
  EXPECT_GT(dualpipe, 0);
  for (const Plan& plan : enumerate_plans(base, {}, false).plans) {
    EXPECT_FALSE(plan.schedule == ScheduleKind::ZeroBubbleV || plan.schedule == ScheduleKind::DualPipeV ||
                 plan.schedule == ScheduleKind::DualPipe)
        << plan.label();
  }
}

TEST(PlanSpace, APlanIsItsOverridesAndItsLabel) {
  Plan plan;
  plan.tp = 8, plan.pp = 4, plan.dp = 2, plan.chunks = 2, plan.schedule = ScheduleKind::Interleaved;
  plan.sequence_parallel = true, plan.zero_stage = 1;
  EXPECT_EQ(plan.label(), "tp 8 pp 4 dp 2 mb 1 interleaved v2 recompute none sp zero1");
  const std::vector<std::string> sets = plan.overrides();
  EXPECT_NE(std::find(sets.begin(), sets.end(), "parallel.virtual_stages=2"), sets.end());
  EXPECT_EQ(std::find(sets.begin(), sets.end(), "parallel.ep=1"), sets.end());  // a dense plan has no expert keys
}

}  // namespace
}  // namespace twin::model
