// Transformer layer ops (pre-LN GPT-2 block), forward / recompute / backward, one handler per op of the Program:
//
//   x ─ LN1 ─[AG]─ QKV ─ attention core ─ proj ─[AR|RS]─ +bias +x = x2
//   x2 ─ LN2 ─[AG]─ fc ─ GELU ─ fc_proj ─[AR|RS]─ +bias +x2 = y
//
// or a parallel block (model.parallel_residual; GPT-J, GPT-NeoX):
//
//   x ─ LN1 ─[AG]─ QKV ─ attention core ─ proj ──────────────┐ (partial sums over TP)
//   x ─ LN2 ─[AG]─ fc ─ GELU ─ fc_proj ─ + ─[AR|RS]─ +biases +x = y
//
// Its backward keeps dy for both branches: the MLP-down op hands the (gathered) dy on to the attention projection's,
// the LN2 op writes its input gradient to a buffer of its own, and the LN1 op adds both layer norms' input gradients
// to the residual stream's. With one shared norm (model.shared_norm) there is no LN2:
// both branches read LN1's output, and the QKV op adds the MLP-up op's partial d_ln to its own before their one
// TP reduction.
//
// or a Llama-style block: RMSNorm for LN, rotary embeddings applied to q and k by the QKV op right after its GEMM
// (so that a selective recompute of the attention core reads them rotated; its backward rotates dq and dk back before
// the GEMM's), grouped-query attention, SwiGLU for GELU on an fc twice as wide, and no biases.
//
// [AG] and [AR|RS] are the Program's TP collectives (comm.cpp); each compute op writes the tensor its
// collective (if any) transforms, so with tp = 1 the same handlers run without them. Shapes per rank: T = B*S tokens,
// T_sp = T/tp under sequence parallelism, C hidden, C/t and F/t the rank's attention and MLP widths.
// Recompute: `full` keeps only x after the forward and the Recompute ops rebuild the rest; `selective` drops the
// attention core's output and statistics, which its Recompute op rebuilds from qkv.
#include <fmt/core.h>

#include "exec/core/check.hpp"
#include "exec/interpreter/interpreter.hpp"
#include "model/ops/compute_ops.hpp"

