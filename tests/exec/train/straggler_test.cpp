// The straggler detector (exec/train/straggler.hpp): which rank computed slowest against its peers' median speed, its
// lag in seconds and as a fraction, and the threshold of a report; the slow-rank injection's sleep balance.
#include <gtest/gtest.h>

#include "exec/train/straggler.hpp"
#include "exec_test_util.hpp"

namespace twin::exec {
namespace {

TEST(ExecStraggler, TheSlowestRankIsJudgedAgainstItsPeersMedianSpeed) {
  // four ranks of equal work; rank 2 took 0.3 s where the others took 0.1, 0.1 and 0.12 (median 0.1)
  const Straggler s = find_straggler({0.1, 0.12, 0.3, 0.1}, {0.2, 0.18, 0.01, 0.2}, {1e9, 1e9, 1e9, 1e9});
  EXPECT_EQ(s.rank, 2);
  EXPECT_DOUBLE_EQ(s.compute_s, 0.3);
  EXPECT_NEAR(s.lag_s, 0.2, 1e-12);
  EXPECT_NEAR(s.lag_fraction, 2.0, 1e-12);
  EXPECT_NEAR(s.peers_wait_s, 0.2, 1e-12);
  EXPECT_TRUE(s.reported());
}

// A stage with twice the work is not slow for taking twice as long: speed is seconds per FLOP.
TEST(ExecStraggler, MoreWorkIsNotALag) {
  const Straggler even = find_straggler({0.1, 0.2}, {0.1, 0.0}, {1e9, 2e9});
  EXPECT_NEAR(even.lag_fraction, 0.0, 1e-12);
  EXPECT_FALSE(even.reported());
  // the stage of twice the work took 3 times as long: 0.1 s beyond the 0.2 s its peer's speed gives, 50 % slower
  const Straggler slow = find_straggler({0.1, 0.3}, {0.2, 0.0}, {1e9, 2e9});
  EXPECT_EQ(slow.rank, 1);
  EXPECT_NEAR(slow.lag_fraction, 0.5, 1e-12);
  EXPECT_NEAR(slow.lag_s, 0.1, 1e-12);
  EXPECT_TRUE(slow.reported());
}

TEST(ExecStraggler, ALagIsReportedAbove20PercentAnd1Millisecond) {
  EXPECT_FALSE(find_straggler({1.0, 1.19}, {0, 0}, {1, 1}).reported());      // 19 %
  EXPECT_TRUE(find_straggler({1.0, 1.21}, {0, 0}, {1, 1}).reported());       // 21 %, 0.21 s
  EXPECT_FALSE(find_straggler({0.001, 0.0019}, {0, 0}, {1, 1}).reported());  // 90 % but 0.9 ms
  EXPECT_EQ(find_straggler({0.5}, {0}, {1}).rank, -1);                       // one rank has no peers
}

// The warm-up step's lag is kept (slowest_rank, lag_s in --json) but never reported, however large.
TEST(ExecStraggler, AWarmUpStepIsMeasuredButNeverReported) {
  Straggler s = find_straggler({1.0, 3.0}, {0, 0}, {1, 1});
  ASSERT_TRUE(s.reported());
  s.warm_up = true;
  EXPECT_FALSE(s.reported());
  EXPECT_EQ(s.rank, 1);
  EXPECT_NEAR(s.lag_s, 2.0, 1e-12);
}

TEST(ExecStraggler, EveryRankOfAStageHasItsComputeFlops) {
  const model::Program program = model::build_program(
      testing::scenario(testing::small_toml(), {"parallel.pp=2", "parallel.dp=2"}), model::Granularity::Op);
  const std::vector<double> flops = compute_flops_per_rank(program);
  ASSERT_EQ(flops.size(), 4u);
  for (int rank = 0; rank < 4; ++rank) {
    const int twin = rank ^ 1;  // dp peers differ in the lowest bit of the global rank (tp 1)
    EXPECT_EQ(program.layout.coord_of(rank).pp, program.layout.coord_of(twin).pp);
    EXPECT_EQ(flops[static_cast<std::size_t>(rank)], flops[static_cast<std::size_t>(twin)]);
    EXPECT_GT(flops[static_cast<std::size_t>(rank)], 0.0);
  }
  EXPECT_NE(flops[0], flops[2]);  // the last stage has the LM head
}

// The slowdown keeps what it owes as a balance: nothing slept for ops that owe less than a millisecond in all, then
// one sleep of at least the whole balance (a sleep never returns early), so no owed time is lost.
TEST(ExecStraggler, TheSlowdownSleepsItsBalanceOnceItReachesAMillisecond) {
  ComputeSlowdown slowdown(3.0);
  EXPECT_EQ(slowdown.after_compute(100e-6), 0.0);     // owes 0.2 ms
  EXPECT_EQ(slowdown.after_compute(200e-6), 0.0);     // 0.6 ms
  EXPECT_GE(slowdown.after_compute(300e-6), 1.2e-3);  // 1.2 ms: slept
}

}  // namespace
}  // namespace twin::exec
