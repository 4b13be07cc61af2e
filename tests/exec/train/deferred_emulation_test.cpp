// The CPU emulation of the device path's deferred collectives (exec/train/deferred_emulation.hpp): the ZeRO-1 + dp_overlap
// race (a reduce-scatter left running on the NCCL stream while the compute stream zeroes part of its buffer) is
// caught in strict mode when planted, the order the interpreter now keeps passes, and training through the emulation
// follows the single-rank losses.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "exec/comm/threads_communicator.hpp"
#include "exec/core/backend.hpp"
#include "exec/core/check.hpp"
#include "exec/train/backend_factory.hpp"
#include "exec/train/deferred_emulation.hpp"
#include "exec_test_util.hpp"

namespace twin::exec {
namespace {

constexpr int kRanks = 2;
constexpr std::size_t kCount = 8;  // elements of each rank's shard

// One rank of a data-parallel pair whose gradient reductions are deferred, as under dp_overlap on GPUs.
struct Rank {
  DeferredCollectives deferred;
  std::unique_ptr<Backend> backend;
  DeferringCommunicator comm;
  const CommGroup data{"data", {0, 1}};

  Rank(int rank, Communicator& host, DeferredCheck check)
      : deferred(rank, check),
        backend(make_deferred_check_backend(make_backend("cpu"), deferred)),
        comm(host, deferred, DeferralRule::of(/*dp_overlap=*/true, /*shards_parameters=*/false)) {}
};

// Runs fn on kRanks threads; returns each rank's error message ("" if none).
std::vector<std::string> run_ranks(DeferredCheck check, const std::function<void(int, Rank&)>& fn) {
  ThreadsWorld world(kRanks, CommOptions{10});
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      auto host = world.communicator(r);
      try {
        Rank rank(r, *host, check);
        fn(r, rank);
      } catch (const std::exception& error) {
        errors[static_cast<std::size_t>(r)] = error.what();
        if (dynamic_cast<const PeerFailure*>(&error) == nullptr) world.abort(r, error.what());
      }
    });
  }
  for (auto& thread : threads) thread.join();
  return errors;
}

// rank r's gradient buffer (2 shards): element i = (r + 1) * (i + 1)
Tensor gradients(Rank& rank, int r) {
  std::vector<float> values(kRanks * kCount);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>((r + 1) * (i + 1));
  Tensor grads = rank.backend->allocate(values.size(), DType::F32);
  rank.backend->upload_f32(grads, values.data());
  return grads;
}

// what exec/interpreter/optimizer.cpp did before the fix: reduce-scatter, then zero the other ranks' shards at once
void reduce_scatter_then_zero_the_rest(Rank& rank, int r, const Tensor& grads) {
  const Tensor mine = grads.slice(r * kCount, kCount);
  rank.comm.reduce_scatter(rank.data, grads.data, mine.data, kCount, DType::F32, "gradients of layer 0");
  const Tensor rest = grads.slice((1 - r) * kCount, kCount);
  rank.backend->fill(rest, 0.0f);
}

TEST(ExecDeferredEmulation, StrictModeCatchesTheZeroingUnderADeferredReduceScatter) {
  const auto errors = run_ranks(DeferredCheck::Strict, [](int r, Rank& rank) {
    const Tensor grads = gradients(rank, r);
    reduce_scatter_then_zero_the_rest(rank, r, grads);
  });
  for (int r = 0; r < kRanks; ++r) {
    const std::string& error = errors[static_cast<std::size_t>(r)];
    EXPECT_NE(error.find("fill touches its x"), std::string::npos) << error;
    EXPECT_NE(error.find("deferred reduce_scatter gradients of layer 0 on the data group (ranks 0, 1)"),
              std::string::npos)
        << error;
    EXPECT_NE(error.find("rank " + std::to_string(r)), std::string::npos) << error;
  }
}

