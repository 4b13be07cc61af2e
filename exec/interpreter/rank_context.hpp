// What the interpreter and its feature runners (moe/, context/, fp8_linear, optimizer) share on one rank: where the
// rank is and what it runs on (backend, communicator, parameter shard, groups), the op being run, and the iteration
// under way (its input, its output's sums, and the per-(micro-batch, chunk) state of the dense layers).
#pragma once

#include <array>
#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "exec/comm/communicator.hpp"
#include "exec/core/backend.hpp"
#include "exec/interpreter/chunk_state.hpp"
#include "exec/interpreter/iteration.hpp"
#include "exec/shard/model_shard.hpp"
#include "model/program/program.hpp"

namespace twin::exec {

// Where a runner's per-layer state lives: (micro-batch, chunk, global layer index).
struct StashKey {
  int micro_batch = 0, chunk = 0, layer = 0;
  static StashKey of(const model::Op& op) { return {op.micro_batch, op.chunk, op.layer}; }
  auto operator<=>(const StashKey&) const = default;
};

class RankContext {
 public:
  RankContext(const model::Program& program, int rank, Backend& backend, Communicator& comm, ModelShard& shard);

  const model::Program& program;
  const model::Scenario& scenario;
  const int rank;
  const model::RankCoord coord;
  Backend& backend;
  Communicator& comm;
  ModelShard& shard;
  const Dims& dims;
  const std::vector<model::Op>& ops;

  const CommGroup& group(model::Group g) const { return groups_[static_cast<int>(g)]; }
  // "op #12 forward qkv_projection layer 3 micro-batch 1" (model::op_label): how messages name op i
  const std::string& label(std::size_t op_index) const { return labels_[op_index]; }
  const std::string& label() const { return labels_[current_op]; }  // the op being run

  // ---- the iteration under way --------------------------------------------------------------------------------------
  void begin_iteration(const IterationInput& input);
  const IterationInput& input() const { return *input_; }
  std::size_t current_op = 0;
  IterationOutput output;
  bool saw_nonfinite = false;  // skip_nonfinite: this rank saw non-finite logits or loss this iteration

  // The state of op's (micro-batch, chunk), made (tokens and targets uploaded) at its first forward op; of its layer,
  // made at the layer's first forward op. Either missing at any other op is an internal error naming the op.
  ChunkState& chunk(const model::Op& op);
  LayerStash& stash(const model::Op& op);
  std::map<std::pair<int, int>, ChunkState>& chunks() { return chunks_; }

  // Throws TrainingDiverged naming the step, this rank and the op when `value` (a sum or norm of `what`) is not
  // finite: the kernels would otherwise fail on a precondition or spread NaN into the weights. `every_rank`: the value
  // was all-reduced, so every rank raises alike (GuardTripped, printed once under MPI).
  void require_finite(double value, std::string_view what, bool every_rank = false) const;
  // Under skip_nonfinite: notes a non-finite `value` (true) instead of throwing; otherwise require_finite.
  bool nonfinite(double value, std::string_view what, bool every_rank = false);

 private:
  std::array<CommGroup, model::kGroupCount> groups_;  // by model::Group
  std::vector<std::string> labels_;                   // by op index
  const IterationInput* input_ = nullptr;
  std::map<std::pair<int, int>, ChunkState> chunks_;  // by (micro-batch, chunk)
};

}  // namespace twin::exec
