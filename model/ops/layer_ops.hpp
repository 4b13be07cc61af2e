// The ops of one micro-batch's pass through the model on one rank, op granularity: a transformer layer's forward,
// recompute or backward (compute ops with their kernels, and the TP collectives between them), and the model's ends
// (embedding; final layer norm, LM head and loss). The stage builder strings them along the schedule.
#pragma once

#include <vector>

#include "model/ops/kernel_traffic.hpp"
#include "model/ops/op.hpp"
#include "model/scenario/scenario.hpp"

namespace twin::model {

// All ops (compute and collectives) of layer `layer` in `phase` (Forward, Recompute, Backward) for one micro-batch.
// Under a schedule that splits the backward (splits_backward), Backward is its B (the linear layers' input gradients
// and everything else) and WeightGrad its W (their weight gradients); WeightGrad is empty otherwise.
std::vector<Op> layer_ops(const Scenario& s, int layer, Phase phase);

// `layer` granularity: one TransformerLayer compute op carrying the sum of the layer's compute (its parts: the
// compute ops, each with its kernels), then its collectives in their original order; a compute op the host waits for
// (moe_host_sync.hpp) ends a fused op, and the layer's next ones fuse into another.
std::vector<Op> fuse_layer(const std::vector<Op>& ops);

// The embedding's forward, or its recomputation before its backward (recompute_model_ends); its backward.
std::vector<Op> embedding_forward(const Shapes& x, Phase phase = Phase::Forward);
std::vector<Op> embedding_backward(const Shapes& x);

// The final layer norm, the LM head and the loss. `recompute_logits`: the final layer norm and LM head run again
// between the loss's backward and theirs.
std::vector<Op> head_forward(const Shapes& x);
std::vector<Op> head_backward(const Shapes& x, bool recompute_logits);

// Whether the framework recomputes the model's ends too under full recompute (DeepSpeed's pipeline engine).
bool recompute_model_ends(const Scenario& s);

}  // namespace twin::model
