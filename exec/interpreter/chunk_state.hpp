// The interpreter's state of one (micro-batch, chunk) of a rank's iteration, forward to backward: the dense layers'
// stashes, the head's, the backward's working tensors. A feature's runner keeps its own state (moe/, context/) and
// reads or writes here only the tensors its op shares with the dense layer (the layer's input, qkv, attention output,
// the stream's gradient).
#pragma once

#include <map>
#include <optional>
#include <utility>

#include "exec/core/tensor.hpp"
#include "exec/interpreter/fp8_state.hpp"

namespace twin::exec {

// Forward tensors one layer keeps for its backward (what is dropped depends on the recompute mode). Shapes are
// this rank's: tokens = B*T, tokens_sp = tokens / tp under sequence parallelism.
struct LayerStash {
  Tensor x;                        // (tokens_sp, C) layer input, kept under every recompute mode
  Tensor x_part;                   // DeepSpeed's partition_activations: this TP rank's contiguous 1/t of x, kept
                                   // instead of x between the forward and the recompute
  Tensor ln1, ln1_mean, ln1_rstd;  // (tokens_sp, C), (tokens_sp), (tokens_sp); no mean under RMSNorm
  Tensor ln1_full;                 // (tokens, C) ln1 gathered across TP (sequence parallel), else ln1
  Tensor qkv;                      // (tokens, qkv_local) as (B, T, 3, H/t, D), or [q | k | v] with grouped
                                   // queries; q and k rotated under rotary embeddings
  Tensor attn, attn_lse;           // (tokens, C/t), (B, H/t, T); under context parallelism (2, B, H/t, T/2)
  Tensor proj;                     // (tokens, C) partial sums; (tokens_sp, C) after the TP reduction
  Tensor x2;                       // (tokens_sp, C) residual stream after attention
  Tensor ln2, ln2_mean, ln2_rstd;  // (tokens_sp, C), (tokens_sp), (tokens_sp)
  Tensor ln2_full;                 // (tokens, C)
  Tensor fc;                       // (tokens, up_local) before the activation: F/t, or SwiGLU's [gate | up]
  Tensor gelu;                     // (tokens, F/t) the activation's output (GELU or SwiGLU)
  Tensor fc_proj;                  // (tokens, C) partial sums; (tokens_sp, C) after the TP reduction
};
struct HeadStash {
  Tensor x;                        // (tokens_sp, C) input of the final layernorm
  Tensor lnf, lnf_mean, lnf_rstd;  // (tokens_sp, C), (tokens_sp), (tokens_sp)
  Tensor lnf_full;                 // (tokens, C)
  Tensor logits;                   // (tokens, V/t); the backward overwrites it with dlogits
  Tensor stats;                    // (tokens, 3) this shard's cross-entropy statistics
  Tensor losses, lse;              // (tokens), (tokens)
};
// Working tensors of a backward pass, alive from one op to the next.
struct BackwardWork {
  Tensor grad_full;  // (tokens, C) output gradient gathered across TP (sequence parallel)
  Tensor d_hidden;   // (tokens, F/t) gradient of the MLP hidden activation; (tokens, 2F/t) after SwiGLU's
                     // backward
  Tensor d_attn;     // (tokens, C/t)
  Tensor d_qkv;      // (tokens, qkv_local)
  Tensor d_ln;       // (tokens, C) partial input gradient of a column-parallel GEMM; (tokens_sp, C)
                     // after the TP reduction
  Tensor d_x_mlp;    // parallel block: LN2's input gradient (tokens_sp, C), which the LN1 op adds to the stream's
  Tensor d_ln_mlp;   // shared norm: the MLP-up GEMM's partial input gradient (tokens, C), summed into QKV's
  Tensor d_out;      // parallel block: the stream's gradient (T, C) as the MLP-down backward took it, for the
                     // attention projection's (gathered once under sequence parallelism)
};
struct ChunkState {
  Tensor tokens, targets;            // (tokens) int32: on the first / last virtual stage
  Tensor hidden;                     // (tokens_sp, C) residual stream between layers (and stages)
  Tensor grad;                       // (tokens_sp, C) its gradient during the backward
  Tensor embedding;                  // (tokens, C) embedding output before the TP reduction
  std::map<int, LayerStash> layers;  // by global layer index
  HeadStash head;
  BackwardWork work;
  // A zero-bubble schedule's B of a linear layer leaves its W what the weight gradient reads: the GEMM's input
  // (rows, in_f) and its output gradient (rows, out_f), by (layer, ComputeKind); in FP8 also how B quantized them
  // (their scales: W quantizes the same values with them again, which gives TE's kept FP8 copies bit for bit).
  struct DeferredWeightGrad {
    Tensor input, d_out;
    std::optional<Fp8GemmOperands> fp8;
  };
  std::map<std::pair<int, int>, DeferredWeightGrad> deferred;
};

}  // namespace twin::exec