namespace twin::exec {

using model::Op;
using model::Recompute;

// ---- forward (and recompute) ----------------------------------------------------------------------------------------

void Interpreter::layernorm_attention_forward(const Op& op) {
  ChunkState& state = ctx_.chunk(op);
  LayerStash& s = ctx_.stash(op);
  const LayerTensors& w = shard_.layer_params(op.layer);
  if (!recomputing(op)) s.x = state.hidden;  // (T_sp, C)
  TWIN_EXEC_CHECK(!s.x.empty(), "layer {} has no input", op.layer);
  if (!recomputing(op) && scenario_.framework.partition_activations &&
      scenario_.recompute_of_layer(op.layer) == Recompute::Full) {
    // DeepSpeed's checkpoint keeps this rank's contiguous 1/t of the flattened input (the Program's bytes on this op)
    const std::size_t part = s.x.numel / static_cast<std::size_t>(dims_.tp);
    s.x_part = backend_.allocate(part, s.x.dtype);
    backend_.copy(s.x_part, s.x.slice(static_cast<std::size_t>(coord_.tp) * part, part));
  }
  s.ln1 = backend_.allocate(numel(dims_.tokens_sp, dims_.hidden), backend_.activation_dtype());
  s.ln1_mean = backend_.allocate(static_cast<std::size_t>(dims_.tokens_sp), DType::F32);
  s.ln1_rstd = backend_.allocate(static_cast<std::size_t>(dims_.tokens_sp), DType::F32);
  norm_forward(s.ln1, s.ln1_mean, s.ln1_rstd, s.x, w.ln1_weight, w.ln1_bias);
  s.ln1_full = s.ln1;  // a LayerInput all-gather replaces it under sequence parallelism
}

void Interpreter::qkv_forward(const Op& op) {
  LayerStash& s = ctx_.stash(op);
  const LayerTensors& w = shard_.layer_params(op.layer);
  const int width = dims_.qkv_local;  // 3C/t, or (H/t + 2 KV/t) D
  s.qkv = backend_.allocate(numel(dims_.tokens, width), backend_.activation_dtype());
  linear_forward(op, s.qkv, s.ln1_full, w.qkv_weight, w.qkv_bias, dims_.tokens, dims_.hidden, width);
  if (dims_.rope && dims_.cp > 1) {
    backend_.context_kernels().context_rope_forward(s.qkv, context_shape(dims_), dims_.rotary_dim);
  } else if (dims_.rope) {
    backend_.rope_forward(s.qkv, dims_.batch, dims_.seq, dims_.heads_local, dims_.kv_heads_local, dims_.head_dim,
                          dims_.rotary_dim);
  }
}

void Interpreter::attention_core_forward(const Op& op) {
  if (context_) return context_->forward(op);
  LayerStash& s = ctx_.stash(op);
  s.attn = backend_.allocate(numel(dims_.tokens, dims_.heads_local * dims_.head_dim), backend_.activation_dtype());
  s.attn_lse = backend_.allocate(numel(dims_.batch * dims_.heads_local, dims_.seq), DType::F32);
  backend_.attention_forward(s.attn, s.attn_lse, s.qkv, dims_.batch, dims_.seq, dims_.heads_local, dims_.kv_heads_local,
                             dims_.head_dim, shard_.alibi_slopes);
}

void Interpreter::attention_projection_forward(const Op& op) {
  LayerStash& s = ctx_.stash(op);
  const LayerTensors& w = shard_.layer_params(op.layer);
  s.proj = backend_.allocate(numel(dims_.tokens, dims_.hidden), backend_.activation_dtype());  // partial sums over TP
  linear_forward(op, s.proj, s.attn, w.proj_weight, Tensor{}, dims_.tokens, dims_.heads_local * dims_.head_dim,
                 dims_.hidden);
}

void Interpreter::attention_residual_forward(const Op& op) {
  LayerStash& s = ctx_.stash(op);
  const LayerTensors& w = shard_.layer_params(op.layer);
  s.x2 = backend_.allocate(numel(dims_.tokens_sp, dims_.hidden), backend_.activation_dtype());
  backend_.residual_forward(s.x2, s.x, s.proj);  // proj is (T_sp, C) after its TP reduction
  if (!w.proj_bias.empty()) backend_.bias_add(s.x2, w.proj_bias, dims_.tokens_sp, dims_.hidden);
  s.proj = Tensor{};
}

void Interpreter::layernorm_mlp_forward(const Op& op) {
  LayerStash& s = ctx_.stash(op);
  const LayerTensors& w = shard_.layer_params(op.layer);
  s.ln2 = backend_.allocate(numel(dims_.tokens_sp, dims_.hidden), backend_.activation_dtype());
  s.ln2_mean = backend_.allocate(static_cast<std::size_t>(dims_.tokens_sp), DType::F32);
  s.ln2_rstd = backend_.allocate(static_cast<std::size_t>(dims_.tokens_sp), DType::F32);
  norm_forward(s.ln2, s.ln2_mean, s.ln2_rstd, dims_.parallel_residual ? s.x : s.x2, w.ln2_weight, w.ln2_bias);
  s.ln2_full = s.ln2;
}

void Interpreter::mlp_up_forward(const Op& op) {
  LayerStash& s = ctx_.stash(op);
  const LayerTensors& w = shard_.layer_params(op.layer);
  s.fc = backend_.allocate(numel(dims_.tokens, dims_.up_local), backend_.activation_dtype());
  const Tensor& input = dims_.shared_norm ? s.ln1_full : s.ln2_full;  // (T, C)
  linear_forward(op, s.fc, input, w.fc_weight, w.fc_bias, dims_.tokens, dims_.hidden, dims_.up_local);
}

void Interpreter::gelu_forward(const Op& op) {
  LayerStash& s = ctx_.stash(op);
  s.gelu = backend_.allocate(s.fc.numel, backend_.activation_dtype());
  backend_.gelu_forward(s.gelu, s.fc);
}

void Interpreter::swiglu_forward(const Op& op) {
  LayerStash& s = ctx_.stash(op);
  s.gelu =
      backend_.allocate(numel(dims_.tokens, dims_.ffn_local), backend_.activation_dtype());  // the MLP's activation
  backend_.swiglu_forward(s.gelu, s.fc, dims_.tokens, dims_.ffn_local);
}

void Interpreter::mlp_down_forward(const Op& op) {
  LayerStash& s = ctx_.stash(op);
  const LayerTensors& w = shard_.layer_params(op.layer);
  s.fc_proj = backend_.allocate(numel(dims_.tokens, dims_.hidden), backend_.activation_dtype());  // partial sums
  linear_forward(op, s.fc_proj, s.gelu, w.fc_proj_weight, Tensor{}, dims_.tokens, dims_.ffn_local, dims_.hidden);
  if (dims_.parallel_residual) {  // both branches' partial sums, for one TP reduction
    backend_.accumulate(s.fc_proj, s.proj);
    s.proj = Tensor{};
  }
}

void Interpreter::mlp_residual_forward(const Op& op) {
  ChunkState& state = ctx_.chunk(op);
  LayerStash& s = ctx_.stash(op);
  const LayerTensors& w = shard_.layer_params(op.layer);
  Tensor y = backend_.allocate(numel(dims_.tokens_sp, dims_.hidden), backend_.activation_dtype());  // (T_sp, C)
  backend_.residual_forward(y, dims_.parallel_residual ? s.x : s.x2, s.fc_proj);
  if (dims_.parallel_residual && !w.proj_bias.empty()) {
    backend_.bias_add(y, w.proj_bias, dims_.tokens_sp, dims_.hidden);
  }
  if (!w.fc_proj_bias.empty()) backend_.bias_add(y, w.fc_proj_bias, dims_.tokens_sp, dims_.hidden);
  if (!recomputing(op)) state.hidden = y;  // the next layer's input (a recomputed output is not needed)
  finish_layer_forward(op, s);
}

void Interpreter::norm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                               const Tensor& weight, const Tensor& bias) {
  if (dims_.rmsnorm) {
    backend_.rmsnorm_forward(out, rstd, inp, weight, dims_.tokens_sp, dims_.hidden);
  } else {
    backend_.layernorm_forward(out, mean, rstd, inp, weight, bias, dims_.tokens_sp, dims_.hidden);
  }
}

