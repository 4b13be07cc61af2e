#include "model/program/estimates.hpp"

#include <algorithm>

#include "model/ops/moe_ops.hpp"
#include "model/plan/schedule.hpp"
#include "model/program/moe_a2a_overlap.hpp"
#include "model/scenario/counts.hpp"

namespace twin::model {
namespace {

// The weights of one transformer layer's four GEMMs held by one GPU (no biases or norms).
double gemm_weights_per_gpu(const Scenario& s) {
  const double h = d(s.model.hidden), f = d(s.ffn_hidden());
  const double attention = d(s.model.attention_width());
  return (h * d(s.model.qkv_width()) + attention * h + h * d(s.mlp_up_width()) + f * h) / d(s.parallel.tp);
}

// Transformer layers of `stage` (over its chunks) with a Mixture-of-Experts MLP.
double moe_layers_on_stage(const Scenario& s, int stage) {
  double layers = 0;
  for (std::int64_t chunk = 0; chunk < s.parallel.virtual_stages; ++chunk) {
    const std::int64_t virtual_stage = s.parallel.virtual_stage(stage, chunk);
    const std::int64_t first = s.first_layer_of_virtual_stage(virtual_stage);
    for (std::int64_t layer = first; layer < first + s.layers_in_virtual_stage(virtual_stage); ++layer) {
      layers += s.is_moe_layer(layer) ? 1 : 0;
    }
  }
  return layers;
}

// The weights of an MoE layer's FP8 GEMMs held by one GPU: the attention's two, the shared experts' up and down
// (split over TP) and the local experts' (no biases).
double moe_layer_fp8_gemm_weights_per_gpu(const Scenario& s) {
  const double h = d(s.model.hidden), attention = d(s.model.attention_width());
  const double f = d(s.moe_ffn_hidden()), up = (s.model.activation == Activation::Swiglu ? 2 : 1) * f;
  const double expert = h * up + f * h;
  const double local = d(s.model.experts / s.parallel.ep) * expert / d(s.parallel.etp);
  return (h * d(s.model.qkv_width()) + attention * h + d(s.model.shared_experts) * expert) / d(s.parallel.tp) + local;
}

}  // namespace

double layer_fp8_weights_per_gpu(const Scenario& s, std::int64_t layer) {
  if (!s.is_moe_layer(layer)) return gemm_weights_per_gpu(s);
  // A Mixture-of-Experts layer: the attention's two GEMMs; its routed experts are counted with their own bucket.
  const double h = d(s.model.hidden);
  return (h * d(s.model.qkv_width()) + d(s.model.attention_width()) * h) / d(s.parallel.tp);
}

double parameters_per_gpu(const Scenario& s, int stage) {
  const auto& p = s.parallel;
  const double h = d(s.model.hidden), V = d(s.padded_vocab()), t = d(p.tp);
  double params = d(s.layers_on_stage(stage)) * layer_parameters_per_rank(s, p.tp);
  const double moe_layers = moe_layers_on_stage(s, stage);  // their MLPs replaced by router, experts, shared experts
  if (moe_layers > 0) {
    params += moe_layers * (moe_layer_dense_parameters_per_gpu(s) - layer_parameters_per_rank(s, p.tp) +
                            expert_parameters_per_gpu(s));
  }
  // DualPipe: both end stages hold an embedding and a head (one direction's each), every stage two blocks' layers
  // (layers_on_stage): the second copy of the parameters its table counts, with its gradients and optimizer state.
  // the word embedding's shard and the positions
  if (p.holds_embedding(stage)) params += V * h / t + position_embedding_parameters(s);
  if (p.holds_head(stage)) {
    params += norm_parameters(s);  // final layernorm
    // The LM head: its own weight when untied; with tied embeddings a copy of the word embedding on the last stage
    // (Megatron keeps one and all-reduces its gradient with the first stage), none when both are the same stage.
    if (!s.framework.tied_embeddings || p.ends_apart()) params += V * h / t;
  }
  return params;
}

namespace {

// Narayanan's count with `recomputed` of the transformer layers run forward once more (0: none, 1: all).
double flops_per_iteration(const Scenario& s, double recomputed) {
  // Narayanan et al. (SC'21) eq. (3), written for any GEMM widths: per token and layer, the forward pass does
  // 2 * (h q + a h + h u + f h) GEMM FLOPs (q the QKV width, 3h without grouped-query attention; a the attention
  // width heads x head_dim, h unless model.head_dim says otherwise; u the MLP-up width, f without SwiGLU) plus 4sa in
  // attention; backward twice the forward; full recompute one more forward of the layers (not of the LM head, 2hV per
  // token forward). With q = 3h, a = h and u = f = 4h this is exactly
  // 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) with recompute and 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) without.
  const double B = d(s.parallel.global_batch), seq = d(s.model.seq_len), l = d(s.model.layers);
  const double h = d(s.model.hidden), f = d(s.ffn_hidden()), V = d(s.padded_vocab());
  const double q = d(s.model.qkv_width()), u = d(s.mlp_up_width()), a = d(s.model.attention_width());
  const double layer_forward_per_token = 2 * (h * q + a * h + h * u + f * h) + 4 * seq * a;
  // A Mixture-of-Experts layer's MLP is what a token runs through: the router [h, E], its top_k routed experts and
  // the shared ones (each an MLP of moe_ffn_hidden), in place of the dense MLP (the active parameters' FLOPs).
  double moe_layers = 0, moe_mlp_per_token = 0;
  if (s.model.is_moe()) {
    const double width = d(s.moe_ffn_hidden()), up = (s.model.activation == Activation::Swiglu ? 2 : 1) * width;
    const double experts_run = d(s.model.top_k + s.model.shared_experts);
    moe_layers = d(s.model.layers - s.model.dense_layers);
    moe_mlp_per_token = 2 * (h * d(s.model.experts) + experts_run * (h * up + width * h));
  }
  const double moe_change = moe_layers * (moe_mlp_per_token - 2 * (h * u + f * h));
  return (3 + recomputed) * B * seq * (l * layer_forward_per_token + moe_change) + 6 * B * seq * h * V;
}

}  // namespace

double model_flops_per_iteration(const Scenario& s, bool with_recompute) {
  return flops_per_iteration(s, with_recompute ? 1 : 0);
}

double reported_flops_per_iteration(const Scenario& s) {
  if (s.parallel.recompute != Recompute::Full) return flops_per_iteration(s, 0);
  // Block recompute (parallel.recompute_num_layers) runs only some layers forward again.
  std::int64_t recomputed = 0;
  for (std::int64_t stage = 0; stage < s.parallel.pp; ++stage) recomputed += s.recomputed_layers_on_stage(stage);
  return flops_per_iteration(s, d(recomputed) / d(s.model.layers));
}

StateBytesPerParameter state_bytes_per_parameter(const Scenario& s) {
  // Composer trains fp32 parameters under autocast (FSDP's mixed precision gathers model-dtype copies of them,
  // counted apart in estimate_memory), with fp32 gradients (FSDP casts each reduced shard back to the parameter's
  // dtype) and Adam's two fp32 moments.
  if (s.model.dtype == DType::FP32 || s.framework.name == Framework::Composer) return {4, 4, 8};
  if (s.framework.bf16_optimizer) return {2, 6, 12};
  if (s.framework.name == Framework::DeepSpeed || s.model.dtype == DType::FP16) return {2, 2, 16};
  // Megatron with bf16 gradients (framework.grad_reduce_in_fp32 = false): a bf16 main-gradient buffer, and the
  // optimizer's fp32 copy of its shard beside the fp32 weights, m and v (megatron/core/optimizer/distrib_optimizer.py
  // allocates the shard's fp32 main_param.grad): the fp16 row of docs/distrib_optimizer.md, 4 + 16/d.
  if (!s.framework.grad_reduce_in_fp32) return {2, 2, 16};
  return {2, 4, 12};  // Megatron-LM with bf16
}

double activation_bytes_per_layer(const Scenario& s) {
  // Korthikanti et al. (MLSys'23), Table 2; coefficients count 2-byte activations and 1-byte dropout masks, so
  // fp32 training is scaled by 2. Under context parallelism a rank holds seq / cp of every sequence's tokens, and
  // every stashed tensor is per token (the attention's scores are not kept: context parallelism runs fused attention).
  const double seq = d(s.model.seq_len) / d(std::max<std::int64_t>(1, s.parallel.cp));
  const double b = d(s.parallel.micro_batch), h = d(s.model.hidden);
  const double a = d(s.model.heads), t = d(s.parallel.tp);
  const double scale = dtype_bytes(s.model.dtype) / 2.0;
  const double sbh = seq * b * h;
  const bool sp = s.parallel.sequence_parallel;
  // Korthikanti's 24 / t, the tensors TP splits, per s b h: Q and K for Q K^T (4), V (2), the projection's input (2),
  // the MLP-up output (8) and the GELU output (8). Written for the widths: keys and values shrink with the key/value
  // heads, SwiGLU's up output is twice its activation's; with q = 3h and u = f = 4h it is 24. The 10 replicated
  // (the norms' and the GEMMs' inputs, two dropout masks) and the scores' 5 a s / h (per query head) are unchanged.
  // Q, K, V and the projection's input are heads x head_dim wide (the attention width; h unless model.head_dim).
  const double kv_share = d(s.model.key_value_heads()) / a, attention = d(s.model.attention_width()) / h;
  const double split_16bit =
      (2 + 4 * kv_share + 2) * attention + 2 * d(s.mlp_up_width()) / h + 2 * d(s.ffn_hidden()) / h;
  // A parallel block's two layer norms read the same input, kept once, and its one residual op has one dropout
  // mask: 2 + 1 of the 10 go; with one shared norm its output too (2 more).
  double replicated = s.model.shared_norm ? 5 : s.model.parallel_residual ? 7 : 10;
  // Without dropout (framework.dropout = false) its two 1-byte masks per element are not kept (one in a parallel
  // block, whose one residual op has one dropout).
  if (!s.framework.dropout) replicated -= s.model.parallel_residual ? 1 : 2;
  // FP8 (model.fp8): Transformer Engine's linear layers keep their inputs for the backward as FP8, one byte where the
  // 16-bit dtype took two: the QKV and MLP-up inputs (replicated, 1 of their 2 each), the projection's and the
  // MLP-down's (split, 1 of 2 and f / h of 2 f / h).
  double split_fp8 = 0;
  if (s.model.fp8 != Fp8Format::None) {
    replicated -= s.model.shared_norm ? 1 : 2;  // one shared norm: one input for both GEMMs
    split_fp8 = attention + d(s.ffn_hidden()) / h;
  }
  const double split = split_16bit - split_fp8;
  switch (s.parallel.recompute) {
    case Recompute::None:
      // FlashAttention keeps no scores: Korthikanti's 5 a s / h term (softmax output, its dropout mask and output)
      // goes, as selective recompute drops it.
      if (s.framework.attention != AttentionKind::Unfused) {
        return scale * (sp ? sbh * (replicated + split) / t : sbh * (replicated + split / t));
      }
      return scale * (sp ? sbh * (replicated + split + 5 * a * seq / h) / t
                         : sbh * (replicated + split / t + 5 * a * seq / (h * t)));
    case Recompute::Selective:
      return scale * (sp ? sbh * (replicated + split) / t : sbh * (replicated + split / t));
    case Recompute::Full:  // the layer's input; under DeepSpeed's partition_activations 1/t of it
      return scale * (sp || s.framework.partition_activations ? 2 * sbh / t : 2 * sbh);
  }
  return 0;
}

double layer_working_set_bytes(const Scenario& s) {
  Scenario none = s;
  none.parallel.recompute = Recompute::None;
  return activation_bytes_per_layer(none);
}

namespace {

// Per micro-batch on one rank, in bytes: what the dense MLP keeps (the MLP-up output and the activation's output,
// split over TP; with FP8 the down GEMM's input in one byte), and what an MoE MLP keeps instead (Megatron-Core's
// MoELayer: moe/router.py, token_dispatcher.py, experts.py TEGroupedMLP, which multiplies the routing probabilities
// into the activation, activation_func_with_probs, so the down GEMM's output is not kept): the router's fp32
// probabilities [T, E]; on the rank holding the hottest experts, for each row dispatched to it (T x top_k x its share,
// model/ops/moe_ops.hpp), the permuted input of the up GEMM (hidden), the up GEMM's output (the activation's input: twice
// moe_ffn_hidden with SwiGLU), the activation's output (moe_ffn_hidden) and the row's fp32 probability; the shared
// experts as a dense MLP of their width. FP8 keeps the GEMM inputs in one byte, and the SwiGLU input too (Megatron-
// Bridge 0.1.0rc3's CHANGELOG.md: "Store SwiGLU input in FP8 to save activation memory").
double dense_mlp_stash_bytes(const Scenario& s, double tokens) {
  const double e = dtype_bytes(s.model.dtype), fp8 = s.model.fp8 != Fp8Format::None ? 1 : 0;
  return tokens * e * (d(s.mlp_up_width()) + d(s.ffn_hidden()) * (1 - fp8 / 2)) / d(s.parallel.tp);
}

double moe_mlp_stash_bytes(const Scenario& s, double tokens) {
  const auto& p = s.parallel;
  const double h = d(s.model.hidden), e = dtype_bytes(s.model.dtype), input = s.model.fp8 != Fp8Format::None ? 1 : e;
  const double width = d(s.moe_ffn_hidden()) / d(p.etp);
  const double up = (s.model.activation == Activation::Swiglu ? 2 : 1) * width;
  // The layer's tokens on this rank (a sequence shard under sequence parallelism), each sent to top_k experts; the
  // hottest EP rank receives its share of every peer's rows, and the ETP gather makes each rank of it hold them all.
  const bool sp = p.sequence_parallel && p.tp > 1;
  const double rank_tokens = sp ? tokens / d(p.tp) : tokens;
  const std::vector<double> shares = ep_rank_row_shares(s);
  const double hottest = *std::max_element(shares.begin(), shares.end());
  const double rows = rank_tokens * d(s.model.top_k) * d(p.ep) * hottest * d(p.etp);
  const double swiglu_input = s.model.fp8 != Fp8Format::None && s.model.activation == Activation::Swiglu ? 1 : e;
  const double routed = rows * (input * h + swiglu_input * up + input * width + 4);
  const double router = rank_tokens * d(s.model.experts) * 4;
  const double shared_width = d(s.model.shared_experts * s.moe_ffn_hidden());
  const double shared_up = (s.model.activation == Activation::Swiglu ? 2 : 1) * shared_width;
  const double shared = tokens * (e * shared_up + input * shared_width) / d(p.tp);
  return routed + router + shared;
}

double micro_batch_tokens(const Scenario& s) {
  return d(s.model.seq_len) / d(std::max<std::int64_t>(1, s.parallel.cp)) * d(s.parallel.micro_batch);
}

}  // namespace

double moe_activation_bytes_per_layer(const Scenario& s) {
  const double dense = activation_bytes_per_layer(s);
  if (s.parallel.recompute == Recompute::Full) return dense;  // the layer's input only
  const double tokens = micro_batch_tokens(s);
  return dense - dense_mlp_stash_bytes(s, tokens) + moe_mlp_stash_bytes(s, tokens);
}

double moe_layer_working_set_bytes(const Scenario& s) {
  Scenario none = s;
  none.parallel.recompute = Recompute::None;
  return moe_activation_bytes_per_layer(none);
}

namespace {

// The average stash of `stage`'s transformer layers for one micro-batch (a layer full recompute covers keeps only its
// input): MoE layers keep their own MLP's activations.
double stage_layer_stash_bytes(const Scenario& s, int stage) {
  Scenario kept = s;  // a layer block recompute leaves alone keeps what it would without recompute
  kept.parallel.recompute = Recompute::None;
  const double layers = d(s.layers_on_stage(stage));
  if (layers <= 0) return 0;
  const double recomputed = s.parallel.recompute == Recompute::Full ? d(s.recomputed_layers_on_stage(stage)) : layers;
  const double moe = moe_layers_on_stage(s, stage), dense = layers - moe;
  double kept_stash = activation_bytes_per_layer(kept), layer_stash = activation_bytes_per_layer(s);
  if (moe > 0) {
    kept_stash = (dense * kept_stash + moe * moe_activation_bytes_per_layer(kept)) / layers;
    layer_stash = (dense * layer_stash + moe * moe_activation_bytes_per_layer(s)) / layers;
  }
  return (recomputed * layer_stash + (layers - recomputed) * kept_stash) / layers;
}

}  // namespace

MemoryEstimate estimate_memory(const Scenario& s) {
  const auto& p = s.parallel;
  MemoryEstimate estimate;
  estimate.capacity_bytes = gpu_memory_bytes(s.cluster.node);
  const auto schedule = build_schedule(p, combined_extra_warmup(s));
  const StateBytesPerParameter per_param = state_bytes_per_parameter(s);
  for (int stage = 0; stage < p.pp; ++stage) {
    StageMemory m;
    m.stage = stage;
    m.parameters = parameters_per_gpu(s, stage);
    m.weights_bytes = m.parameters * per_param.weights;
    m.gradients_bytes = m.parameters * per_param.gradients;
    // Megatron-Core's distributed optimizer shards the dense state over the data-parallel group with context
    // parallelism, dp x cp ranks (megatron/core/optimizer/__init__.py, get_megatron_optimizer: data_parallel_group=
    // get_data_parallel_group(with_context_parallel=True)), the routed experts' over the expert-data-parallel group
    const double dense_shards = d(p.dp * p.cp);
    m.optimizer_bytes = m.parameters * per_param.optimizer / (p.zero_stage >= 1 ? dense_shards : 1.0);
    if (p.zero_stage >= 1 && s.model.is_moe()) {
      const double experts = moe_layers_on_stage(s, stage) * expert_parameters_per_gpu(s);
      const double edp = d(p.tp * p.cp * p.dp / (p.ep * p.etp));
      m.optimizer_bytes += experts * per_param.optimizer * (1 / edp - 1 / dense_shards);
    }
    if (p.zero_stage == 2) {
      // ZeRO-2: each rank keeps its shard of the gradients (over dp x cp, as the optimizer's), and, before their
      // reduce-scatters, the whole gradients of the chunk whose backward just ran (its layers' reductions may all be
      // in flight at its end): the largest chunk's layers.
      std::int64_t chunk_layers = 0;
      for (int chunk = 0; chunk < p.virtual_stages; ++chunk) {
        chunk_layers = std::max(chunk_layers,
                                s.layers_in_virtual_stage(p.virtual_stage(stage, chunk)));
      }
      m.gradients_bytes = m.parameters * per_param.gradients / dense_shards +
                          per_param.gradients * d(chunk_layers) * layer_parameters_per_gpu(s);
    }
    if (p.zero_stage == 3) {
      // FSDP FULL_SHARD: weights and gradients sharded too; on top, the units gathered in the model dtype at once
      // (the root through the whole micro-batch, the running block and the two its rate limiter lets the CPU
      // gather ahead) and one unit's unsharded gradient before its reduce-scatter.
      const double e = dtype_bytes(s.model.dtype), block = layer_parameters_per_gpu(s);
      const double root = m.parameters - d(s.layers_on_stage(stage)) * block;
      m.weights_bytes = m.parameters * per_param.weights / d(p.dp) + e * (root + 3 * block);
      m.gradients_bytes = m.parameters * per_param.gradients / d(p.dp) + e * std::max(root, block);
    }
    // FP8: Transformer Engine keeps an FP8 copy of every GEMM weight beside the 16-bit one, and its transpose (the
    // columnwise copy a backward GEMM reads along its K): 2 bytes per GEMM weight element. With FP8 parameters
    // (framework.fp8_param_gather: fp8_model_init) the weight is those FP8 bytes and their transpose, no 16-bit copy
    // (the fp32 master copy is the optimizer's): 1 + 1 bytes where the 16-bit weight took 2, nothing added.
    // An MoE layer's FP8 GEMMs are its attention's two, its shared experts' and each local expert's (GroupedLinear
    // caches one FP8 weight per expert, "weight{i}"), not a dense MLP's.
    if (s.model.fp8 != Fp8Format::None && !s.framework.fp8_param_gather) {
      const double moe = moe_layers_on_stage(s, stage), dense = d(s.layers_on_stage(stage)) - moe;
      m.weights_bytes += 2 * (dense * gemm_weights_per_gpu(s) + moe * moe_layer_fp8_gemm_weights_per_gpu(s));
    }
    m.in_flight_micro_batches = max_in_flight(schedule[stage]);
    // The chunks of a stage may differ (the embedding or the loss counted as a layer): the most layers in flight.
    std::vector<std::int64_t> chunk_layers;
    for (int chunk = 0; chunk < p.virtual_stages; ++chunk) {
      chunk_layers.push_back(s.layers_in_virtual_stage(p.virtual_stage(stage, chunk)));
    }
    // The combined 1F1B's merged pairs stash their forward's layers as their backward frees its own (the pair holds one
    // micro-batch's layers, not two, and one more layer).
    const double layers_in_flight =
        d(max_in_flight_weighted(schedule[stage], chunk_layers, combined_pair_forwards(s, schedule[stage], stage)));
    // A stage's layers each stash their share, or what they keep past the first recompute_num_layers of each chunk.
    m.activations_bytes = layers_in_flight * stage_layer_stash_bytes(s, stage);
    // Recompute rebuilds one layer's full activations before its backward (an MoE layer's, where the stage has one).
    if (p.recompute != Recompute::None) {
      m.activations_bytes +=
          moe_layers_on_stage(s, stage) > 0 ? moe_layer_working_set_bytes(s) : layer_working_set_bytes(s);
    }
    // A zero-bubble schedule's W inputs: for each micro-batch whose B ran and W did not, every layer's linear layers'
    // inputs and output gradients (what the executor keeps; an MoE layer's attention's two).
    std::vector<double> chunk_deferred_bytes;  // one micro-batch's W inputs, per chunk
    for (int chunk = 0; chunk < p.virtual_stages; ++chunk) {
      const std::int64_t vs = p.virtual_stage(stage, chunk), first = s.first_layer_of_virtual_stage(vs);
      double bytes = 0;
      for (std::int64_t layer = first; layer < first + s.layers_in_virtual_stage(vs); ++layer) {
        bytes += deferred_weight_grad_bytes(s, static_cast<int>(layer));
      }
      chunk_deferred_bytes.push_back(bytes);
    }
    m.activations_bytes += max_deferred_weight_grads_weighted(schedule[stage], chunk_deferred_bytes);
    // The last stage holds one micro-batch of fp32 logits for the cross-entropy (s b V/t floats).
    if (p.holds_head(stage)) {
      m.activations_bytes += 4.0 * d(s.model.seq_len) * d(p.micro_batch) * d(s.padded_vocab()) / d(p.tp);
    }
    m.peak_bytes = m.weights_bytes + m.gradients_bytes + m.optimizer_bytes + m.activations_bytes;
    estimate.peak_bytes = std::max(estimate.peak_bytes, m.peak_bytes);
    estimate.stages.push_back(m);
  }
  estimate.fits = estimate.peak_bytes <= estimate.capacity_bytes;
  return estimate;
}

}  // namespace twin::model
