// The watchdog behind NcclCommunicator's timeouts (exec/comm/watchdog.hpp), with plain flags for the device's work:
// a late item or a reported error calls on_failure once, within the timeout, naming it; finished items are released;
// wait_idle returns after a failure even when the work never finishes.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "exec/comm/watchdog.hpp"

namespace twin::exec {
namespace {

using Clock = std::chrono::steady_clock;

struct Recorder {
  std::atomic<int> failures{0};
  std::string story;  // written once, by the watchdog's thread, before failures becomes 1
  Watchdog::Hooks hooks(std::function<std::string()> health = {}) {
    return {std::move(health), [this](const std::string& s) {
              story = s;
              ++failures;
            }};
  }
};

TEST(ExecWatchdog, FinishedWorkIsReleasedAndNothingFails) {
  Recorder recorder;
  Watchdog watchdog(5.0, recorder.hooks());
  std::atomic<bool> done{false}, released{false};
  watchdog.watch([&] { return done.load(); }, [&] { released = true; }, "all_reduce x on the tensor group");
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_FALSE(released);
  done = true;
  watchdog.wait_idle();
  EXPECT_TRUE(released);
  EXPECT_EQ(recorder.failures, 0);
  EXPECT_EQ(watchdog.failure(), "");
}

TEST(ExecWatchdog, WorkThatNeverFinishesFailsOnceWithinTheTimeoutAndIsGivenUp) {
  Recorder recorder;
  Watchdog watchdog(0.2, recorder.hooks());
  std::atomic<int> released{0};
  const auto start = Clock::now();
  watchdog.watch([] { return false; }, [&] { ++released; }, "recv activations from rank 3");
  watchdog.watch([] { return false; }, [&] { ++released; }, "send gradients to rank 1");
  while (recorder.failures == 0 && Clock::now() - start < std::chrono::seconds(5)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  ASSERT_EQ(recorder.failures, 1);
  EXPECT_GE(seconds, 0.2);
  EXPECT_LT(seconds, 1.0);
  EXPECT_EQ(recorder.story,
            "recv activations from rank 3 did not finish within 0.2 s (a peer dead, stuck or out of step)");
  EXPECT_EQ(watchdog.failure(), recorder.story);
  watchdog.wait_idle();  // given up one timeout after the failure
  EXPECT_EQ(released, 2);
  EXPECT_EQ(recorder.failures, 1);
}

TEST(ExecWatchdog, AnErrorReportedWhileWorkIsInFlightFailsAtOnce) {
  Recorder recorder;
  std::atomic<bool> broken{false};
  Watchdog watchdog(30.0,
                    recorder.hooks([&] { return broken ? std::string("ncclRemoteError on the data group") : ""; }));
  std::atomic<bool> done{false};
  watchdog.watch([&] { return done.load(); }, [] {}, "reduce_scatter gradients");
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(recorder.failures, 0);
  const auto start = Clock::now();
  broken = true;
  while (recorder.failures == 0 && Clock::now() - start < std::chrono::seconds(5)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 1.0);
  EXPECT_EQ(recorder.story, "ncclRemoteError on the data group");
  done = true;  // an abort lets the kernels end
  watchdog.wait_idle();
}

TEST(ExecWatchdog, DestructionReleasesWhatIsStillInFlight) {
  Recorder recorder;
  std::atomic<int> released{0};
  {
    Watchdog watchdog(30.0, recorder.hooks());
    watchdog.watch([] { return false; }, [&] { ++released; }, "broadcast");
  }
  EXPECT_EQ(released, 1);
  EXPECT_EQ(recorder.failures, 0);
}

}  // namespace
}  // namespace twin::exec