void Interpreter::norm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                                const Tensor& inp, const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
  if (dims_.rmsnorm) {
    backend_.rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, dims_.tokens_sp, dims_.hidden);
  } else {
    backend_.layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, dims_.tokens_sp, dims_.hidden);
  }
}

// What a layer keeps once its forward (or recompute) is done.
void Interpreter::finish_layer_forward(const Op& op, LayerStash& s) {
  s.fc_proj = Tensor{};
  if (dims_.sequence_parallel) {  // the backward re-gathers them (its LayerInput all-gathers)
    s.ln1_full = Tensor{};
    s.ln2_full = Tensor{};
  }
  if (recomputing(op)) return;
  const Recompute mode = scenario_.recompute_of_layer(op.layer);
  if (mode != Recompute::None && context_) context_->drop_forward(StashKey::of(op));  // its recompute rebuilds it
  switch (mode) {
    case Recompute::None:
      break;
    case Recompute::Full:  // the input, or under partition_activations the part the LN1 op kept of it
      s = scenario_.framework.partition_activations ? LayerStash{.x_part = s.x_part} : LayerStash{.x = s.x};
      break;
    case Recompute::Selective:
      s.attn = Tensor{};
      s.attn_lse = Tensor{};
      break;
  }
}

// ---- backward -------------------------------------------------------------------------------------------------------
// state.grad (T_sp, C) is the residual stream's gradient: dy on entry to the layer, dx when it leaves.

void Interpreter::mlp_residual_backward(const Op& op) {
  ChunkState& state = ctx_.chunk(op);
  const LayerTensors& g = shard_.layer_grads(op.layer);
  if (!g.fc_proj_bias.empty()) backend_.bias_backward(g.fc_proj_bias, state.grad, dims_.tokens_sp, dims_.hidden);
  if (dims_.parallel_residual && !g.proj_bias.empty()) {
    backend_.bias_backward(g.proj_bias, state.grad, dims_.tokens_sp, dims_.hidden);
  }
}