TEST(ExecDeferredEmulation, OrderModeWaitsBeforeTheTouchAsTheCudaBackendDoes) {
  std::vector<std::vector<float>> results(kRanks);
  const auto errors = run_ranks(DeferredCheck::Order, [&](int r, Rank& rank) {
    const Tensor grads = gradients(rank, r);
    reduce_scatter_then_zero_the_rest(rank, r, grads);
    results[static_cast<std::size_t>(r)].resize(grads.numel);
    rank.backend->download_f32(results[static_cast<std::size_t>(r)].data(), grads);
  });
  for (const auto& error : errors) ASSERT_EQ(error, "");
  for (int r = 0; r < kRanks; ++r) {
    for (std::size_t i = 0; i < kRanks * kCount; ++i) {
      const bool mine = i / kCount == static_cast<std::size_t>(r);
      const float sum = static_cast<float>((1 + 2) * (i + 1));  // ranks 0 and 1: (r + 1) (i + 1) summed
      EXPECT_EQ(results[static_cast<std::size_t>(r)][i], mine ? sum : 0.0f) << "rank " << r << " element " << i;
    }
  }
}

TEST(ExecDeferredEmulation, StrictModePassesWhenNothingTouchesTheBufferBeforeTheWait) {
  std::vector<double> norms(kRanks);
  const auto errors = run_ranks(DeferredCheck::Strict, [&](int r, Rank& rank) {
    const Tensor grads = gradients(rank, r);
    const Tensor mine = grads.slice(r * kCount, kCount);
    rank.comm.reduce_scatter(rank.data, grads.data, mine.data, kCount, DType::F32, "gradients of layer 0");
    Tensor other = rank.backend->zeros(4, DType::F32);  // compute on other memory goes on under the reduction
    rank.backend->fill(other, 1.0f);
    norms[static_cast<std::size_t>(r)] = rank.backend->squared_norm_sum({mine});  // a wait point: the norm
  });
  for (const auto& error : errors) ASSERT_EQ(error, "");
  for (int r = 0; r < kRanks; ++r) {
    double want = 0;
    for (std::size_t i = r * kCount; i < (r + 1) * kCount; ++i) want += std::pow(3.0 * (i + 1), 2);
    EXPECT_EQ(norms[static_cast<std::size_t>(r)], want);  // the reduced shard, not the rank's own partial sums
  }
}

TEST(ExecDeferredEmulation, CollectivesOutsideTheDataGroupAreNeverDeferred) {
  const auto errors = run_ranks(DeferredCheck::Strict, [](int r, Rank& rank) {
    const Tensor grads = gradients(rank, r);
    rank.comm.all_reduce(CommGroup{"tensor", {0, 1}}, grads.data, grads.numel, DType::F32, "activations");
    rank.backend->fill(grads, 0.0f);  // finished: free to touch
  });
  for (const auto& error : errors) EXPECT_EQ(error, "");
}

// The interpreter's order under ZeRO-1 + dp_overlap (with pipeline stages, so that reductions are deferred while
// other layers' backward goes on), checked in strict mode: no kernel touches a deferred reduction's memory, and the
// losses are the single-rank run's.
TEST(ExecDeferredEmulation, TrainingUnderZeroOneWithOverlapKeepsTheOrderAndTheLosses) {
  using testing::scenario;
  using testing::small_toml;
  TrainOptions options;
  options.steps = 3;
  const std::vector<double> one = testing::train(scenario(small_toml()), options).losses;
  options.check_deferred_collectives = true;
  for (const auto& plan :
       std::vector<std::vector<std::string>>{{"parallel.dp=2", "parallel.zero_stage=1", "parallel.dp_overlap=true"},
                                             {"parallel.pp=2", "parallel.dp=2", "parallel.zero_stage=1",
                                              "parallel.dp_overlap=true", "parallel.overlap_param_gather=true"},
                                             {"parallel.tp=2", "parallel.dp=2", "parallel.dp_overlap=true"}}) {
    const std::vector<double> many = testing::train(scenario(small_toml(), plan), options).losses;
    ASSERT_EQ(many.size(), one.size());
    for (std::size_t i = 0; i < one.size(); ++i) EXPECT_NEAR(many[i], one[i], 1e-5 * one[i]) << plan[1];
  }
}

}  // namespace
}  // namespace twin::exec
