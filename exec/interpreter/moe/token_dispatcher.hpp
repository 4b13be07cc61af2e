// The token dispatcher of an MoE layer, as Megatron-Core's MoETokenDispatcher (megatron/core/transformer/moe/
// token_dispatcher.py): it moves the permuted rows (MoeStash::permuted) to the ranks holding their experts, telling
// the layer how many rows each local expert got (MoeStash::expert_rows, the experts' input in MoeStash::expert_in),
// and the experts' outputs (MoeStash::expert_out) back into permuted order (MoeStash::combined); the gradients take
// the same ways back. It runs the Program's exchanges of the layer and owns the split sizes they agree on.
// all_to_all_dispatcher.hpp is the one there is; an all-gather
// dispatcher would implement the same four calls.
#pragma once

#include "exec/interpreter/moe/moe_stash.hpp"
#include "exec/interpreter/rank_context.hpp"
#include "model/ops/op.hpp"

namespace twin::exec {

class TokenDispatcher {
 public:
  virtual ~TokenDispatcher() = default;
  // One of the layer's exchanges (Payload::Tokens over Expert or ExpertTensor, in either phase; the ExpertCounts
  // all-gather of the dispatcher's preprocess) on the layer's stash `m`.
  virtual void exchange(const model::Op& op, MoeStash& m) = 0;
  // The layer's backward is done (or the iteration is): its split sizes go.
  virtual void release(const StashKey& key) = 0;
  virtual void clear() = 0;
};

}  // namespace twin::exec