void Interpreter::mlp_down_backward(const Op& op) {
  ChunkState& state = ctx_.chunk(op);
  LayerStash& s = ctx_.stash(op);
  const LayerTensors& w = shard_.layer_params(op.layer);
  const LayerTensors& g = shard_.layer_grads(op.layer);
  const Tensor d_out = take_grad_full(state);             // (T, C)
  if (dims_.parallel_residual) state.work.d_out = d_out;  // the attention branch's output gradient too
  state.work.d_hidden = backend_.allocate(numel(dims_.tokens, dims_.ffn_local), backend_.activation_dtype());
  linear_backward(op, state.work.d_hidden, g.fc_proj_weight, Tensor{}, d_out, s.gelu, w.fc_proj_weight, dims_.tokens,
                  dims_.ffn_local, dims_.hidden);
}

void Interpreter::gelu_backward(const Op& op) {
  ChunkState& state = ctx_.chunk(op);
  LayerStash& s = ctx_.stash(op);
  backend_.gelu_backward(state.work.d_hidden, s.fc, state.work.d_hidden);  // in place: (T, F/t)
}

void Interpreter::swiglu_backward(const Op& op) {
  ChunkState& state = ctx_.chunk(op);
  LayerStash& s = ctx_.stash(op);
  Tensor d_fc = backend_.allocate(s.fc.numel, backend_.activation_dtype());  // (T, 2F/t): gate and up
  backend_.swiglu_backward(d_fc, s.fc, state.work.d_hidden, dims_.tokens, dims_.ffn_local);
  state.work.d_hidden = d_fc;
}

void Interpreter::mlp_up_backward(const Op& op) {
  ChunkState& state = ctx_.chunk(op);
  LayerStash& s = ctx_.stash(op);
  const LayerTensors& w = shard_.layer_params(op.layer);
  const LayerTensors& g = shard_.layer_grads(op.layer);
  const Tensor& input = dims_.shared_norm ? s.ln1_full : s.ln2_full;  // (T, C)
  TWIN_EXEC_CHECK(!input.empty(), "layer {}: the MLP input was not gathered", op.layer);
  state.work.d_ln = backend_.allocate(numel(dims_.tokens, dims_.hidden), backend_.activation_dtype());  // partial sums
  linear_backward(op, state.work.d_ln, g.fc_weight, g.fc_bias, state.work.d_hidden, input, w.fc_weight, dims_.tokens,
                  dims_.hidden, dims_.up_local);
  state.work.d_hidden = Tensor{};
  if (dims_.shared_norm) {  // unreduced: the QKV op adds its own and reduces both at once
    state.work.d_ln_mlp = state.work.d_ln;
    state.work.d_ln = Tensor{};
  }
}

void Interpreter::layernorm_mlp_backward(const Op& op) {
  ChunkState& state = ctx_.chunk(op);
  LayerStash& s = ctx_.stash(op);
  const LayerTensors& w = shard_.layer_params(op.layer);
  const LayerTensors& g = shard_.layer_grads(op.layer);
  if (dims_.parallel_residual) {  // dy must reach the attention branch unchanged: LN2's share waits for the LN1 op
    state.work.d_x_mlp = backend_.zeros(state.grad.numel, state.grad.dtype);
    norm_backward(state.work.d_x_mlp, g.ln2_weight, g.ln2_bias, state.work.d_ln, s.x, w.ln2_weight, s.ln2_mean,
                  s.ln2_rstd);
    state.work.d_ln = Tensor{};
    return;
  }
  // grad (T_sp, C) += LN2 backward of d_ln (T_sp, C after its TP reduction): dy becomes d(x2)
  norm_backward(state.grad, g.ln2_weight, g.ln2_bias, state.work.d_ln, s.x2, w.ln2_weight, s.ln2_mean, s.ln2_rstd);
  state.work.d_ln = Tensor{};
}

void Interpreter::attention_residual_backward(const Op& op) {
  ChunkState& state = ctx_.chunk(op);
  const LayerTensors& g = shard_.layer_grads(op.layer);
  if (!g.proj_bias.empty()) backend_.bias_backward(g.proj_bias, state.grad, dims_.tokens_sp, dims_.hidden);
}

