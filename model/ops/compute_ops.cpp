#include "model/ops/compute_ops.hpp"
#include "model/ops/context_parallel.hpp"

#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include "model/ops/context_parallel_ops.hpp"

namespace twin::model {
namespace {

Op compute_op(ComputeKind what, Phase phase, std::vector<Kernel> kernels) {
  Op op;
  op.kind = OpKind::Compute;
  op.what = what;
  op.phase = phase;
  for (const Kernel& kernel : kernels) op.bytes += kernel.bytes;
  auto breakdown = std::make_shared<KernelBreakdown>();
  breakdown->kernels = std::move(kernels);
  op.breakdown = std::move(breakdown);
  return op;
}

bool fp8_gemm_kind(ComputeKind what) {
  return what == ComputeKind::QkvProjection || what == ComputeKind::AttentionProjection || what == ComputeKind::MlpUp ||
         what == ComputeKind::MlpDown || what == ComputeKind::ExpertUp || what == ComputeKind::ExpertDown;
}

// An FP8 GEMM op's kernels, as Transformer Engine runs a linear layer (transformer_engine/pytorch/module/linear.py,
// layernorm_linear.py): the GEMM(s) on one-byte operands writing the 16-bit output, and around them the casts, each
// writing a rowwise and a columnwise FP8 copy (what the backward's GEMMs read along their own K: Hopper's FP8 GEMMs
// take only the "TN" layout, MXFP8's blocks run along K), reading the 16-bit tensor: 2 + e bytes per element.
//   forward   the input's cast (a dense column-parallel GEMM's is fused into the layer norm before it, whose output
//             is FP8: nothing more), the weight's cast once per iteration (TE caches FP8 weights across
//             micro-batches: spread over them here);
//   backward  the output gradient's cast; a sequence-parallel column-parallel GEMM's input, gathered rowwise only,
//             transposed for the weight gradient (read and write one byte).
// Tensorwise scaling (Float8CurrentScaling) reads each tensor once more for its amax before the cast; delayed,
// blockwise and MXFP8 scales come from the cast kernel itself or from earlier steps.
//
// The routed experts (`experts` > 1: ExpertUp, ExpertDown) run as TE's GroupedLinear (Megatron-Core's TEGroupedMLP;
// transformer_engine/pytorch/module/grouped_linear.py, v2.x, _GroupedLinear.forward and backward at 0069563f): one
// quantizer per expert, so each local expert's input rows are cast for its own GEMM with their own scale (its amax
// under current scaling: tex.fused_multi_quantize / split_quantize over m_splits), each expert's weight is its own
// FP8 tensor (get_weight_workspace, cached as "weight{i}" from the first micro-batch), and backward each expert's
// output gradient is cast on its own; the input is never layer-norm fused nor gathered by the module (the
// dispatcher's rows arrive 16-bit). So every cast, GEMM and weight read is per expert: the kernels of `experts`
// linear layers over the same rows in all.
std::vector<Kernel> fp8_gemm_kernels(const Shapes& x, ComputeKind what, bool backward, double m, double n, double k,
                                     double experts) {
  const double e = x.e, cast = 2 + e, amax = x.fp8_recipe == Fp8Recipe::Tensorwise ? e : 0;
  const bool fused_input = what == ComputeKind::QkvProjection || what == ComputeKind::MlpUp;
  const double weights = experts * k * n;  // every expert's [k, n] weight
  const auto per_expert = [experts](int launches) { return static_cast<std::int32_t>(launches * experts); };
  std::vector<Kernel> kernels;
  if (!backward) {
    kernels.push_back({KernelKind::Fp8Gemm, per_expert(1), m * k + weights + e * m * n});
    const double input = fused_input ? 0 : (cast + amax) * m * k;
    kernels.push_back(
        {KernelKind::Stream, per_expert(fused_input ? 1 : 2), input + (cast + amax) * weights / x.micro_batches});
    return kernels;
  }
  // dX = dY W^T reads dY and W, writes dX; dW = X^T dY reads X and dY, writes dW.
  kernels.push_back({KernelKind::Fp8Gemm, per_expert(2), (m * n + weights + e * m * k) + (m * k + m * n + e * weights)});
  const double transpose = fused_input && x.sequence_parallel ? 2 * m * k : 0;
  kernels.push_back({KernelKind::Stream, per_expert(transpose > 0 ? 2 : 1), (cast + amax) * m * n + transpose});
  return kernels;
}

}  // namespace

bool runs_in_fp8(const Scenario& scenario, ComputeKind what) {
  return scenario.model.fp8 != Fp8Format::None && fp8_gemm_kind(what);
}

Op elementwise(ComputeKind what, Phase phase, double bytes, int launches) {
  return compute_op(what, phase, {Kernel{KernelKind::Stream, launches, bytes}});
}

void add_stream_bytes(Op& op, double bytes) {
  auto breakdown = std::make_shared<KernelBreakdown>(*op.breakdown);
  for (Kernel& kernel : breakdown->kernels) {
    if (kernel.kind == KernelKind::Stream) {
      kernel.bytes += bytes;
      break;
    }
  }
  op.bytes += bytes;
  op.breakdown = std::move(breakdown);
}

namespace {

// `experts` GEMMs, one per weight, each over its share of the m rows: the FLOPs of one [m, k] x [k, n] GEMM; every
// weight read (and, backward, its gradient written and accumulated); one launch per weight. Their own kernels (one
// forward; the input- and weight-gradient GEMMs backward); then, backward, the framework's accumulation of the [k, n]
// weight gradients across micro-batches (gradient_accumulation_bytes); then the traffic beyond the operands, timed as
// one memory-bound kernel.
Op gemms(const Shapes& x, ComputeKind what, Phase phase, double m, double n, double k, double experts,
         double epilogue_bytes) {
  const bool backward = phase == Phase::Backward;
  const double passes = backward ? 2 : 1;
  const double weight = d(static_cast<std::int64_t>(k)) * d(static_cast<std::int64_t>(n));
  std::vector<Kernel> kernels =
      x.fp8 && fp8_gemm_kind(what)
          ? fp8_gemm_kernels(x, what, backward, m, n, k, experts)
          : std::vector<Kernel>{{KernelKind::Gemm, static_cast<std::int32_t>(passes * experts),
                                 passes * x.e * (m * k + experts * k * n + m * n)}};
  const double accumulation = x.accumulation_bytes_per_weight * experts * weight;
  if (backward && accumulation > 0) kernels.push_back({KernelKind::Stream, x.accumulation_launches, accumulation});
  if (epilogue_bytes > 1) kernels.push_back({KernelKind::Stream, 1, epilogue_bytes});
  Op op = compute_op(what, phase, std::move(kernels));
  op.flops = passes * 2 * m * n * k;
  op.gemm = GemmShape{static_cast<std::int64_t>(experts > 1 ? std::ceil(m / experts) : m),
                      static_cast<std::int64_t>(n), static_cast<std::int64_t>(k), static_cast<std::int64_t>(experts)};
  return op;
}

// Composer's nn.Linear sums the output gradient into the bias gradient in its backward (read e per output element);
// Megatron's biases ride on the elementwise op that follows (see qkv_projection).
double bias_gradient_bytes(const Shapes& x, Phase phase, double m, double n) {
  return x.composer && phase == Phase::Backward ? x.e * m * n : 0;
}

}  // namespace

Op gemm(const Shapes& x, ComputeKind what, Phase phase, double m, double n, double k, double epilogue_bytes) {
  return gemms(x, what, phase, m, n, k, 1, epilogue_bytes);
}

Op expert_linear(const Shapes& x, ComputeKind what, Phase phase, double m, double n, double k, double experts) {
  return gemms(x, what, phase, m, n, k, experts, bias_gradient_bytes(x, phase, m, n));
}

bool deferrable_weight_gradient(ComputeKind what) {
  return what == ComputeKind::QkvProjection || what == ComputeKind::AttentionProjection ||
         what == ComputeKind::MlpUp || what == ComputeKind::MlpDown;
}

namespace {

// The FP8 backward's kernels (fp8_gemm_kernels: the two FP8 GEMMs as one entry of 2 launches, then the cast of the
// output gradient, then gemm()'s accumulation and epilogue) apart, as Transformer Engine splits them under
// delay_wgrad_compute (transformer_engine/pytorch/module/linear.py and layernorm_linear.py, _Linear.backward, TE 2.x):
// the backward quantizes the output gradient (grad_output_preprocess, its rowwise and columnwise copies at once),
// makes the input's columnwise copy (a sequence-parallel input's transpose after its gather), runs the dgrad GEMM and
// hands the wgrad GEMM's quantized operands to its WeightGradStore (`ctx.wgrad_store.put([inputmat_total,
// grad_output], wgrad_gemm)`); Linear.backward_dw later pops them and runs the wgrad GEMM into main_grad. So B: the
// dgrad GEMM (dX = dY W^T: reads dY and W in one byte, writes dX) and the cast; W: the wgrad GEMM (dW = X^T dY) and
// the accumulation.
std::pair<std::vector<Kernel>, std::vector<Kernel>> split_fp8_kernels(const Shapes& x, const Op& backward,
                                                                      double accumulation) {
  const std::vector<Kernel>& kernels = backward.breakdown->kernels;
  const double m = d(backward.gemm.m), n = d(backward.gemm.n), k = d(backward.gemm.k);
  const double dgrad = m * n + n * k + x.e * m * k;
  std::vector<Kernel> input_kernels{{KernelKind::Fp8Gemm, 1, dgrad}, kernels.at(1)};
  std::vector<Kernel> weight_kernels{{KernelKind::Fp8Gemm, 1, kernels.front().bytes - dgrad}};
  if (accumulation > 0) weight_kernels.push_back(kernels.at(2));
  for (std::size_t i = accumulation > 0 ? 3 : 2; i < kernels.size(); ++i) input_kernels.push_back(kernels[i]);
  return {std::move(input_kernels), std::move(weight_kernels)};
}

}  // namespace

// gemm()'s 16-bit backward kernels are its two GEMMs (one launch each, the same bytes: dX = dY W^T reads dY and W and
// writes dX, dW = X^T dY reads X and dY and writes dW, e (mk + kn + mn) each), then the accumulation, then the
// epilogue; FP8's are split_fp8_kernels'.
SplitBackward split_weight_gradient(const Shapes& x, const Op& backward) {
  const bool valid = backward.phase == Phase::Backward && backward.breakdown && !backward.breakdown->kernels.empty() &&
                     backward.breakdown->kernels.front().launches == 2;
  const KernelKind first = valid ? backward.breakdown->kernels.front().kind : KernelKind::Stream;
  if (!valid || (first != KernelKind::Gemm && first != KernelKind::Fp8Gemm)) {
    throw std::invalid_argument("split_weight_gradient: not a backward GEMM op: " +
                                std::string(to_string(backward.what)));
  }
  const std::vector<Kernel>& kernels = backward.breakdown->kernels;
  const double accumulation = x.accumulation_bytes_per_weight * d(backward.gemm.k) * d(backward.gemm.n) *
                              d(backward.gemm.count);
  std::vector<Kernel> input_kernels, weight_kernels;
  if (first == KernelKind::Fp8Gemm) {
    std::tie(input_kernels, weight_kernels) = split_fp8_kernels(x, backward, accumulation);
  } else {
    const Kernel each{KernelKind::Gemm, 1, kernels.front().bytes / 2};
    const std::size_t after_gemm = accumulation > 0 ? 2 : 1;  // gemm() appends the accumulation right after the GEMMs
    input_kernels = {each};
    weight_kernels = {each};
    if (accumulation > 0) weight_kernels.push_back(kernels.at(1));
    for (std::size_t i = after_gemm; i < kernels.size(); ++i) input_kernels.push_back(kernels[i]);
  }
  SplitBackward split{compute_op(backward.what, Phase::Backward, std::move(input_kernels)),
                      compute_op(backward.what, Phase::WeightGrad, std::move(weight_kernels))};
  for (Op* part : {&split.input_grad, &split.weight_grad}) {
    part->flops = backward.flops / 2;
    part->gemm = backward.gemm;
    part->layer = backward.layer;
  }
  split.input_grad.deps = backward.deps;
  split.input_grad.defers_weight_grad = true;
  return split;
}

// A linear layer of the model: Megatron's (biases added by the elementwise op that follows, see qkv_projection) or
// Composer's nn.Linear, whose bias rides in the GEMM's epilogue forward and whose backward sums the output gradient
// into the bias gradient (bias_gradient_bytes).
Op linear(const Shapes& x, ComputeKind what, Phase phase, double m, double n, double k, double epilogue_bytes) {
  return gemm(x, what, phase, m, n, k, bias_gradient_bytes(x, phase, m, n) + epilogue_bytes);
}

// The QKV projection: the one linear layer whose bias is not fused into a following elementwise kernel (the
// attention output and MLP biases go into bias-dropout-add and bias-GeLU: skip_bias_add). Megatron-LM's
// ColumnParallelLinear adds it after the GEMM in a kernel of its own: F.linear on a 3-D input is matmul then
// `output += bias` (PyTorch of 2021-2022: functional.py, then aten/src/ATen/native/Linear.cpp; Megatron-LM and
// Megatron-DeepSpeed of 2021), and LinearWithGradAccumulationAndAsyncCommunication's `output = output + bias`
// (2022); the backward sums the output gradient into the bias gradient (`grad_output.sum(dim=0)`). Those passes
// ride on the GEMM op as bytes beyond its operands: forward read and write the output, backward read its gradient.
// Rotary embeddings ride on it too: Megatron-Core (megatron/core/transformer/attention.py, 2023-2024) rotates Q and K
// right after the QKV GEMM, before the core attention, in one fused kernel per pass (apply_rope_fusion: read and
// write them forward, their gradients backward), as the executor does; a selective recompute of the core leaves them.
// The bias pass and the rotation are timed as one kernel beyond the GEMM.
Op qkv_projection(const Shapes& x, Phase phase, double epilogue_bytes) {
  const double width = x.qkv_local;
  double passes = 0;
  if (!x.composer && x.bias) passes += (phase == Phase::Backward ? 1 : 2) * x.e * x.tokens * width;
  if (x.rope) passes += 2 * x.e * x.tokens * (x.heads_local + x.kv_heads_local) * x.head_dim;
  return linear(x, ComputeKind::QkvProjection, phase, x.tokens, width, x.h, passes + epilogue_bytes);
}

Op tensor_collective(CollectiveKind kind, Payload payload, ComputeKind what, Phase phase, double bytes) {
  Op op;
  op.kind = OpKind::Collective;
  op.collective = kind;
  op.group = Group::Tensor;
  op.payload = payload;
  op.what = what;
  op.phase = phase;
  op.bytes = bytes;
  return op;
}

void reduce_across_tensor(std::vector<Op>& ops, const Shapes& x, Payload payload, ComputeKind what, Phase phase) {
  if (!x.tensor_comm) return;
  const auto kind = x.sequence_parallel ? CollectiveKind::ReduceScatter : CollectiveKind::AllReduce;
  ops.push_back(tensor_collective(kind, payload, what, phase, x.tokens * x.h * x.e));
}

void gather_sequence(std::vector<Op>& ops, const Shapes& x, Payload payload, ComputeKind what, Phase phase) {
  if (!x.sequence_parallel) return;
  // FP8: a column-parallel GEMM's input is quantized before the gather and gathered in one byte per element (TE's
  // gather_along_first_dim with the input quantizer); tensorwise scaling first reduces the shards' amaxes across TP
  // (the quantizer's amax reduction group) so that every shard takes one scale.
  const bool fp8_input = x.fp8 && payload == Payload::LayerInput && fp8_gemm_kind(what);
  if (fp8_input && x.fp8_recipe == Fp8Recipe::Tensorwise && phase != Phase::Backward) {
    ops.push_back(tensor_collective(CollectiveKind::AllReduce, Payload::Fp8Amax, what, phase, 4));
  }
  ops.push_back(
      tensor_collective(CollectiveKind::AllGather, payload, what, phase, x.tokens * x.h * (fp8_input ? 1 : x.e)));
}

// Layout copies around the attention core (megatron/model/transformer.py, ParallelAttention / CoreAttention,
// 2021-2022; also Megatron-DeepSpeed): forward, the context [b, np, s, hn] -> [s, b, np, hn] by
// permute(...).contiguous() (read and write it); backward, Q, K and V come from split_tensor_along_last_dim views of
// the QKV output, whose backward (split_backward) concatenates their three gradients into one tensor (read and write
// 3 h/t per token). Composer's MPT attention takes Q, K and V as qkv.chunk(3) views and hands the kernel
// [b, s, h, d] views (rearrange) whose last dimension is contiguous, and views its output back: no forward copy; the
// backward of chunk concatenates the three gradients as split's does.
//
// Grouped-query attention in Megatron-Core (megatron/core/transformer/dot_product_attention.py, 2023-2024) adds one
// pass of the same kind without FlashAttention: K and V are first expanded to the query heads (repeat_interleave: read
// the key/value heads, write the query-head-wide copies), and the backward sums the copies' gradients back (read,
// write); FlashAttention takes the key/value heads as they are.
double layout_copy_bytes(const Shapes& x, Phase phase) {
  const double head_tensor = x.e * x.tokens * x.heads_local * x.head_dim;   // Q, the context: [tokens, h/t]
  const double kv_tensor = x.e * x.tokens * x.kv_heads_local * x.head_dim;  // K or V
  const double expand = !x.flash && x.kv_heads_local < x.heads_local ? 2 * (kv_tensor + head_tensor) : 0;
  if (phase == Phase::Backward) return 2 * (head_tensor + 2 * kv_tensor) + expand;
  return (x.composer ? 0 : 2 * head_tensor) + expand;
}

Op activation(const Shapes& x, Phase phase) {
  const bool backward = phase == Phase::Backward;
  if (x.swiglu) {
    return elementwise(ComputeKind::Swiglu, phase,
                       (backward ? x.swiglu_backward() : x.swiglu_forward()) * x.tokens * x.f / x.t,
                       x.swiglu_launches());
  }
  return elementwise(ComputeKind::Gelu, phase, (backward ? x.gelu_backward() : x.gelu_forward()) * x.tokens * x.f / x.t,
                     x.gelu_launches(phase));
}

AttentionBenchmarkKernels unmasked_attention_kernels(double batch_heads, double seq, double head_dim,
                                                     double element_bytes, bool dropout) {
  const double e = element_bytes, scores = batch_heads * seq * seq;
  const double head_tensor = e * batch_heads * seq * head_dim;  // Q, K, V, the context, or a gradient of one
  const int passes = 1 + (dropout ? 1 : 0) + 1;                 // fused softmax, dropout, layout copy
  // Softmax (not causal: the whole row), then dropout (read, write, a one-byte mask; backward read dy and the mask,
  // write dx), the layout copies (context permute forward; Q, K, V gradients concatenated backward).
  AttentionBenchmarkKernels kernels;
  kernels.forward = {
      {KernelKind::AttentionGemms, 2, 2 * (e * scores + 2 * head_tensor)},
      {KernelKind::AttentionPasses, passes, scores * (2 * e + (dropout ? 2 * e + 1 : 0)) + 2 * head_tensor}};
  kernels.backward = {
      {KernelKind::AttentionGemms, 4, 4 * (e * scores + 2 * head_tensor)},
      {KernelKind::AttentionPasses, passes, scores * (3 * e + (dropout ? 2 * e + 1 : 0)) + 6 * head_tensor}};
  return kernels;
}

Op attention_core(const Shapes& x, Phase phase) {
  // a2a (DeepSpeed-Ulysses): after its all-to-alls the rank runs whole-sequence causal attention on its head group.
  if (x.cp > 1 && x.cp_comm == CpComm::AllToAll) return attention_core(ulysses_core_shapes(x), phase);
  // Two batched GEMMs per head, Q K^T [s, d] x [d, s] and P V [s, s] x [s, d]: 4 b s^2 h / t FLOPs forward (the
  // model's count, Narayanan's, whatever a kernel skips under the causal mask; backward twice that).
  const bool backward = phase == Phase::Backward;
  const double gemms = 2 * x.batch * x.heads_local;
  const double scores = x.batch * x.heads_local * x.seq_local * x.seq;  // elements
  const double head_tensor = x.e * x.tokens * x.heads_local * x.head_dim;
  // One of K, V (grouped: fewer heads). Under context parallelism the kernel reads every rank's K and V blocks (the
  // ring's cp steps, or the gathered sequence) and writes their gradients: cp times the rank's own.
  const double kv_tensor = x.e * x.tokens * x.kv_heads_local * x.head_dim * x.cp;
  const double copies = layout_copy_bytes(x, phase);
  std::vector<Kernel> kernels;
  if (x.flash) {
    // FlashAttention never writes the scores: forward reads Q, K, V and writes the output and one fp32 log-sum-exp
    // per row; backward reads Q, K, V, the output, its gradient and the log-sum-exp (a preprocess kernel first
    // reads the output and its gradient for their row sums, 4 bytes a row), recomputes the scores tile by tile and
    // writes dQ, dK, dV (Dao et al. 2022, Algorithms 1 and 4). The cost model times the kernel by its measured
    // rate; these bytes are what it moves. Backward launches the preprocess, the kernel, and the fp32 dQ's copy
    // into the model dtype. With grouped-query attention K, V and their gradients have the key/value heads' width.
    const double rows = x.batch * x.heads_local * x.seq_local;
    const double bytes =
        backward ? (6 * head_tensor + 4 * kv_tensor) + 3 * 4 * rows : 2 * (head_tensor + kv_tensor) + 4 * rows;
    kernels.push_back({KernelKind::FlashAttention, backward ? 3 : 1, bytes});
    if (copies > 0) kernels.push_back({KernelKind::Stream, 1, copies});
  } else {
    // The GEMMs' own operands (Q, K, V, context and the s x s scores written by Q K^T and read by P V; backward:
    // their four gradient GEMMs), then the softmax and dropout passes over the scores (Megatron's unfused core with
    // a fused softmax kernel). With grouped-query attention the GEMMs read the expanded K and V (layout_copy_bytes).
    kernels.push_back(
        {KernelKind::AttentionGemms, backward ? 4 : 2, (backward ? 2 : 1) * (4 * head_tensor + 2 * scores * x.e)});
    // ALiBi as BigScience's Megatron-DeepSpeed adds it (megatron/model/transformer.py, ParallelAttention): Q K^T is
    // torch.baddbmm(alibi, ...) with beta != 0 on the [b np, 1, s] bias, which PyTorch first expands into the
    // output (a copy that writes the scores) and cuBLAS then reads as C: two more passes over the scores, forward
    // only (the bias is a constant: no gradient).
    const double alibi_bias = x.alibi && !backward ? scores * x.e : 0;
    if (alibi_bias > 0) kernels.push_back({KernelKind::AttentionOperand, 0, alibi_bias});
    const double passes = alibi_bias + scores * (backward ? x.scores_backward() : x.scores_forward()) + copies;
    kernels.push_back({KernelKind::AttentionPasses, x.attention_pass_launches(phase), passes});
  }
  Op op = compute_op(ComputeKind::AttentionCore, phase, std::move(kernels));
  // Context parallelism: the rank's queries (seq / cp of them) against the whole sequence's keys; the causal load
  // balance of the 2 cp chunks gives each rank the same share of the causal pairs (cp_causal_pairs_per_rank), 1 / cp.
  const double causal_share =
      cp_causal_pairs_per_rank(static_cast<std::int64_t>(x.seq), static_cast<std::int64_t>(x.cp)) /
      cp_causal_pairs_per_rank(static_cast<std::int64_t>(x.seq), 1);
  op.flops = (backward ? 2 : 1) * gemms * 2 * x.seq * x.seq * x.head_dim * causal_share;
  op.gemm = GemmShape{static_cast<std::int64_t>(x.seq_local), static_cast<std::int64_t>(x.seq),
                      static_cast<std::int64_t>(x.head_dim), static_cast<std::int64_t>(gemms)};
  return op;
}

}  // namespace twin::model
