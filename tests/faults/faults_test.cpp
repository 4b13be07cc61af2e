// The fault-injection suite (ctest -L faults): `twin run` with one fault injected through TWIN_FAULT
// (exec/train/faults.hpp), under each launcher: a rank killed, stopped, slowed or raising; a checkpoint write cut short at
// each of its files; a full disk; a NaN at a chosen op. Each asserts the exit status, that the message names the rank
// or the file, and that the next run resumes to the losses of a run nobody interrupted, bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include <fmt/core.h>

#include "fault_test_util.hpp"

namespace twin::exec::faults {
namespace {

const std::vector<std::string> kPlan = {"parallel.pp=2"};  // 2 ranks: stage 0 and stage 1
constexpr int kSteps = 5;

class Faults : public FaultFixture {
 protected:
  // The run to fail: 5 steps, a checkpoint after each, a short timeout.
  Outcome failing_run(const std::string& fault, const std::vector<std::string>& launcher = {},
                      const std::string& timeout = "2") {
    return twin_run({set_args(kPlan) +
                         std::vector<std::string>{"--steps", std::to_string(kSteps), "--checkpoint", dir() + "/ck",
                                                  "--checkpoint-every", "1", "--timeout", timeout} +
                         launcher,
                     fault},
                    "failing");
  }

