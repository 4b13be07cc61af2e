// FP8 delayed scaling's scales after one iteration, rank by rank (what losses cannot show: whether a plan's amax
// reductions give every rank the one-rank run's scales). Shared by the FP8 and the context-parallel FP8 tests.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "exec/comm/threads_communicator.hpp"
#include "exec/interpreter/fp8_state.hpp"
#include "exec/interpreter/interpreter.hpp"
#include "exec/shard/model_shard.hpp"
#include "exec/train/backend_factory.hpp"
#include "exec/train/context_parallel.hpp"
#include "exec_test_util.hpp"

namespace twin::exec::fp8_scales {

using ScaleKey = std::tuple<int, int, int>;  // layer, GEMM kind, role

// Every rank's scales of the layers it holds after one iteration of `s` on the test corpus (each CP rank on its two
// chunks of every sequence), by (layer, GEMM kind, role).
inline std::vector<std::map<ScaleKey, float>> scales_after_one_iteration(const model::Scenario& s) {
  const model::Program program = model::build_program(s, model::Granularity::Op);
  const int world = program.layout.world_size();
  ThreadsWorld threads_world(world, CommOptions{60});
  std::vector<std::map<ScaleKey, float>> scales(static_cast<std::size_t>(world));
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < world; ++rank) {
    ranks.emplace_back([&, rank] {
      try {
        auto comm = threads_world.communicator(rank);
        BackendOptions backend_options;
        backend_options.shares_process = world > 1;
        auto backend = make_backend("cpu", backend_options);
        const model::RankCoord coord = program.layout.coord_of(rank);
        ModelShard shard(program.scenario, coord, *backend);
        shard.initialize(program.scenario.training.seed);
        Interpreter interpreter(program, rank, *backend, *comm, shard);
        IterationInput input;
        input.micro_batches = DataLoader(testing::corpus(), program.scenario).micro_batches(0, coord.dp);
        const auto& p = program.scenario.parallel;
        for (MicroBatch& mb : input.micro_batches) {
          if (p.cp > 1) {
            mb = context_parallel_share(mb, static_cast<int>(p.micro_batch),
                                        static_cast<int>(program.scenario.model.seq_len), static_cast<int>(p.cp),
                                        coord.cp);
          }
        }
        interpreter.run_iteration(input);
        // every tensor the rank's state holds after the iteration (only its own layers' GEMMs: a tensor the
        // iteration never recorded is missing here, and the callers' size checks see it)
        for (const Fp8TensorScales& t : interpreter.fp8_state()->saved()) {
          for (int role = 0; role < 3; ++role) {
            scales[static_cast<std::size_t>(rank)][{t.layer, t.what, role}] = t.scale[static_cast<std::size_t>(role)];
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
  return scales;
}

}  // namespace twin::exec::fp8_scales
