// `twin run` of a Mixture-of-Experts model: MPI ranks (expert parallelism across processes: the all-to-alls and the
// expert-data-parallel reductions through MPI; in FP8 too) give the threads' losses bit for bit and one rank's within
// 1e-5, and --json reports the load-balancing loss of every step.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "exec_test_util.hpp"

namespace twin::exec {
namespace {

namespace fs = std::filesystem;

#ifdef TWIN_BINARY

const std::vector<std::string> kMoe = {"model.experts=4", "model.top_k=2", "model.moe_ffn_hidden=96",
                                       "model.shared_experts=1"};

struct ExecMoeRunFixture : ::testing::Test {
  void SetUp() override {
    dir = testing::temp_dir("moe-run");
    scenario_file = dir + "/small.toml";
    std::ofstream(scenario_file) << testing::small_toml();
  }
  void TearDown() override { fs::remove_all(dir); }
  nlohmann::json twin_run(const std::vector<std::string>& sets, std::vector<std::string> extra) const {
    std::vector<std::string> args = {
        TWIN_BINARY, "run", scenario_file, "--data", testing::source_dir() + "/data/corpus.txt",
        "--threads", "1",   "--quiet",     "--json", dir + "/run.json"};
    for (const std::string& set : kMoe) args.insert(args.end(), {"--set", set});
    for (const std::string& set : sets) args.insert(args.end(), {"--set", set});
    args.insert(args.end(), extra.begin(), extra.end());
    EXPECT_EQ(testing::run_command(args, dir + "/run.log"), 0) << testing::read_text(dir + "/run.log");
    return nlohmann::json::parse(testing::read_text(dir + "/run.json"));
  }
  static TrainResult threads(const std::vector<std::string>& sets, int steps) {
    std::vector<std::string> all = kMoe;
    all.insert(all.end(), sets.begin(), sets.end());
    TrainOptions options;
    options.steps = steps;
    return testing::train(testing::scenario(testing::small_toml(), all), options);
  }
  std::string dir, scenario_file;
};

TEST_F(ExecMoeRunFixture, JsonReportsTheLoadBalancingLossOfEveryStep) {
  const auto json = twin_run({"parallel.dp=2", "parallel.ep=2"}, {"--steps", "3"});
  ASSERT_TRUE(json.contains("aux_losses")) << json.dump();
  const auto aux = json["aux_losses"].get<std::vector<double>>();
  ASSERT_EQ(aux.size(), 3u);
  const TrainResult one = threads({}, 3);
  for (std::size_t i = 0; i < aux.size(); ++i) {
    EXPECT_NEAR(aux[i], one.aux_losses[i], 1e-5 * one.aux_losses[i]);
    EXPECT_GE(aux[i], 0.02 * 0.999);  // 2 MoE layers x coeff 1e-2 x at least 1 (perfect balance)
  }
  EXPECT_TRUE(json["summary"].contains("bubble_fraction"));  // the traced step's MoE ops summarized too
}

TEST_F(ExecMoeRunFixture, MpiRanksTrainMoeAsThreadsDo) {
  if (!testing::on_path("mpirun"))
    GTEST_SKIP() << "mpirun not found (apt install openmpi-bin): MPI launcher not tested";
  const std::vector<std::string> plan = {"parallel.tp=2", "parallel.sequence_parallel=true", "parallel.dp=2",
                                         "parallel.ep=4", "parallel.zero_stage=1"};
  const auto mpi = twin_run(plan, {"--steps", "3", "--launcher", "mpi"});
  const TrainResult threads_run = threads(plan, 3), one = threads({}, 3);
  const auto losses = mpi["losses"].get<std::vector<double>>();
  EXPECT_EQ(losses, threads_run.losses);  // bit for bit
  EXPECT_EQ(mpi["aux_losses"].get<std::vector<double>>(), threads_run.aux_losses);
  ASSERT_EQ(losses.size(), one.losses.size());
  double worst = 0;
  for (std::size_t i = 0; i < losses.size(); ++i) {
    EXPECT_NEAR(losses[i], one.losses[i], 1e-5 * one.losses[i]) << "step " << i;
    worst = std::max(worst, std::abs(losses[i] - one.losses[i]) / one.losses[i]);
  }
  std::printf("[ moe parity ] mpi tp2_sp_dp2_ep4_zero1 losses %.7f %.7f %.7f  max relative difference %.1e\n",
              losses[0], losses[1], losses[2], worst);
}

// FP8 (delayed scaling): the experts' GEMMs each with its own scales, their amaxes reduced through MPI as through
// threads, bit for bit.
TEST_F(ExecMoeRunFixture, MpiRanksTrainMoeInFp8AsThreadsDo) {
  if (!testing::on_path("mpirun"))
    GTEST_SKIP() << "mpirun not found (apt install openmpi-bin): MPI launcher not tested";
  const std::vector<std::string> plan = {"model.dtype=\"bf16\"", "model.fp8=\"hybrid\"", "parallel.dp=2",
                                         "parallel.ep=2"};
  const auto mpi = twin_run(plan, {"--steps", "3", "--launcher", "mpi"});
  EXPECT_EQ(mpi["losses"].get<std::vector<double>>(), threads(plan, 3).losses);  // bit for bit
}

#endif  // TWIN_BINARY

}  // namespace
}  // namespace twin::exec
