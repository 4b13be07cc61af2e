// Gradients across plans, element by element, before clipping: what equal losses cannot show. With gradient clipping
// active at every step (the parity model's grad_clip 1.0), a plan whose gradient is off by a global factor (DP
// averaging where the loss is already a mean, a cross-entropy scaled by the DP rank's tokens, a replicated tensor
// counted twice) trains to the same losses; its gradient does not equal the single rank's.
//
// Every rank runs the first iteration of the Program up to its gradient norm (forward, backward and the gradient
// reductions); each rank's gradient elements are placed in the full tensors by name (full_element_index, as
// re-sharding places parameters): under ZeRO-1 and ZeRO-3 only the rank's own shard holds the reduced sum.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <mutex>
#include <thread>

#include "exec/comm/threads_communicator.hpp"
#include "exec/interpreter/interpreter.hpp"
#include "exec/shard/model_shard.hpp"
#include "exec/train/backend_factory.hpp"
#include "exec_test_util.hpp"

namespace twin::exec {
namespace {

struct FullGradients {
  std::map<std::string, std::vector<double>> values;  // by tensor name, the full tensor's elements
  std::map<std::string, std::vector<int>> copies;     // how many ranks held each element
};

// The Program without what follows the gradients: each stage's list up to its gradient norm or optimizer.
model::Program up_to_the_gradient_norm(const model::Scenario& s) {
  model::Program program = model::build_program(s, model::Granularity::Op);
  for (std::vector<model::Op>& ops : program.stage_ops) {
    std::size_t end = 0;
    while (end < ops.size() && ops[end].phase != model::Phase::Optimizer &&
           !(ops[end].kind == model::OpKind::Collective && ops[end].payload == model::Payload::GradNormSquared)) {
      ++end;
    }
    ops.resize(end);
  }
  return program;
}

FullGradients gradients_of(const model::Scenario& s) {
  const model::Program program = up_to_the_gradient_norm(s);
  const int world = program.layout.world_size();
  ThreadsWorld threads_world(world, CommOptions{60});
  FullGradients full;
  std::mutex mutex;
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  const bool sharded = s.parallel.zero_stage >= 1 && s.parallel.dp > 1;
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < world; ++rank) {
    ranks.emplace_back([&, rank] {
      try {
        auto comm = threads_world.communicator(rank);
        BackendOptions backend_options;
        backend_options.threads = 1;
        backend_options.shares_process = world > 1;
        auto backend = make_backend("cpu", backend_options);
        const model::RankCoord coord = program.layout.coord_of(rank);
        ModelShard shard(program.scenario, coord, *backend);
        shard.initialize(program.scenario.training.seed);
        Interpreter interpreter(program, rank, *backend, *comm, shard);
        IterationInput input;
        input.micro_batches = DataLoader(testing::corpus(), program.scenario).micro_batches(0, coord.dp);
        interpreter.run_iteration(input);
        for (const Bucket& b : shard.buckets()) {
          std::vector<float> grads(b.padded_numel);
          backend->download_f32(grads.data(), b.grads);
          const std::size_t owned_begin = b.shard_offset, owned_end = b.shard_offset + b.shard_numel;
          std::lock_guard lock(mutex);
          for (const ParamTensor& t : b.tensors) {
            std::vector<double>& values = full.values[t.name];
            std::vector<int>& copies = full.copies[t.name];
            values.resize(static_cast<std::size_t>(t.rows * t.cols), 0.0);
            copies.resize(values.size(), 0);
            for (std::size_t i = 0; i < t.numel; ++i) {
              const std::size_t at = t.offset + i;
              if (sharded && (at < owned_begin || at >= owned_end)) continue;  // not reduced here
              const std::int64_t e = full_element_index(t, shard.dims(), i);
              if (e < 0) continue;  // a padded vocabulary row
              const auto index = static_cast<std::size_t>(e);
              const double value = grads[at];
              // every copy of an element (DP replicas, TP-replicated tensors, the tied embedding's two copies) must
              // hold the same reduced value: the first one read is kept, the others checked against it below
              if (copies[index] == 0)
                values[index] = value;
              else if (std::abs(values[index] - value) > 1e-6 * (std::abs(value) + 1e-6))
                copies[index] = -1000000;
              ++copies[index];
            }
          }
        }
      } catch (const std::exception& error) {
        errors[static_cast<std::size_t>(rank)] = error.what();
        threads_world.abort(rank, error.what());
      }
    });
  }
  for (auto& thread : ranks) thread.join();
  for (const std::string& error : errors) EXPECT_EQ(error, "");
  return full;
}

double norm(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x * x;
  return std::sqrt(sum);
}

using testing::Plan;

const FullGradients& reference() {
  static const FullGradients one_rank = gradients_of(testing::scenario(testing::parity_toml()));
  return one_rank;
}

class ExecGradientParity : public ::testing::TestWithParam<Plan> {};

// Every parameter's gradient equals the single rank's within 1e-5 of its norm (observed: up to 5.3e-7), every element
// is held by some rank, and all copies of an element agree.
TEST_P(ExecGradientParity, EveryParameterHasTheSingleRanksGradient) {
  const Plan& plan = GetParam();
  const FullGradients many = gradients_of(testing::scenario(testing::parity_toml(), plan.sets));
  const FullGradients& one = reference();
  ASSERT_EQ(many.values.size(), one.values.size());
  double worst = 0;
  for (const auto& [name, expected] : one.values) {
    const std::vector<double>& got = many.values.at(name);
    const std::vector<int>& copies = many.copies.at(name);
    ASSERT_EQ(got.size(), expected.size()) << name;
    std::vector<double> difference(got.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      ASSERT_GT(copies[i], 0) << plan.name << ": " << name << " element " << i
                              << (copies[i] < 0 ? " differs between its copies" : " is held by no rank");
      difference[i] = got[i] - expected[i];
    }
    const double relative = norm(difference) / std::max(norm(expected), 1e-12);
    worst = std::max(worst, relative);
    EXPECT_LE(relative, 1e-5) << plan.name << ": " << name << " (|g| " << norm(got) << ", single rank "
                              << norm(expected) << ")";
  }
  std::printf("[ gradients ] %-28s largest relative difference %.1e over %zu tensors\n", plan.name, worst,
              one.values.size());
}

INSTANTIATE_TEST_SUITE_P(
    Plans, ExecGradientParity,
    ::testing::Values(
        Plan{"tp2", {"parallel.tp=2"}}, Plan{"pp2", {"parallel.pp=2"}}, Plan{"dp2", {"parallel.dp=2"}},
        Plan{"tp2_pp2_dp2", {"parallel.tp=2", "parallel.pp=2", "parallel.dp=2"}},
        Plan{"tp2_sequence_parallel", {"parallel.tp=2", "parallel.sequence_parallel=true"}},
        Plan{"dp2_zero1", {"parallel.dp=2", "parallel.zero_stage=1"}},
        Plan{"pp2_v2_dp2",
             {"parallel.pp=2", "parallel.virtual_stages=2", "parallel.schedule=\"interleaved\"", "parallel.dp=2"}},
        Plan{"deepspeed_tp2_pp2_dp2_zero1",
             {"framework.name=\"deepspeed\"", "parallel.tp=2", "parallel.pp=2", "parallel.dp=2",
              "parallel.zero_stage=1"}},
        Plan{"composer_dp2_zero3", {"framework.name=\"composer\"", "parallel.dp=2", "parallel.zero_stage=3"}},
        Plan{"pp4_uneven_1_3_3_1", {"parallel.pp=4", "parallel.first_stage_layers=1", "parallel.last_stage_layers=1"}}),
    [](const ::testing::TestParamInfo<Plan>& plan_info) { return std::string(plan_info.param.name); });

}  // namespace
}  // namespace twin::exec
