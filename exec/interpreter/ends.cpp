// The ends of the model: the embedding (first virtual stage) and the head (last virtual stage).
//
//   tokens ─ wte[token] (vocab-parallel, 0 outside the shard) + wpe (on tp rank 0; none under ALiBi) ─[AR|RS]─ hidden
//   hidden ─ LN_f ─[AG]─ LM head (tied wte shard) = logits (T, V/t) ─ CE statistics ─[AG]─ losses
//
// The loss is the mean over every token of the global batch: each token's loss gradient is 1 / (global_batch * S),
// whatever the plan, so the DP gradient reduction is a plain sum.
#include "exec/core/check.hpp"
#include "exec/interpreter/interpreter.hpp"

namespace twin::exec {

using model::Op;

namespace {
constexpr int kStats = 3;  // (local max, local sum of exp, target logit) per token
}  // namespace

// ---- embedding ------------------------------------------------------------------------------------------------------

// Also the recompute of DeepSpeed's checkpointed embedding before its backward: `hidden` is not needed by then.
void Interpreter::embedding_forward(const Op& op) {
  ChunkState& state = ctx_.chunk(op);
  Tensor out = backend_.allocate(numel(dims_.tokens, dims_.hidden), backend_.activation_dtype());  // (T, C)
  backend_.embedding_forward(out, state.tokens, shard_.wte, dims_.tokens, dims_.hidden, dims_.vocab_start,
                             dims_.vocab_local);
  // the position embedding once, before the TP sum: (wte + 0) + wpe has the bits of wte + wpe
  if (dims_.tp_rank == 0 && !shard_.wpe.empty() && dims_.cp > 1) {
    context_position_embedding(ctx_, out, false);
  } else if (dims_.tp_rank == 0 && !shard_.wpe.empty()) {
    backend_.position_embedding_forward(out, shard_.wpe, dims_.batch, dims_.seq, dims_.hidden);
  }
  state.hidden = out;  // summed across TP by the LayerOutput collective that follows (tp > 1)
}

void Interpreter::embedding_backward(const Op& op) {
  ChunkState& state = ctx_.chunk(op);
  const Tensor d_out = take_grad_full(state);  // (T, C)
  backend_.embedding_backward(shard_.wte_grad, d_out, state.tokens, dims_.tokens, dims_.hidden, dims_.vocab_start,
                              dims_.vocab_local);
  if (!shard_.wpe.empty() && dims_.cp > 1) {
    context_position_embedding(ctx_, d_out, true);
  } else if (!shard_.wpe.empty()) {
    backend_.position_embedding_backward(shard_.wpe_grad, d_out, dims_.batch, dims_.seq, dims_.hidden);
  }
}

// ---- head -----------------------------------------------------------------------------------------------------------

void Interpreter::final_layernorm_forward(const Op& op) {
  ChunkState& state = ctx_.chunk(op);
  HeadStash& h = state.head;
  h.x = state.hidden;
  h.lnf = backend_.allocate(numel(dims_.tokens_sp, dims_.hidden), backend_.activation_dtype());
  h.lnf_mean = backend_.allocate(static_cast<std::size_t>(dims_.tokens_sp), DType::F32);
  h.lnf_rstd = backend_.allocate(static_cast<std::size_t>(dims_.tokens_sp), DType::F32);
  norm_forward(h.lnf, h.lnf_mean, h.lnf_rstd, h.x, shard_.lnf_weight, shard_.lnf_bias);
  h.lnf_full = h.lnf;
}

void Interpreter::lm_head_forward(const Op& op) {
  HeadStash& h = ctx_.chunk(op).head;
  const Tensor logits =
      backend_.allocate(numel(dims_.tokens, dims_.vocab_local), backend_.activation_dtype());  // (T, V/t)
  backend_.matmul_forward(logits, h.lnf_full, shard_.head_weight, Tensor{}, dims_.tokens, dims_.hidden,
                          dims_.vocab_local);
  if (dims_.sequence_parallel) h.lnf_full = Tensor{};  // re-gathered for the backward
  // Recomputed (DeepSpeed's checkpointed head) after the loss's backward: h.logits holds the logits' gradient by now,
  // and the recomputed logits are what a checkpoint rebuilds and discards, the gradient having been taken.
  if (!recomputing(op)) h.logits = logits;
}

void Interpreter::cross_entropy_forward(const Op& op) {
  ChunkState& state = ctx_.chunk(op);
  HeadStash& h = state.head;
  h.stats = backend_.allocate(numel(dims_.tokens, kStats), DType::F32);
  backend_.cross_entropy_local_stats(h.stats, h.logits, state.targets, dims_.tokens, dims_.vocab_start,
                                     dims_.vocab_local, dims_.vocab);
  // Non-finite logits (a diverged run) break the combine kernel's precondition: say so here, where the step and the
  // rank are known. Any NaN or infinite logit makes its row's statistics non-finite (the statistics are f32 on every
  // backend, the logits not). A shard of padding alone has no valid column: its maximum is -inf by design.
  if (dims_.vocab_start < dims_.vocab && ctx_.nonfinite(backend_.sum(h.stats), "the logits")) {
    // skip_nonfinite: statistics of a finite row (max 0, sum 1, target logit 0) let the step run on to the gradient
    // norm, which the NaN in the logits' gradient makes non-finite on every rank: the update is skipped everywhere
    const std::vector<float> neutral = [&] {
      std::vector<float> rows(static_cast<std::size_t>(dims_.tokens) * kStats, 0.0f);
      for (std::size_t r = 0; r < static_cast<std::size_t>(dims_.tokens); ++r) rows[r * kStats + 1] = 1.0f;
      return rows;
    }();
    backend_.upload_f32(h.stats, neutral.data());
  }
  if (dims_.tp == 1) combine_cross_entropy(state, h.stats, 1);  // else after the CrossEntropyStats all-gather
}

void Interpreter::combine_cross_entropy(ChunkState& state, const Tensor& gathered_stats, int shards) {
  HeadStash& h = state.head;
  h.losses = backend_.allocate(static_cast<std::size_t>(dims_.tokens), DType::F32);
  h.lse = backend_.allocate(static_cast<std::size_t>(dims_.tokens), DType::F32);
  backend_.cross_entropy_combine(h.losses, h.lse, gathered_stats, dims_.tokens, shards);
  if (dims_.tp_rank == 0) {  // every TP rank has the same losses: count them once
    const double loss_sum = backend_.sum(h.losses);
    ctx_.nonfinite(loss_sum, "the loss");  // finite logits can still give a loss past float's range
    ctx_.output.loss_sum += ctx_.saw_nonfinite ? std::numeric_limits<double>::quiet_NaN() : loss_sum;
    ctx_.output.loss_tokens += dims_.tokens;
  }
  h.stats = Tensor{};
}

void Interpreter::cross_entropy_backward(const Op& op) {
  ChunkState& state = ctx_.chunk(op);
  HeadStash& h = state.head;
  const double global_tokens = static_cast<double>(scenario_.parallel.global_batch * scenario_.model.seq_len);
  // dlogits over the logits' memory: (T, V/t)
  backend_.cross_entropy_backward(h.logits, h.logits, h.lse, state.targets, dims_.tokens, dims_.vocab_start,
                                  dims_.vocab_local, dims_.vocab, static_cast<float>(1.0 / global_tokens));
  state.grad = backend_.zeros(numel(dims_.tokens_sp, dims_.hidden), backend_.activation_dtype());
}

void Interpreter::lm_head_backward(const Op& op) {
  ChunkState& state = ctx_.chunk(op);
  HeadStash& h = state.head;
  TWIN_EXEC_CHECK(!h.lnf_full.empty(), "the LM head input was not gathered");
  state.work.d_ln = backend_.allocate(numel(dims_.tokens, dims_.hidden), backend_.activation_dtype());  // partial sums
  backend_.matmul_backward(state.work.d_ln, shard_.head_grad, Tensor{}, h.logits, h.lnf_full, shard_.head_weight,
                           dims_.tokens, dims_.hidden, dims_.vocab_local);
  h.logits = Tensor{};
  h.lnf_full = Tensor{};
}

void Interpreter::final_layernorm_backward(const Op& op) {
  ChunkState& state = ctx_.chunk(op);
  HeadStash& h = state.head;
  norm_backward(state.grad, shard_.lnf_weight_grad, shard_.lnf_bias_grad, state.work.d_ln, h.x, shard_.lnf_weight,
                h.lnf_mean, h.lnf_rstd);
  state.work.d_ln = Tensor{};
  h = HeadStash{};
}

}  // namespace twin::exec
