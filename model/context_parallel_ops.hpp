// Context parallelism's exchanges in a transformer layer's ops (model/context_parallel.hpp says what Transformer
// Engine exchanges and why): collectives over the Context group around the attention core. The Program carries the
// all_gather way (framework.cp_comm = "all_gather", Llama 3's); build_program refuses the other two until their ops
// exist (p2p's ring sends between CP ranks, a2a's all-to-alls).
#pragma once

#include <vector>

#include "model/kernel_traffic.hpp"
#include "model/op.hpp"

namespace twin::model {

// Before the attention core's forward, recompute or backward: its keys and values gathered across CP (nothing when
// cp == 1).
void gather_context_keys_values(std::vector<Op>& ops, const Shapes& x, Phase phase);
// After the attention core's backward: the key and value gradients reduce-scattered back to their CP ranks.
void scatter_context_key_value_grads(std::vector<Op>& ops, const Shapes& x);

}  // namespace twin::model