void Interpreter::attention_projection_backward(const Op& op) {
  ChunkState& state = ctx_.chunk(op);
  LayerStash& s = ctx_.stash(op);
  const LayerTensors& w = shard_.layer_params(op.layer);
  const LayerTensors& g = shard_.layer_grads(op.layer);
  Tensor d_out;                   // (T, C)
  if (dims_.parallel_residual) {  // dy, as the MLP branch's backward took it
    TWIN_EXEC_CHECK(!state.work.d_out.empty(), "layer {}: the MLP branch left no output gradient", op.layer);
    d_out = state.work.d_out;
    state.work.d_out = Tensor{};
  } else {
    d_out = take_grad_full(state);
  }
  const int width = dims_.heads_local * dims_.head_dim;
  TWIN_EXEC_CHECK(!s.attn.empty(), "layer {}: the attention output is neither stashed nor recomputed", op.layer);
  state.work.d_attn = backend_.allocate(numel(dims_.tokens, width), backend_.activation_dtype());
  linear_backward(op, state.work.d_attn, g.proj_weight, Tensor{}, d_out, s.attn, w.proj_weight, dims_.tokens, width,
                  dims_.hidden);
}

void Interpreter::attention_core_backward(const Op& op) {
  if (context_) return context_->backward(op);
  ChunkState& state = ctx_.chunk(op);
  LayerStash& s = ctx_.stash(op);
  state.work.d_qkv = backend_.allocate(s.qkv.numel, backend_.activation_dtype());
  backend_.attention_backward(state.work.d_qkv, state.work.d_attn, s.qkv, s.attn, s.attn_lse, dims_.batch, dims_.seq,
                              dims_.heads_local, dims_.kv_heads_local, dims_.head_dim, shard_.alibi_slopes);
  state.work.d_attn = Tensor{};
}

void Interpreter::qkv_backward(const Op& op) {
  ChunkState& state = ctx_.chunk(op);
  LayerStash& s = ctx_.stash(op);
  const LayerTensors& w = shard_.layer_params(op.layer);
  const LayerTensors& g = shard_.layer_grads(op.layer);
  TWIN_EXEC_CHECK(!s.ln1_full.empty(), "layer {}: the attention input was not gathered", op.layer);
  if (dims_.rope && dims_.cp > 1) {
    backend_.context_kernels().context_rope_backward(state.work.d_qkv, context_shape(dims_), dims_.rotary_dim);
  } else if (dims_.rope) {  // the gradient of the rotated q and k back to the QKV GEMM's output (the Program's op too)
    backend_.rope_backward(state.work.d_qkv, dims_.batch, dims_.seq, dims_.heads_local, dims_.kv_heads_local,
                           dims_.head_dim, dims_.rotary_dim);
  }
  state.work.d_ln = backend_.allocate(numel(dims_.tokens, dims_.hidden), backend_.activation_dtype());
  linear_backward(op, state.work.d_ln, g.qkv_weight, g.qkv_bias, state.work.d_qkv, s.ln1_full, w.qkv_weight,
                  dims_.tokens, dims_.hidden, dims_.qkv_local);
  state.work.d_qkv = Tensor{};
  if (dims_.shared_norm) {  // both branches' partial input gradients, for one TP reduction
    TWIN_EXEC_CHECK(!state.work.d_ln_mlp.empty(), "layer {}: the MLP branch's input gradient is missing", op.layer);
    backend_.accumulate(state.work.d_ln, state.work.d_ln_mlp);
    state.work.d_ln_mlp = Tensor{};
  }
}

void Interpreter::layernorm_attention_backward(const Op& op) {
  ChunkState& state = ctx_.chunk(op);
  LayerStash& s = ctx_.stash(op);
  const LayerTensors& w = shard_.layer_params(op.layer);
  const LayerTensors& g = shard_.layer_grads(op.layer);
  // grad += LN1 backward: d(x2) becomes dx, the previous layer's dy
  norm_backward(state.grad, g.ln1_weight, g.ln1_bias, state.work.d_ln, s.x, w.ln1_weight, s.ln1_mean, s.ln1_rstd);
  state.work.d_ln = Tensor{};
  if (dims_.parallel_residual && !dims_.shared_norm) {  // and LN2's, of the same input x
    TWIN_EXEC_CHECK(!state.work.d_x_mlp.empty(), "layer {}: the MLP branch's input gradient is missing", op.layer);
    backend_.accumulate(state.grad, state.work.d_x_mlp);
    state.work.d_x_mlp = Tensor{};
  }
  state.layers.erase(op.layer);  // this micro-batch is done with the layer
}

