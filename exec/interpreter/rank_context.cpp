// The rank's groups and op labels, once; the per-(micro-batch, chunk) state, made at its first forward op; the
// divergence guards.
#include "exec/interpreter/rank_context.hpp"

#include <cmath>

#include <fmt/core.h>

#include "exec/core/check.hpp"
#include "exec/core/errors.hpp"
#include "model/ops/op_label.hpp"

namespace twin::exec {

using model::Op;
using model::Phase;

RankContext::RankContext(const model::Program& program_in, int rank_in, Backend& backend_in, Communicator& comm_in,
                         ModelShard& shard_in)
    : program(program_in),
      scenario(program_in.scenario),
      rank(rank_in),
      coord(program_in.layout.coord_of(rank_in)),
      backend(backend_in),
      comm(comm_in),
      shard(shard_in),
      dims(shard_in.dims()),
      ops(program_in.ops_of_rank(rank_in)) {
  for (int g = 0; g < model::kGroupCount; ++g) {
    const auto group = static_cast<model::Group>(g);
    groups_[g] = CommGroup{model::to_string(group), program.layout.group_members(group, rank)};
  }
  labels_.reserve(ops.size());
  for (std::size_t i = 0; i < ops.size(); ++i) labels_.push_back(fmt::format("op #{} {}", i, model::op_label(ops[i])));
}

void RankContext::begin_iteration(const IterationInput& input) {
  input_ = &input;
  output = IterationOutput{};
  saw_nonfinite = false;
  current_op = 0;
  chunks_.clear();
}

ChunkState& RankContext::chunk(const Op& op) {
  const auto key = std::make_pair(op.micro_batch, op.chunk);
  auto it = chunks_.find(key);
  if (it != chunks_.end()) return it->second;
  TWIN_EXEC_CHECK(op.phase == Phase::Forward, "rank {}: {} finds no state of its micro-batch (no forward ran)", rank,
                  label());
  TWIN_EXEC_CHECK(op.micro_batch >= 0 && static_cast<std::size_t>(op.micro_batch) < input_->micro_batches.size(),
                  "micro-batch {} out of range", op.micro_batch);
  ChunkState& state = chunks_[key];
  const MicroBatch& data = input_->micro_batches[static_cast<std::size_t>(op.micro_batch)];
  const int vs = static_cast<int>(scenario.parallel.virtual_stage(coord.pp, op.chunk));
  if (scenario.parallel.starts_route(vs)) {
    state.tokens = backend.allocate(static_cast<std::size_t>(dims.tokens), DType::I32);
    backend.upload_i32(state.tokens, data.tokens.data());
  }
  if (scenario.parallel.ends_route(vs)) {
    state.targets = backend.allocate(static_cast<std::size_t>(dims.tokens), DType::I32);
    backend.upload_i32(state.targets, data.targets.data());
  }
  return state;
}

LayerStash& RankContext::stash(const Op& op) {
  ChunkState& state = chunk(op);
  auto it = state.layers.find(op.layer);
  if (it != state.layers.end()) return it->second;
  TWIN_EXEC_CHECK(op.phase == Phase::Forward && shard.has_layer(op.layer), "rank {}: {} finds no stash of layer {}",
                  rank, label(), op.layer);
  return state.layers[op.layer];
}

bool RankContext::nonfinite(double value, std::string_view what, bool every_rank) {
  if (std::isfinite(value)) return false;
  if (!input_->skip_nonfinite) require_finite(value, what, every_rank);
  saw_nonfinite = true;
  return true;
}

void RankContext::require_finite(double value, std::string_view what, bool every_rank) const {
  if (std::isfinite(value)) return;
  const auto& t = scenario.training;
  const std::string message = fmt::format(
      "training diverged: {} became non-finite ({}) at step {} on rank {} ({}); lower training.learning_rate (now "
      "{:g}) or training.init_std (now {:g}){}",
      what, std::isnan(value) ? "NaN" : fmt::format("{}", value), input_->step + 1, rank, label(), t.learning_rate,
      t.init_std, t.grad_clip > 0 ? "" : ", or clip the gradients with training.grad_clip");
  if (every_rank) throw GuardTripped(message);
  throw TrainingDiverged(message);
}

}  // namespace twin::exec