  // Runs on from the checkpoints without a fault: the steps before the checkpoint and after it are those of the run
  // nobody interrupted, bit for bit. Returns the resumed run's log.
  std::string expect_resume_is_bit_identical(int resumed_at, const std::vector<std::string>& sets = kPlan) {
    RunSpec spec{set_args(sets) + std::vector<std::string>{"--steps", std::to_string(kSteps), "--checkpoint",
                                                           dir() + "/ck", "--json", dir() + "/resumed.json"}};
    spec.quiet = false;
    const Outcome resumed = twin_run(spec, "resumed");
    EXPECT_EQ(resumed.status, 0) << resumed.log;
    if (resumed.status != 0) return resumed.log;
    const nlohmann::json json = this->json("resumed.json");
    const std::vector<double> all = uninterrupted(sets, kSteps);
    EXPECT_EQ(json["first_step"].get<int>(), resumed_at) << resumed.log;
    EXPECT_EQ(json["losses"].get<std::vector<double>>(), std::vector<double>(all.begin() + resumed_at, all.end()));
    EXPECT_EQ(json["earlier_losses"].get<std::vector<double>>(),
              std::vector<double>(all.begin(), all.begin() + resumed_at));
    return resumed.log;
  }
};

// ---- the threads launcher ----------------------------------------------------------------------------------------

TEST_F(Faults, ThreadsAKilledRankIsNamedWhenItsPeerTimesOut) {
  const Outcome failed = failing_run("kill:rank=1,step=3");
  EXPECT_EQ(failed.status, 1) << failed.log;
  EXPECT_TRUE(names_late_rank(failed.log, 1)) << failed.log;
  EXPECT_NE(failed.log.find("timed out after 2 s"), std::string::npos) << failed.log;
  expect_resume_is_bit_identical(2);
}

// A stopped rank is not dead: its thread never returns. The launcher ends the process all the same, within the
// timeout and a second, naming it.
TEST_F(Faults, ThreadsAStoppedRankEndsTheRunWithinItsTimeoutNamed) {
  const Outcome failed = failing_run("stop:rank=1,step=3");
  EXPECT_EQ(failed.status, 1) << failed.log;
  EXPECT_NE(failed.log.find("twin: error: rank 1 is stuck: it has not returned since the run failed"),
            std::string::npos)
      << failed.log;
  EXPECT_NE(failed.log.find("(at the start of step 3)"), std::string::npos) << failed.log;
  // 2 steps, the 2 s timeout, the 1 s grace, start-up: far from the minutes (or forever) of waiting for the thread
  EXPECT_LT(failed.seconds, 12.0) << failed.log;
  expect_resume_is_bit_identical(2);
}

// A slow rank is not a failed one: within the timeout, the run trains the same bits.
TEST_F(Faults, ThreadsASlowRankWithinTheTimeoutChangesNothing) {
  const Outcome slowed = twin_run(
      {set_args(kPlan) + std::vector<std::string>{"--steps", "3", "--timeout", "30", "--json", dir() + "/slow.json"},
       "slow:rank=1,step=2,seconds=1.5"},
      "slow");
  ASSERT_EQ(slowed.status, 0) << slowed.log;
  EXPECT_GT(slowed.seconds, 1.5);
  EXPECT_EQ(json("slow.json")["losses"].get<std::vector<double>>(), uninterrupted(kPlan, 3));
}

TEST_F(Faults, ThreadsARaisingRankIsNamedAndTheOthersStopAtOnce) {
  const Outcome failed = failing_run("throw:rank=1,step=3", {}, "60");
  EXPECT_EQ(failed.status, 1) << failed.log;
  EXPECT_NE(failed.log.find("twin: error: rank 1: injected failure at step 3"), std::string::npos) << failed.log;
  EXPECT_LT(failed.seconds, 30.0) << "the peers waited for the timeout: " << failed.log;
  expect_resume_is_bit_identical(2);
}

// `twin run --inject-failure STEP:RANK` puts the suite's raising rank in a user's hands (the run stops naming it: the
// MPI test below, and the log here); `--restarts N` starts the run again from the newest checkpoint by itself, so that
// one command trains every step once, none lost or repeated.
TEST_F(Faults, ThreadsRestartsRelaunchFromTheNewestCheckpoint) {
  RunSpec spec{set_args(kPlan) + std::vector<std::string>{"--steps", std::to_string(kSteps), "--checkpoint",
                                                          dir() + "/ck", "--checkpoint-every", "1", "--inject-failure",
                                                          "4:0", "--restarts", "1", "--json",
                                                          dir() + "/restarted.json"}};
  const Outcome restarted = twin_run(spec, "restarted");
  ASSERT_EQ(restarted.status, 0) << restarted.log;
  EXPECT_NE(restarted.log.find("rank 0: injected failure at step 4; restart 1 of 1"), std::string::npos)
      << restarted.log;
  const nlohmann::json json = this->json("restarted.json");
  const std::vector<double> all = uninterrupted(kPlan, kSteps);
  EXPECT_EQ(json["first_step"].get<int>(), 3);
  std::vector<double> every = json["earlier_losses"].get<std::vector<double>>();
  for (double loss : json["losses"].get<std::vector<double>>()) every.push_back(loss);
  EXPECT_EQ(every, all);  // each step once, bit for bit
  // without a checkpoint directory there is nothing to restart from
  spec.args = set_args(kPlan) + std::vector<std::string>{"--steps", "2", "--restarts", "1"};
  const Outcome refused = twin_run(spec, "refused");
  EXPECT_EQ(refused.status, 2) << refused.log;
  EXPECT_NE(refused.log.find("--restarts"), std::string::npos) << refused.log;
}

// ---- the MPI launcher --------------------------------------------------------------------------------------------

#define SKIP_WITHOUT_MPIRUN()                                                     \
  if (!testing::on_path("mpirun"))                                                \
  GTEST_SKIP() << "mpirun not found (apt install openmpi-bin): MPI launcher not " \
                  "tested"

const std::vector<std::string> kMpi = {"--launcher", "mpi"};

TEST_F(Faults, MpiAKilledRankEndsTheJobAndMpirunNamesIt) {
  SKIP_WITHOUT_MPIRUN();
  const Outcome failed = failing_run("kill:rank=1,step=3", kMpi);
  EXPECT_EQ(failed.status, 1) << failed.log;
  EXPECT_NE(failed.log.find("process rank 1"), std::string::npos) << failed.log;  // mpirun's notice
  EXPECT_NE(failed.log.find("twin: error: the MPI job failed"), std::string::npos) << failed.log;
  expect_resume_is_bit_identical(2);
}

TEST_F(Faults, MpiAStoppedRankIsNamedWhenItsPeerTimesOut) {
  SKIP_WITHOUT_MPIRUN();
  const Outcome failed = failing_run("stop:rank=1,step=3", kMpi);
  EXPECT_EQ(failed.status, 1) << failed.log;
  EXPECT_TRUE(names_late_rank(failed.log, 1)) << failed.log;
  EXPECT_LT(failed.seconds, 20.0) << failed.log;
  expect_resume_is_bit_identical(2);
}

TEST_F(Faults, MpiASlowRankWithinTheTimeoutChangesNothing) {
  SKIP_WITHOUT_MPIRUN();
  const Outcome slowed =
      twin_run({set_args(kPlan) +
                    std::vector<std::string>{"--steps", "3", "--timeout", "30", "--json", dir() + "/slow.json"} + kMpi,
                "slow:rank=1,step=2,seconds=1.5"},
               "slow");
  ASSERT_EQ(slowed.status, 0) << slowed.log;
  EXPECT_EQ(json("slow.json")["losses"].get<std::vector<double>>(), uninterrupted(kPlan, 3));
}

TEST_F(Faults, MpiARaisingRankIsNamedOnceWithTheThreadsExitStatus) {
  SKIP_WITHOUT_MPIRUN();
  const Outcome failed = failing_run("throw:rank=1,step=3", kMpi, "60");
  EXPECT_EQ(failed.status, 1) << failed.log;
  const std::string line = "twin: error: rank 1: injected failure at step 3";
  ASSERT_NE(failed.log.find(line), std::string::npos) << failed.log;
  EXPECT_EQ(failed.log.find(line, failed.log.find(line) + 1), std::string::npos) << "printed twice: " << failed.log;
  EXPECT_LT(failed.seconds, 30.0) << failed.log;
  expect_resume_is_bit_identical(2);
}

TEST_F(Faults, MpiAnInjectedFailureIsNamedOnceAndTheRunResumes) {
  SKIP_WITHOUT_MPIRUN();
  const Outcome failed = twin_run({set_args(kPlan) + std::vector<std::string>{"--steps", std::to_string(kSteps),
                                                                              "--checkpoint", dir() + "/ck",
                                                                              "--checkpoint-every", "1",
                                                                              "--inject-failure", "3:1"} +
                                   kMpi},
                                  "failing");
  EXPECT_EQ(failed.status, 1) << failed.log;
  const std::string line = "twin: error: rank 1: injected failure at step 3";
  ASSERT_NE(failed.log.find(line), std::string::npos) << failed.log;
  EXPECT_EQ(failed.log.find(line, failed.log.find(line) + 1), std::string::npos) << "printed twice: " << failed.log;
  expect_resume_is_bit_identical(2);
}

// `--restarts` under `--launcher mpi`: the command that started mpirun launches the job again after it failed, without
// the injected failure, and the job resumes from the newest checkpoint: every step trained once, bit for bit.
TEST_F(Faults, MpiRestartsRelaunchTheJobFromTheNewestCheckpoint) {
  SKIP_WITHOUT_MPIRUN();
  const Outcome restarted = twin_run(
      {set_args(kPlan) + std::vector<std::string>{"--steps", std::to_string(kSteps), "--checkpoint", dir() + "/ck",
                                                  "--checkpoint-every", "1", "--inject-failure", "4:1", "--restarts",
                                                  "1", "--json", dir() + "/restarted.json"} +
       kMpi},
      "restarted");
  ASSERT_EQ(restarted.status, 0) << restarted.log;
  EXPECT_NE(restarted.log.find("twin: error: rank 1: injected failure at step 4"), std::string::npos) << restarted.log;
  EXPECT_NE(restarted.log.find("the MPI job failed; restart 1 of 1 from the newest checkpoint"), std::string::npos)
      << restarted.log;
  const nlohmann::json json = this->json("restarted.json");
  EXPECT_EQ(json["first_step"].get<int>(), 3);
  std::vector<double> every = json["earlier_losses"].get<std::vector<double>>();
  for (double loss : json["losses"].get<std::vector<double>>()) every.push_back(loss);
  EXPECT_EQ(every, uninterrupted(kPlan, kSteps));
}

// ---- checkpoints -------------------------------------------------------------------------------------------------

// The process killed half-way through each file of the checkpoint of step 3: that checkpoint is never complete, the
// next run says it ignores it and resumes from step 2.
TEST_F(Faults, ACheckpointWriteKilledAtEveryFileResumesFromTheOneBefore) {
  for (const std::string file : {"rank-00000.bin", "rank-00001.bin", "manifest.json"}) {
    SCOPED_TRACE(file);
    fs::remove_all(dir() + "/ck");
    const Outcome killed = failing_run("kill-writing:step=3,file=" + file);
    EXPECT_EQ(killed.status, 128 + SIGKILL) << killed.log;
    EXPECT_FALSE(fs::exists(dir() + "/ck/step-00000003/manifest.json"));
    EXPECT_TRUE(fs::exists(dir() + "/ck/step-00000003/" + file + ".tmp"));  // the half-written temporary
    const std::string log = expect_resume_is_bit_identical(2);
    EXPECT_NE(log.find("ignoring " + dir() + "/ck/step-00000003: its checkpoint was never completed"),
              std::string::npos)
        << log;
  }
}

TEST_F(Faults, MpiACheckpointWriteKilledInOneRankResumesFromTheOneBefore) {
  SKIP_WITHOUT_MPIRUN();
  const Outcome killed = failing_run("kill-writing:step=3,file=rank-00001.bin", kMpi);
  EXPECT_EQ(killed.status, 1) << killed.log;
  EXPECT_NE(killed.log.find("process rank 1"), std::string::npos) << killed.log;
  EXPECT_FALSE(fs::exists(dir() + "/ck/step-00000003/manifest.json"));
  expect_resume_is_bit_identical(2);
}

// A full disk, as the writer sees it (RLIMIT_FSIZE: a write past 64 KiB fails with EFBIG): the run stops naming the
// file, leaves no temporary behind and keeps the checkpoints it had.
TEST_F(Faults, AFullDiskStopsTheRunNamingTheFileAndKeepsTheCheckpointsBefore) {
  const std::vector<std::string> first =
      set_args(kPlan) +
      std::vector<std::string>{"--steps", "2", "--checkpoint", dir() + "/ck", "--checkpoint-every", "2"};
  ASSERT_EQ(twin_run({first}, "first").status, 0);
  RunSpec full{set_args(kPlan) +
               std::vector<std::string>{"--steps", "4", "--checkpoint", dir() + "/ck", "--checkpoint-every", "2"}};
  full.file_size_limit = 64 << 10;
  const Outcome failed = twin_run(full, "full");
  EXPECT_EQ(failed.status, 1) << failed.log;
  EXPECT_NE(failed.log.find("twin: error: checkpoint: writing '" + dir() + "/ck/step-00000004/rank-0000"),
            std::string::npos)
      << failed.log;
  EXPECT_NE(failed.log.find(".tmp' failed: File too large"), std::string::npos) << failed.log;
  for (const auto& entry : fs::directory_iterator(dir() + "/ck/step-00000004")) {
    EXPECT_NE(entry.path().extension(), ".tmp") << entry.path() << " left behind";
  }
  expect_resume_is_bit_identical(2);
}

// ---- a NaN at a chosen op ----------------------------------------------------------------------------------------

// The index of the first backward op in the list of `rank` of the plan.
int first_backward_op(int rank) {
  const model::Program program =
      model::build_program(testing::scenario(testing::small_toml(), kPlan), model::Granularity::Op);
  const auto& ops = program.ops_of_rank(rank);
  const auto it =
      std::find_if(ops.begin(), ops.end(), [](const model::Op& op) { return op.phase == model::Phase::Backward; });
  return static_cast<int>(it - ops.begin());
}

// A NaN in stage 0's gradient at step 3: the global gradient norm is NaN on every rank, the run stops before the
// update (exit 1), names the step, and moves aside the checkpoint of step 2 that no sane loss had vouched for yet,
// so that the next run resumes from step 1.
TEST_F(Faults, ANanInTheGradientStopsTheRunBeforeTheUpdate) {
  const int op = first_backward_op(0);
  const Outcome failed = failing_run(fmt::format("nan:rank=0,step=3,op={}", op));
  EXPECT_EQ(failed.status, 1) << failed.log;
  EXPECT_NE(failed.log.find("twin: error: training diverged: the gradient norm became non-finite (NaN) at step 3"),
            std::string::npos)
      << failed.log;
  EXPECT_NE(failed.log.find("was moved to " + dir() + "/ck/rejected-step-00000002"), std::string::npos) << failed.log;
  expect_resume_is_bit_identical(1);
}

TEST_F(Faults, MpiANanInTheGradientIsReportedOnce) {
  SKIP_WITHOUT_MPIRUN();
  const Outcome failed = failing_run(fmt::format("nan:rank=0,step=3,op={}", first_backward_op(0)), kMpi);
  EXPECT_EQ(failed.status, 1) << failed.log;
  const std::string line = "twin: error: training diverged: the gradient norm became non-finite (NaN) at step 3";
  ASSERT_NE(failed.log.find(line), std::string::npos) << failed.log;
  EXPECT_EQ(failed.log.find(line, failed.log.find(line) + 1), std::string::npos) << "printed twice: " << failed.log;
  expect_resume_is_bit_identical(1);
}

// With --skip-nonfinite the update of step 3 is skipped as a loss scaler skips it (its forward, and so its loss, were
// finite: the NaN is in the backward), the run goes on, and the checkpoint after step 3 holds exactly the weights and
// Adam state of the one after step 2.
TEST_F(Faults, SkipNonfiniteSkipsTheUpdateAndLeavesTheWeightsAsTheyWere) {
  const int op = first_backward_op(0);
  const Outcome run =
      twin_run({set_args(kPlan) + std::vector<std::string>{"--steps", "4", "--checkpoint", dir() + "/ck",
                                                           "--checkpoint-every", "1", "--keep-checkpoints", "4",
                                                           "--json", dir() + "/skip.json", "--skip-nonfinite"},
                fmt::format("nan:rank=0,step=3,op={}", op)},
               "skip");
  ASSERT_EQ(run.status, 0) << run.log;
  const nlohmann::json json = this->json("skip.json");
  EXPECT_EQ(json["skipped_steps"].get<std::vector<int>>(), std::vector<int>{2});
  const std::vector<double> all = uninterrupted(kPlan, 4);
  for (int step = 0; step < 3; ++step) EXPECT_EQ(json["losses"][step].get<double>(), all[step]) << step;
  EXPECT_NE(json["losses"][3].get<double>(), all[3]);  // step 4 runs on the weights of step 2
  EXPECT_TRUE(std::isfinite(json["losses"][3].get<double>()));
  for (const std::string shard : {"rank-00000.bin", "rank-00001.bin"}) {
    const std::string before = testing::read_text(dir() + "/ck/step-00000002/" + shard);
    const std::string after = testing::read_text(dir() + "/ck/step-00000003/" + shard);
    ASSERT_EQ(before.size(), after.size()) << shard;
    constexpr std::size_t kHeader = 32;  // magic, version, rank, world, buckets, then the step it was written at
    EXPECT_TRUE(std::equal(before.begin() + kHeader, before.end(), after.begin() + kHeader)) << shard;
    EXPECT_NE(before.substr(0, kHeader), after.substr(0, kHeader)) << shard;
  }
}

// ---- the threads launcher, in process ----------------------------------------------------------------------------

// train_threads does not join a rank that never returns: it names it in a RanksStuck (the stopped thread stays
// blocked; this test process ends with it).
TEST(FaultsInProcess, AStoppedRankThreadIsNamedNotJoined) {
  TrainOptions options;
  options.steps = 3;
  options.comm_timeout_s = 1;
  options.fault.mode = FaultInjection::Mode::Stop;
  options.fault.rank = 1;
  options.fault.step = 1;
  const auto start = std::chrono::steady_clock::now();
  try {
    testing::train(testing::scenario(testing::small_toml(), {"parallel.tp=2", "parallel.pp=2"}), options);
    ADD_FAILURE() << "a run with a stopped rank returned";
  } catch (const RanksStuck& stuck) {
    ASSERT_EQ(stuck.lines().size(), 2u) << stuck.what();
    EXPECT_TRUE(names_late_rank(stuck.lines()[0], 1)) << stuck.lines()[0];
    EXPECT_EQ(stuck.lines()[1].rfind("rank 1 is stuck: ", 0), 0u) << stuck.lines()[1];
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 10.0);
}

}  // namespace
}  // namespace twin::exec::faults