// ---- the layer's GEMMs: matmul_forward / matmul_backward, or their FP8 twins (fp8_linear.hpp) when the op's GEMM
// runs in FP8 (model::runs_in_fp8) ------------------------------------------------------------------------------------

void Interpreter::linear_forward(const Op& op, const Tensor& out, const Tensor& inp, const Tensor& weight,
                                 const Tensor& bias, int rows, int in_features, int out_features) {
  linear_gemm_forward(ctx_, fp8_.get(), op, out, inp, weight, bias, rows, in_features, out_features);
}

void Interpreter::linear_backward(const Op& op, const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                                  const Tensor& dout, const Tensor& inp, const Tensor& weight, int rows,
                                  int in_features, int out_features) {
  if (op.defers_weight_grad) {
    // A zero-bubble B: the input gradient (and the bias's) now, the weight gradient in the op's W. dout is copied:
    // the stream's gradient it may be is updated in place before W runs.
    Tensor kept = backend_.allocate(dout.numel, dout.dtype);
    backend_.copy(kept, dout);
    ChunkState::DeferredWeightGrad& deferred = ctx_.chunk(op).deferred[{op.layer, static_cast<int>(op.what)}];
    deferred = {inp, kept, std::nullopt};
    if (model::runs_in_fp8(scenario_, op.what)) {
      deferred.fp8 = fp8_->backward_input(op, dinp, dbias, dout, inp, weight, rows, in_features, out_features);
      return;
    }
    backend_.matmul_backward(dinp, Tensor{}, dbias, dout, inp, weight, rows, in_features, out_features);
    return;
  }
  linear_gemm_backward(ctx_, fp8_.get(), op, dinp, dweight, dbias, dout, inp, weight, rows, in_features, out_features);
}

// ---- a zero-bubble schedule's W
// ---------------------------------------------------------------------------------------

void Interpreter::linear_weight_gradient(const Op& op) {
  ChunkState& state = ctx_.chunk(op);
  const auto it = state.deferred.find({op.layer, static_cast<int>(op.what)});
  TWIN_EXEC_CHECK(it != state.deferred.end(), "layer {}: no B left this weight gradient its inputs", op.layer);
  const LayerTensors& w = shard_.layer_params(op.layer);
  const LayerTensors& g = shard_.layer_grads(op.layer);
  const int attention_width = dims_.heads_local * dims_.head_dim;
  struct Linear {
    const Tensor &weight, &grad;
    int in_features, out_features;
  };
  const Linear linear = [&]() -> Linear {
    switch (op.what) {
      case model::ComputeKind::QkvProjection:
        return {w.qkv_weight, g.qkv_weight, dims_.hidden, dims_.qkv_local};
      case model::ComputeKind::AttentionProjection:
        return {w.proj_weight, g.proj_weight, attention_width, dims_.hidden};
      case model::ComputeKind::MlpUp:
        return {w.fc_weight, g.fc_weight, dims_.hidden, dims_.up_local};
      default:
        return {w.fc_proj_weight, g.fc_proj_weight, dims_.ffn_local, dims_.hidden};
    }
  }();
  // dweight (out_f, in_f) += d_out^T input: the GEMM the B skipped, in the same micro-batch order
  if (it->second.fp8) {
    fp8_->backward_weight(*it->second.fp8, linear.grad, it->second.d_out, it->second.input, linear.weight, dims_.tokens,
                          linear.in_features, linear.out_features);
  } else {
    backend_.matmul_backward(Tensor{}, linear.grad, Tensor{}, it->second.d_out, it->second.input, linear.weight,
                             dims_.tokens, linear.in_features, linear.out_features);
  }
  state.deferred.erase(it);
}

}  // namespace twin::exec
