// The NCCL communicator (exec/cuda/nccl_communicator.hpp). On any machine: the groups it creates at start-up, the same
// list on every rank. With one GPU: a one-rank job (NCCL refuses two ranks on one device), where the set-up, a
// deferred reduction ordered before a kernel that touches its buffer, a call outside the Program's groups, and an
// abort that ends every later call and host wait are checked. Peers that die or never send need two GPUs: the
// watchdog that turns them into errors is tested on the CPU (tests/exec/comm/watchdog_test.cpp).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "exec/comm/threads_communicator.hpp"
#include "exec/core/errors.hpp"
#include "exec/cuda/cuda_backend.hpp"
#include "exec/cuda/cuda_exec.hpp"
#include "exec/cuda/nccl_communicator.hpp"
#include "model/program/program.hpp"
#include "model/scenario/scenario.hpp"
#include "tests/kernels_cuda/cuda_test_util.hpp"

namespace twin::exec::cuda {
namespace {

using kernels::cuda::testing::gpu_available;

model::Program program(int tp, int pp, int dp) {
  const std::string toml =
      "[model]\nname = \"t\"\nlayers = 4\nhidden = 64\nheads = 4\nseq_len = 32\nvocab = 256\n"
      "dtype = \"bf16\"\n[parallel]\ntp = " +
      std::to_string(tp) + "\npp = " + std::to_string(pp) + "\ndp = " + std::to_string(dp) +
      "\nmicro_batch = 2\nglobal_batch = " + std::to_string(8 * dp) + "\n[cluster]\nnode = \"cpu-host\"\n";
  return model::build_program(model::parse_scenario(toml, "test"));
}

std::vector<std::string> describe(const std::vector<CommGroup>& groups) {
  std::vector<std::string> out;
  for (const CommGroup& g : groups) out.push_back(std::string(g.kind) + " " + format_ranks(g.members));
  return out;
}

TEST(CudaNccl, EveryGroupOfTheProgramIsKnownAtStartUpInOneOrder) {
  // tp 2, pp 2, dp 2: rank = tp + 2 (dp + 2 pp). The tied embedding's copies on stages 0 and 1 of each (dp, tp).
  const std::vector<std::string> want = {"data ranks 0, 2",
                                         "data ranks 1, 3",
                                         "data ranks 4, 6",
                                         "data ranks 5, 7",
                                         "embedding ranks 0, 4",
                                         "embedding ranks 1, 5",
                                         "embedding ranks 2, 6",
                                         "embedding ranks 3, 7",
                                         "tensor ranks 0, 1",
                                         "tensor ranks 2, 3",
                                         "tensor ranks 4, 5",
                                         "tensor ranks 6, 7",
                                         "world ranks 0, 1, 2, 3, 4, 5, 6, 7"};
  EXPECT_EQ(describe(collective_groups(program(2, 2, 2))), want);
  // one rank: the world (the gradient norm) and nothing else
  EXPECT_EQ(describe(collective_groups(program(1, 1, 1))), std::vector<std::string>{"world rank 0"});
}

TEST(CudaNccl, OneRankSetUpDeferralAndAbort) {
  TWIN_REQUIRE_GPU();
  ThreadsWorld world(1, CommOptions{20});
  auto host = world.communicator(0);
  CudaBackend backend;
  NcclOptions options;
  options.groups = {CommGroup{"data", {0}}, CommGroup{"tensor", {0}}};
  options.deferral = DeferralRule::of(/*dp_overlap=*/true, /*shards_parameters=*/false);
  options.timeout_s = 20;
  NcclCommunicator comm(*host, backend.device_context(), options);

  // a deferred reduce-scatter (one member: a copy into its shard), then a kernel writing the buffer: ordered after it
  std::vector<float> values(64);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  Tensor grads = backend.allocate(values.size(), DType::F32), shard = backend.allocate(values.size(), DType::F32);
  backend.upload_f32(grads, values.data());
  comm.reduce_scatter(CommGroup{"data", {0}}, grads.data, shard.data, values.size(), DType::F32, "gradients");
  EXPECT_TRUE(backend.device_context().has_deferred());
  backend.fill(grads, -1.0f);
  std::vector<float> got(values.size());
  backend.download_f32(got.data(), shard);
  EXPECT_EQ(got, values);

  try {
    comm.all_reduce(CommGroup{"embedding", {0}}, grads.data, grads.numel, DType::F32, "tied embedding");
    FAIL() << "a group outside the Program's was accepted";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("not among the Program's"), std::string::npos) << e.what();
  }

  comm.abort("planted failure");
  EXPECT_THROW(comm.all_reduce(CommGroup{"tensor", {0}}, grads.data, grads.numel, DType::F32, "after the abort"),
               CommError);
  try {
    backend.synchronize();
    FAIL() << "the backend's host wait did not report the abort";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 aborted: planted failure"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace twin::exec::cuda
