// The ops of one micro-batch's layers, one at a time: compute ops with their kernels (KernelBreakdown), and the TP
// collectives between them. layer_ops.hpp strings them into a layer's forward and backward.
#pragma once

#include <vector>

#include "model/ops/kernel_traffic.hpp"
#include "model/ops/op.hpp"

namespace twin::model {

// Whether the GEMM `what` runs in FP8 under model.fp8: the transformer layers' four (QKV, attention projection, MLP up
// and down; an MoE layer's shared experts are its MLP up and down) and the routed experts' up and down projections
// (each local expert's GEMM with its own scales), in their forward, input-gradient and weight-gradient passes, as
// Transformer Engine's Linear, LayerNormLinear and GroupedLinear do under Megatron-Core's fp8_autocast; the router,
// the LM head and the attention core stay in the 16-bit dtype (the router is a plain torch GEMM; fp8_output_proj and
// fp8_dot_product_attention off, Megatron-Core's defaults). The one home of this fact: both engines ask it.
bool runs_in_fp8(const Scenario& scenario, ComputeKind what);

// A memory-bound compute op: `launches` kernels moving `bytes` in all.
Op elementwise(ComputeKind what, Phase phase, double bytes, int launches);
// Adds `bytes` to a memory-bound op's traffic (copies the framework makes around it, in its kernels).
void add_stream_bytes(Op& op, double bytes);

// A GEMM [m, k] x [k, n] with a weight: 2mnk FLOPs forward; backward runs the input- and weight-gradient GEMMs (twice
// the FLOPs), then the framework's accumulation of the weight gradient. `epilogue_bytes`: traffic beyond the GEMM's
// operands (see qkv_projection).
Op gemm(const Shapes& x, ComputeKind what, Phase phase, double m, double n, double k, double epilogue_bytes = 0);
// A linear layer of the model (see compute_ops.cpp for the frameworks' biases).
Op linear(const Shapes& x, ComputeKind what, Phase phase, double m, double n, double k, double epilogue_bytes = 0);
// linear() as `experts` GEMMs, one per local expert, each with its own [k, n] weight, over the m rows between them
// (Mixture-of-Experts: the FLOPs of one [m, k] x [k, n] GEMM; in FP8 each expert's casts and scales its own).
Op expert_linear(const Shapes& x, ComputeKind what, Phase phase, double m, double n, double k, double experts);
Op qkv_projection(const Shapes& x, Phase phase, double epilogue_bytes = 0);

// Whether a zero-bubble schedule's W takes the weight gradient of `what`: the transformer layer's four linear layers
// (QKV, attention projection, MLP up and down; an MoE layer's attention's two). The experts', the router's, the LM
// head's and the embedding's weight gradients stay in B.
bool deferrable_weight_gradient(ComputeKind what);
// A backward GEMM op (gemm(), 16-bit or FP8 operands) split for a zero-bubble schedule: B, its input-gradient GEMM
// with the op's other traffic (a bias gradient, the epilogue passes; in FP8 the output gradient's cast, which both
// GEMMs read), marked defers_weight_grad; W, a WeightGrad op with the weight-gradient GEMM and the framework's
// accumulation of it. B and W sum to the op's FLOPs, bytes and kernel launches.
struct SplitBackward {
  Op input_grad, weight_grad;
};
SplitBackward split_weight_gradient(const Shapes& x, const Op& backward);
Op attention_core(const Shapes& x, Phase phase);
Op activation(const Shapes& x, Phase phase);  // GeLU or SwiGLU over the MLP's [tokens, f/t] intermediate

// Megatron-LM's attention core over `batch_heads` heads of a sequence with no causal mask (every softmax row whole),
// as Dao et al. measured it (the measurement the cost model reads the attention GEMMs' rate from): the kernels of
// its forward and of its backward, op by op: the batched GEMMs (forward Q K^T and P V, backward their four gradient
// GEMMs: each the scores once and two head-wide tensors), then softmax, dropout when on, and the layout copy.
struct AttentionBenchmarkKernels {
  std::vector<Kernel> forward, backward;
};
AttentionBenchmarkKernels unmasked_attention_kernels(double batch_heads, double seq, double head_dim,
                                                     double element_bytes, bool dropout);

// Bytes of the copies the framework makes around the attention core in `phase` (compute_ops.cpp).
double layout_copy_bytes(const Shapes& x, Phase phase);

Op tensor_collective(CollectiveKind kind, Payload payload, ComputeKind what, Phase phase, double bytes);
// The TP collective after a row-parallel GEMM (forward) or a column-parallel GEMM's input gradient (backward): an
// all-reduce, or a reduce-scatter back to sequence shards with sequence parallelism. None without TP.
void reduce_across_tensor(std::vector<Op>& ops, const Shapes& x, Payload payload, ComputeKind what, Phase phase);
// Sequence parallelism: gather the sequence shards before a column-parallel GEMM (or a gradient before a
// row-parallel GEMM's backward). None without it.
void gather_sequence(std::vector<Op>& ops, const Shapes& x, Payload payload, ComputeKind what, Phase phase);

}  // namespace twin::model
