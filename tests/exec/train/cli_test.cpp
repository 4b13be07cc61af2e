// `twin run` as a user runs it: the threads and mpi launchers give the same bits; user mistakes are one clear line.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "exec_test_util.hpp"

namespace twin::exec {
namespace {

namespace fs = std::filesystem;

#ifdef TWIN_BINARY

struct ExecRunFixture : ::testing::Test {
  void SetUp() override {
    dir = testing::temp_dir("cli");
    scenario_file = dir + "/small.toml";
    std::ofstream(scenario_file) << testing::small_toml();
    data = testing::source_dir() + "/data/corpus.txt";
  }
  void TearDown() override { fs::remove_all(dir); }
  std::vector<std::string> twin_run(std::vector<std::string> extra) const {
    std::vector<std::string> args = {TWIN_BINARY, "run", scenario_file, "--data", data, "--threads", "1", "--quiet"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }
  std::string dir, scenario_file, data;
};

TEST_F(ExecRunFixture, MpiRanksGiveTheLossesOfThreads) {
  if (!testing::on_path("mpirun"))
    GTEST_SKIP() << "mpirun not found (apt install openmpi-bin): MPI launcher not tested";
  const std::vector<std::string> plan = {"--set", "parallel.tp=2", "--set", "parallel.pp=2", "--steps", "3"};
  auto args = twin_run(plan);
  args.insert(args.end(), {"--launcher", "mpi", "--json", dir + "/mpi.json"});
  ASSERT_EQ(testing::run_command(args, dir + "/mpi.log"), 0) << testing::read_text(dir + "/mpi.log");
  const auto mpi = nlohmann::json::parse(testing::read_text(dir + "/mpi.json"));

  TrainOptions options;
  options.steps = 3;
  const auto threads =
      testing::train(testing::scenario(testing::small_toml(), {"parallel.tp=2", "parallel.pp=2"}), options);
  EXPECT_EQ(mpi["losses"].get<std::vector<double>>(), threads.losses);  // bit for bit
  EXPECT_EQ(mpi["engine"], "exec (cpu, mpi)");
}

// ZeRO-3 through MPI: per-micro-batch gathers in place and reduce-scatters of the gradients, in the same bits.
TEST_F(ExecRunFixture, MpiRanksTrainZeroThreeAsThreadsDo) {
  if (!testing::on_path("mpirun"))
    GTEST_SKIP() << "mpirun not found (apt install openmpi-bin): MPI launcher not tested";
  const std::vector<std::string> sets = {"framework.name=\"composer\"", "parallel.dp=2", "parallel.zero_stage=3"};
  std::vector<std::string> args = twin_run({"--steps", "3", "--launcher", "mpi", "--json", dir + "/mpi.json"});
  for (const std::string& set : sets) args.insert(args.end(), {"--set", set});
  ASSERT_EQ(testing::run_command(args, dir + "/mpi.log"), 0) << testing::read_text(dir + "/mpi.log");
  const auto mpi = nlohmann::json::parse(testing::read_text(dir + "/mpi.json"));

  TrainOptions options;
  options.steps = 3;
  const auto threads = testing::train(testing::scenario(testing::small_toml(), sets), options);
  EXPECT_EQ(mpi["losses"].get<std::vector<double>>(), threads.losses);  // bit for bit
}

// ZB-H1 through MPI: TP 2 (sequence parallel) x 2 stages, each B's gradient sent before its deferred W; the threads'
// bits, and the 1F1B run's losses within 1e-5 (the same sums: W accumulates the weight gradients in the same order).
TEST_F(ExecRunFixture, MpiRanksTrainZeroBubbleAsThreadsDo) {
  if (!testing::on_path("mpirun"))
    GTEST_SKIP() << "mpirun not found (apt install openmpi-bin): MPI launcher not tested";
  const std::vector<std::string> sets = {"parallel.tp=2", "parallel.pp=2", "parallel.sequence_parallel=true",
                                         "parallel.schedule=\"zb-h1\""};
  std::vector<std::string> args = twin_run({"--steps", "2", "--launcher", "mpi", "--json", dir + "/mpi.json"});
  for (const std::string& set : sets) args.insert(args.end(), {"--set", set});
  ASSERT_EQ(testing::run_command(args, dir + "/mpi.log"), 0) << testing::read_text(dir + "/mpi.log");
  const auto mpi = nlohmann::json::parse(testing::read_text(dir + "/mpi.json"));

  TrainOptions options;
  options.steps = 2;
  const auto threads = testing::train(testing::scenario(testing::small_toml(), sets), options);
  const auto losses = mpi["losses"].get<std::vector<double>>();
  EXPECT_EQ(losses, threads.losses);  // bit for bit
  const std::vector<std::string> one_f_one_b_plan(sets.begin(), sets.end() - 1);  // the same plan in 1F1B
  const auto one_f_one_b = testing::train(testing::scenario(testing::small_toml(), one_f_one_b_plan), options);
  ASSERT_EQ(losses.size(), one_f_one_b.losses.size());
  for (std::size_t i = 0; i < losses.size(); ++i) {
    EXPECT_NEAR(losses[i], one_f_one_b.losses[i], 1e-5 * one_f_one_b.losses[i]) << "step " << i;
  }
}

// ZB-V through MPI: 2 stages of two one-layer chunks in a V, TP 2 with sequence parallelism; the threads' bits, and
// the 1F1B run's losses within 1e-5 (the same sums in another order of micro-batches per weight: float rounding).
// DualPipeV likewise (8 sequences, micro-batches of 2: 4 per pipeline, the 2 pp it needs), and DualPipe (2 each way,
// its two copies' gradients summed between the two processes of each TP rank).
// `args`: twin run's command line over MPI, writing dir/mpi.json.
void expect_mpi_trains_the_v_as_threads_do(std::vector<std::string> args, const std::string& dir,
                                           const std::string& schedule) {
  const std::vector<std::string> sets = {"model.layers=4", "parallel.tp=2", "parallel.pp=2",
                                         "parallel.sequence_parallel=true", "parallel.virtual_stages=2",
                                         "parallel.schedule=\"" + schedule + "\""};
  for (const std::string& set : sets) args.insert(args.end(), {"--set", set});
  ASSERT_EQ(testing::run_command(args, dir + "/mpi.log"), 0) << testing::read_text(dir + "/mpi.log");
  const auto mpi = nlohmann::json::parse(testing::read_text(dir + "/mpi.json"));

  TrainOptions options;
  options.steps = 2;
  const auto threads = testing::train(testing::scenario(testing::small_toml(), sets), options);
  const auto losses = mpi["losses"].get<std::vector<double>>();
  EXPECT_EQ(losses, threads.losses);  // bit for bit
  const std::vector<std::string> one_f_one_b_plan(sets.begin(), sets.end() - 2);  // 1F1B, one chunk per stage
  const auto one_f_one_b = testing::train(testing::scenario(testing::small_toml(), one_f_one_b_plan), options);
  ASSERT_EQ(losses.size(), one_f_one_b.losses.size());
  for (std::size_t i = 0; i < losses.size(); ++i) {
    EXPECT_NEAR(losses[i], one_f_one_b.losses[i], 1e-5 * one_f_one_b.losses[i]) << schedule << " step " << i;
  }
}

TEST_F(ExecRunFixture, MpiRanksTrainZeroBubbleVAsThreadsDo) {
  if (!testing::on_path("mpirun"))
    GTEST_SKIP() << "mpirun not found (apt install openmpi-bin): MPI launcher not tested";
  expect_mpi_trains_the_v_as_threads_do(twin_run({"--steps", "2", "--launcher", "mpi", "--json", dir + "/mpi.json"}),
                                        dir, "zb-v");
}

TEST_F(ExecRunFixture, MpiRanksTrainDualPipeVAsThreadsDo) {
  if (!testing::on_path("mpirun"))
    GTEST_SKIP() << "mpirun not found (apt install openmpi-bin): MPI launcher not tested";
  expect_mpi_trains_the_v_as_threads_do(twin_run({"--steps", "2", "--launcher", "mpi", "--json", dir + "/mpi.json"}),
                                        dir, "dualpipev");
}

TEST_F(ExecRunFixture, MpiRanksTrainDualPipeAsThreadsDo) {
  if (!testing::on_path("mpirun"))
    GTEST_SKIP() << "mpirun not found (apt install openmpi-bin): MPI launcher not tested";
  expect_mpi_trains_the_v_as_threads_do(twin_run({"--steps", "2", "--launcher", "mpi", "--json", dir + "/mpi.json"}),
                                        dir, "dualpipe");
}

// FP8 (blockwise, as DeepSeek-V3 trained) on DualPipe through MPI: each B keeps its W's operands' scales, each W
// computes dW later; the threads' bits, and the one-rank FP8 run's losses within 1e-5.
TEST_F(ExecRunFixture, MpiRanksTrainFp8DualPipeAsThreadsDo) {
  if (!testing::on_path("mpirun"))
    GTEST_SKIP() << "mpirun not found (apt install openmpi-bin): MPI launcher not tested";
  const std::vector<std::string> fp8 = {"model.layers=4", "model.dtype=\"bf16\"", "model.fp8=\"e4m3\"",
                                        "framework.fp8_recipe=\"blockwise\""};
  std::vector<std::string> sets = fp8;
  sets.insert(sets.end(), {"parallel.pp=2", "parallel.virtual_stages=2", "parallel.schedule=\"dualpipe\""});
  std::vector<std::string> args = twin_run({"--steps", "2", "--launcher", "mpi", "--json", dir + "/mpi.json"});
  for (const std::string& set : sets) args.insert(args.end(), {"--set", set});
  ASSERT_EQ(testing::run_command(args, dir + "/mpi.log"), 0) << testing::read_text(dir + "/mpi.log");
  const auto losses = nlohmann::json::parse(testing::read_text(dir + "/mpi.json"))["losses"].get<std::vector<double>>();

  TrainOptions options;
  options.steps = 2;
  EXPECT_EQ(losses, testing::train(testing::scenario(testing::small_toml(), sets), options).losses);  // bit for bit
  const auto one_rank = testing::train(testing::scenario(testing::small_toml(), fp8), options).losses;
  ASSERT_EQ(losses.size(), one_rank.size());
  for (std::size_t i = 0; i < losses.size(); ++i) {
    EXPECT_NEAR(losses[i], one_rank[i], 1e-5 * one_rank[i]) << "step " << i;
  }
}

// Context parallelism (the all_gather way) through MPI: 4 processes, CP 2 x TP 2, give the threads' bits, and the
// single-rank losses within 1e-5 (each CP rank on its two chunks of every sequence).
TEST_F(ExecRunFixture, MpiRanksTrainContextParallelismAsThreadsDo) {
  if (!testing::on_path("mpirun"))
    GTEST_SKIP() << "mpirun not found (apt install openmpi-bin): MPI launcher not tested";
  const std::vector<std::string> model = {"framework.attention=\"flash2\"", "framework.cp_comm=\"all_gather\""};
  std::vector<std::string> sets = model;
  sets.insert(sets.end(), {"parallel.cp=2", "parallel.tp=2"});
  std::vector<std::string> args = twin_run({"--steps", "3", "--launcher", "mpi", "--json", dir + "/mpi.json"});
  for (const std::string& set : sets) args.insert(args.end(), {"--set", set});
  ASSERT_EQ(testing::run_command(args, dir + "/mpi.log"), 0) << testing::read_text(dir + "/mpi.log");
  const auto mpi = nlohmann::json::parse(testing::read_text(dir + "/mpi.json"));
  const auto losses = mpi["losses"].get<std::vector<double>>();

  TrainOptions options;
  options.steps = 3;
  const auto threads = testing::train(testing::scenario(testing::small_toml(), sets), options);
  EXPECT_EQ(losses, threads.losses);  // bit for bit
  const auto one = testing::train(testing::scenario(testing::small_toml(), model), options);
  ASSERT_EQ(losses.size(), one.losses.size());
  for (std::size_t i = 0; i < losses.size(); ++i) EXPECT_NEAR(losses[i], one.losses[i], 1e-5 * one.losses[i]);
}

// The p2p ring through MPI: 4 processes, CP 4, each K/V block and its dK/dV a message between CP neighbours, give the
// threads' bits and the single-rank losses within 1e-5.
TEST_F(ExecRunFixture, MpiRanksTrainTheContextRingAsThreadsDo) {
  if (!testing::on_path("mpirun"))
    GTEST_SKIP() << "mpirun not found (apt install openmpi-bin): MPI launcher not tested";
  const std::vector<std::string> model = {"framework.attention=\"flash2\"", "framework.cp_comm=\"p2p\""};
  std::vector<std::string> sets = model;
  sets.push_back("parallel.cp=4");
  std::vector<std::string> args = twin_run({"--steps", "3", "--launcher", "mpi", "--json", dir + "/mpi.json"});
  for (const std::string& set : sets) args.insert(args.end(), {"--set", set});
  ASSERT_EQ(testing::run_command(args, dir + "/mpi.log"), 0) << testing::read_text(dir + "/mpi.log");
  const auto losses = nlohmann::json::parse(testing::read_text(dir + "/mpi.json"))["losses"].get<std::vector<double>>();

  TrainOptions options;
  options.steps = 3;
  EXPECT_EQ(losses, testing::train(testing::scenario(testing::small_toml(), sets), options).losses);  // bit for bit
  const auto one = testing::train(testing::scenario(testing::small_toml(), model), options);
  ASSERT_EQ(losses.size(), one.losses.size());
  for (std::size_t i = 0; i < losses.size(); ++i) EXPECT_NEAR(losses[i], one.losses[i], 1e-5 * one.losses[i]);
}

// The a2a way (DeepSpeed-Ulysses) through MPI: 4 processes, CP 2 x TP 2 (one head of the 4 per rank inside the
// attention core), give the threads' bits, and the single-rank losses within 1e-5.
TEST_F(ExecRunFixture, MpiRanksTrainUlyssesContextParallelismAsThreadsDo) {
  if (!testing::on_path("mpirun"))
    GTEST_SKIP() << "mpirun not found (apt install openmpi-bin): MPI launcher not tested";
  const std::vector<std::string> model = {"framework.attention=\"flash2\"", "framework.cp_comm=\"a2a\""};
  std::vector<std::string> sets = model;
  sets.insert(sets.end(), {"parallel.cp=2", "parallel.tp=2"});
  std::vector<std::string> args = twin_run({"--steps", "3", "--launcher", "mpi", "--json", dir + "/mpi.json"});
  for (const std::string& set : sets) args.insert(args.end(), {"--set", set});
  ASSERT_EQ(testing::run_command(args, dir + "/mpi.log"), 0) << testing::read_text(dir + "/mpi.log");
  const auto losses = nlohmann::json::parse(testing::read_text(dir + "/mpi.json"))["losses"].get<std::vector<double>>();

  TrainOptions options;
  options.steps = 3;
  EXPECT_EQ(losses, testing::train(testing::scenario(testing::small_toml(), sets), options).losses);  // bit for bit
  const auto one = testing::train(testing::scenario(testing::small_toml(), model), options);
  ASSERT_EQ(losses.size(), one.losses.size());
  for (std::size_t i = 0; i < losses.size(); ++i) EXPECT_NEAR(losses[i], one.losses[i], 1e-5 * one.losses[i]);
}

// FP8 delayed scaling under CP 2 x TP 2, checkpointed by 4 threads at step 2 and resumed by 4 MPI processes: each
// reads its shard and its FP8 state file, and the run goes on as the uninterrupted threads' run, bit for bit.
TEST_F(ExecRunFixture, MpiRanksResumeAnFp8ContextParallelCheckpointOfThreads) {
  if (!testing::on_path("mpirun"))
    GTEST_SKIP() << "mpirun not found (apt install openmpi-bin): MPI launcher not tested";
  const std::vector<std::string> sets = {"framework.attention=\"flash2\"",
                                         "framework.cp_comm=\"all_gather\"",
                                         "parallel.cp=2",
                                         "parallel.tp=2",
                                         "model.dtype=\"bf16\"",
                                         "model.fp8=\"hybrid\""};
  const auto s = testing::scenario(testing::small_toml(), sets);
  TrainOptions options;
  options.steps = 4;
  const auto uninterrupted = testing::train(s, options).losses;
  options.steps = 2;
  options.checkpoint_dir = dir + "/ck";
  testing::train(s, options);
  auto args = twin_run({"--steps", "4", "--checkpoint", dir + "/ck", "--launcher", "mpi", "--json", dir + "/mpi.json"});
  for (const std::string& set : sets) args.insert(args.end(), {"--set", set});
  ASSERT_EQ(testing::run_command(args, dir + "/mpi.log"), 0) << testing::read_text(dir + "/mpi.log");
  const auto mpi = nlohmann::json::parse(testing::read_text(dir + "/mpi.json"));
  EXPECT_FALSE(mpi["resharded"].get<bool>());
  EXPECT_EQ(mpi["losses"].get<std::vector<double>>(),
            std::vector<double>(uninterrupted.begin() + 2, uninterrupted.end()));  // bit for bit
}

// A delayed-scaling checkpoint without its FP8 state (as an older twin wrote it): one line, naming the field.
TEST_F(ExecRunFixture, AnFp8CheckpointWithoutItsScalesIsOneClearLine) {
  auto run = [&](const std::string& steps) {
    return twin_run(
        {"--steps", steps, "--checkpoint", dir + "/ck", "--set", "model.dtype=\"bf16\"", "--fp8-format", "hybrid"});
  };
  ASSERT_EQ(testing::run_command(run("1"), dir + "/first.log"), 0) << testing::read_text(dir + "/first.log");
  const std::string manifest = dir + "/ck/step-00000001/manifest.json";
  auto json = nlohmann::json::parse(testing::read_text(manifest));
  ASSERT_TRUE(json.contains("fp8_states"));
  json.erase("fp8_states");
  std::ofstream(manifest) << json.dump(2);
  EXPECT_EQ(testing::run_command(run("2"), dir + "/resumed.log"), 2);
  const std::string log = testing::read_text(dir + "/resumed.log");
  EXPECT_EQ(log.rfind("twin: error: checkpoint manifest '" + manifest + "' has no fp8_states", 0), 0u) << log;
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1) << log;
}

// A checkpoint written by 4 threads (TP 2 x PP 2) resumed by 2 MPI ranks (PP 2): each process re-shards from the old
// shard files by itself, and the run goes on as the uninterrupted one.
TEST_F(ExecRunFixture, MpiRanksReshardACheckpointOfThreadsInAnotherPlan) {
  if (!testing::on_path("mpirun"))
    GTEST_SKIP() << "mpirun not found (apt install openmpi-bin): MPI launcher not tested";
  const auto plan_a = testing::scenario(testing::small_toml(), {"parallel.tp=2", "parallel.pp=2"});
  TrainOptions options;
  options.steps = 5;
  const auto uninterrupted = testing::train(plan_a, options).losses;
  options.steps = 3;
  options.checkpoint_dir = dir + "/ck";
  testing::train(plan_a, options);
  auto args = twin_run({"--set", "parallel.pp=2", "--steps", "5", "--checkpoint", dir + "/ck"});
  args.insert(args.end(), {"--launcher", "mpi", "--json", dir + "/mpi.json"});
  ASSERT_EQ(testing::run_command(args, dir + "/mpi.log"), 0) << testing::read_text(dir + "/mpi.log");
  const auto mpi = nlohmann::json::parse(testing::read_text(dir + "/mpi.json"));
  EXPECT_TRUE(mpi["resharded"].get<bool>());
  const auto losses = mpi["losses"].get<std::vector<double>>();
  ASSERT_EQ(losses.size(), 2u);
  for (std::size_t k = 0; k < losses.size(); ++k)
    EXPECT_NEAR(losses[k], uninterrupted[3 + k], 1e-6 * uninterrupted[3 + k]) << "step " << 3 + k;
}

TEST_F(ExecRunFixture, AnMpiJobOfTheWrongSizeIsRefused) {
  if (!testing::on_path("mpirun"))
    GTEST_SKIP() << "mpirun not found (apt install openmpi-bin): MPI launcher not tested";
  std::vector<std::string> args = {"mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none"};
  if (geteuid() == 0) args.emplace_back("--allow-run-as-root");
  const auto run = twin_run({"--set", "parallel.tp=2", "--set", "parallel.pp=2", "--steps", "1"});
  args.insert(args.end(), run.begin(), run.end());
  EXPECT_NE(testing::run_command(args, dir + "/wrong.log"), 0);
  const std::string log = testing::read_text(dir + "/wrong.log");
  EXPECT_NE(log.find("the job has 2 ranks but the plan needs tp * pp * dp = 2 * 2 * 1 = 4"), std::string::npos) << log;
}

// The same user mistakes exit as under threads (2), with one `twin: error:` line, not one per rank: a corrupt
// checkpoint shard (one rank reads it), a data file no rank can read (every rank would say so).
TEST_F(ExecRunFixture, MpiGivesTheThreadsExitStatusAndOneLineForUserMistakes) {
  if (!testing::on_path("mpirun"))
    GTEST_SKIP() << "mpirun not found (apt install openmpi-bin): MPI launcher not tested";
  ASSERT_EQ(testing::run_command(twin_run({"--set", "parallel.pp=2", "--steps", "2", "--checkpoint", dir + "/ck"}),
                                 dir + "/first.log"),
            0);
  const std::string shard = dir + "/ck/step-00000002/rank-00001.bin";
  {
    std::fstream file(shard, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(100);
    file.put('\x7f');
  }
  const auto resume = twin_run({"--set", "parallel.pp=2", "--steps", "3", "--checkpoint", dir + "/ck"});
  EXPECT_EQ(testing::run_command(resume, dir + "/threads.log"), 2);
  auto mpi = resume;
  mpi.insert(mpi.end(), {"--launcher", "mpi"});
  EXPECT_EQ(testing::run_command(mpi, dir + "/mpi.log"), 2);
  const std::string log = testing::read_text(dir + "/mpi.log");
  const std::string line = "twin: error: checkpoint shard '" + shard + "' is corrupt";
  EXPECT_NE(log.find(line), std::string::npos) << log;
  EXPECT_EQ(log.find(line, log.find(line) + 1), std::string::npos) << log;

  std::vector<std::string> job = {"mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none"};
  if (geteuid() == 0) job.emplace_back("--allow-run-as-root");
  const std::vector<std::string> missing = {TWIN_BINARY,       "run",   scenario_file,   "--data",
                                            dir + "/none.txt", "--set", "parallel.pp=2", "--quiet"};
  job.insert(job.end(), missing.begin(), missing.end());
  EXPECT_EQ(testing::run_command(job, dir + "/data.log"), 2);
  const std::string data_log = testing::read_text(dir + "/data.log");
  const std::string data_line = "twin: error: --data '" + dir + "/none.txt': cannot open the file";
  EXPECT_NE(data_log.find(data_line), std::string::npos) << data_log;
  EXPECT_EQ(data_log.find(data_line, data_log.find(data_line) + 1), std::string::npos) << data_log;
}

TEST_F(ExecRunFixture, WritesJsonWithLossesTimesAndSummary) {
  ASSERT_EQ(
      testing::run_command(twin_run({"--steps", "2", "--json", dir + "/run.json", "--trace", dir + "/trace.json"}),
                           dir + "/run.log"),
      0)
      << testing::read_text(dir + "/run.log");
  const auto json = nlohmann::json::parse(testing::read_text(dir + "/run.json"));
  EXPECT_EQ(json["losses"].size(), 2u);
  EXPECT_EQ(json["iteration_time_s"].size(), 2u);
  EXPECT_GT(json["tokens_per_s"].get<double>(), 0);
  EXPECT_TRUE(json["summary"].contains("bubble_fraction"));
  EXPECT_NO_THROW(nlohmann::json::parse(testing::read_text(dir + "/trace.json")));
}

// Two traces of one Program (here two steps of one run) compare op by op; a trace against itself differs nowhere.
TEST_F(ExecRunFixture, TracesOfOneProgramCompareOpByOp) {
  const std::vector<std::string> plan = {"--set", "parallel.pp=2", "--steps", "2", "--json", dir + "/run.json"};
  auto first = twin_run(plan), last = twin_run(plan);
  first.insert(first.end(), {"--trace", dir + "/step1.json", "--trace-step", "1"});
  last.insert(last.end(), {"--trace", dir + "/step2.json"});
  ASSERT_EQ(testing::run_command(first, dir + "/step1.log"), 0) << testing::read_text(dir + "/step1.log");
  ASSERT_EQ(testing::run_command(last, dir + "/step2.log"), 0) << testing::read_text(dir + "/step2.log");
  const std::string twin = TWIN_BINARY;
  ASSERT_EQ(testing::run_command({twin, "compare", dir + "/step2.json", dir + "/step1.json", "--top", "3"},
                                 dir + "/compare.log"),
            0)
      << testing::read_text(dir + "/compare.log");
  const std::string table = testing::read_text(dir + "/compare.log");
  EXPECT_NE(table.find("ops on 2 ranks (0-1)"), std::string::npos) << table;
  EXPECT_NE(table.find("forward mlp_up"), std::string::npos) << table;
  EXPECT_NE(table.find("the 3 ops that differ most"), std::string::npos) << table;

  ASSERT_EQ(testing::run_command({twin, "compare", dir + "/step2.json", dir + "/step2.json"}, dir + "/self.log"), 0);
  std::istringstream self(testing::read_text(dir + "/self.log"));
  int rows = 0;
  for (std::string line; std::getline(self, line);) {
    if (line.find('%') == std::string::npos) continue;
    ++rows;
    EXPECT_EQ(line.substr(line.size() - 5), "+0.0%") << line;
  }
  EXPECT_GT(rows, 10);

  EXPECT_EQ(testing::run_command({twin, "compare", dir + "/step2.json", dir + "/run.json"}, dir + "/mixed.log"), 2);
  EXPECT_NE(testing::read_text(dir + "/mixed.log").find("is a trace but"), std::string::npos);
  EXPECT_EQ(testing::run_command({twin, "compare", dir + "/step2.json", "1.5"}, dir + "/time.log"), 2);
  EXPECT_NE(testing::read_text(dir + "/time.log").find("compare it with another trace"), std::string::npos);
}

TEST_F(ExecRunFixture, AMissingDataFileIsOneClearLine) {
  const auto args = std::vector<std::string>{TWIN_BINARY, "run", scenario_file, "--data", dir + "/nope.txt"};
  EXPECT_EQ(testing::run_command(args, dir + "/missing.log"), 2);
  EXPECT_EQ(testing::read_text(dir + "/missing.log"),
            "twin: error: --data '" + dir + "/nope.txt': cannot open the file\n");
}

// A diverged run is a failed run (exit 1) with one clear line, not an internal error.
TEST_F(ExecRunFixture, ADivergingRunIsAFailedRunWithOneClearLine) {
  EXPECT_EQ(
      testing::run_command(twin_run({"--steps", "4", "--set", "training.learning_rate=1e30"}), dir + "/diverged.log"),
      1);
  const std::string log = testing::read_text(dir + "/diverged.log");
  EXPECT_EQ(log.rfind("twin: error: training diverged", 0), 0u) << log;
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1) << log;
}

#endif

}  // namespace
}  // namespace twin::exec
