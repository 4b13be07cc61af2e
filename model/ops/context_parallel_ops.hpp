// Context parallelism's exchanges in a transformer layer's ops (model/ops/context_parallel.hpp says what Transformer
// Engine exchanges and why): collectives over the Context group around the attention core. The Program carries the
// all_gather way (framework.cp_comm = "all_gather", Llama 3's) and the a2a way (DeepSpeed-Ulysses, in
// context_parallel_a2a.cpp); the p2p ring has its own ops (context_parallel_ring.hpp).
#pragma once

#include <vector>

#include "model/ops/kernel_traffic.hpp"
#include "model/ops/op.hpp"

namespace twin::model {

// Before the attention core's forward, recompute or backward: its keys and values gathered across CP (nothing when
// cp == 1); a2a: the queries, keys and values (backward: the output's gradient) all-to-all to heads.
void gather_context_keys_values(std::vector<Op>& ops, const Shapes& x, Phase phase);
// After the attention core's backward: the key and value gradients reduce-scattered back to their CP ranks; a2a: dQ,
// dK and dV all-to-all back to tokens.
void scatter_context_key_value_grads(std::vector<Op>& ops, const Shapes& x);
// After the attention core's forward or recompute: a2a's output all-to-all back to tokens (nothing otherwise).
void return_context_output(std::vector<Op>& ops, const Shapes& x, Phase phase);

// The a2a way's ops (context_parallel_a2a.cpp), in Transformer Engine's order.
void ulysses_to_heads(std::vector<Op>& ops, const Shapes& x, Phase phase);
void ulysses_output_to_tokens(std::vector<Op>& ops, const Shapes& x, Phase phase);
void ulysses_grads_to_tokens(std::vector<Op>& ops, const Shapes& x);
// The shapes the attention core sees after a2a's all-to-all: the whole sequence (cp x the rank's tokens) of
// heads / (tp cp) query and kv_heads / (tp cp) key/value heads, and no further context split (Shapes::rank, the
// rank's own widths, unchanged: the MLP and experts around the core do not see the exchange).
Shapes ulysses_core_shapes(const Shapes& x);

}  // namespace twin::model
