// The transformer layers' GEMMs, in FP8 where the Program says so (model::runs_in_fp8: model.fp8, and the op's GEMM
// one of the four of a layer), and the amax reductions the Program carries for them.
//
// An FP8 GEMM quantizes its operands as fp8_state.hpp says (the recipe's scales; E4M3 forward, the output gradient
// E5M2 under "hybrid"), reads them back and multiplies in fp32 (the backend's fp8_matmul_*: emulated on the CPU).
// Amaxes reduce to their maximum over their group, so that every plan quantizes alike:
//   delayed     at the end of each forward and backward region (the Program's Fp8Amax op on TransformerLayer), the
//               region's amaxes over TP and the op's group (DP x CP, when there are replicas or CP ranks): TE's amax
//               reduction group. Under TP the max of the shards' amaxes is the whole tensor's, and under CP the max
//               of the ranks' chunks' amaxes is the whole sequence's, so those plans' scales are one rank's; DP
//               replicas see other micro-batches, so theirs are the max over them.
//   tensorwise  before a sequence-parallel input's gather (the Fp8Amax op on the GEMM's kind): the input shards'
//               amaxes over TP, which is the gathered input's own amax (the GEMM checks that it is). Never over CP:
//               a CP rank scales its own tokens, as TE's current scaling does (its amax group is TP's alone).
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "exec/core/check.hpp"
#include "exec/interpreter/fp8_linear.hpp"
#include "kernels/cpu/fp8.hpp"
#include "model/ops/compute_ops.hpp"  // runs_in_fp8

namespace twin::exec {

using model::Op;

void linear_gemm_forward(RankContext& ctx, Fp8Linear* fp8, const Op& op, const Tensor& out, const Tensor& inp,
                         const Tensor& weight, const Tensor& bias, int rows, int in_features, int out_features) {
  if (!model::runs_in_fp8(ctx.scenario, op.what)) {
    ctx.backend.matmul_forward(out, inp, weight, bias, rows, in_features, out_features);
    return;
  }
  fp8->forward(op, out, inp, weight, bias, rows, in_features, out_features);
}

void linear_gemm_backward(RankContext& ctx, Fp8Linear* fp8, const Op& op, const Tensor& dinp, const Tensor& dweight,
                          const Tensor& dbias, const Tensor& dout, const Tensor& inp, const Tensor& weight, int rows,
                          int in_features, int out_features) {
  if (!model::runs_in_fp8(ctx.scenario, op.what)) {
    ctx.backend.matmul_backward(dinp, dweight, dbias, dout, inp, weight, rows, in_features, out_features);
    return;
  }
  fp8->backward(op, dinp, dweight, dbias, dout, inp, weight, rows, in_features, out_features);
}

void Fp8Linear::forward(const Op& op, const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,
                        int rows, int in_features, int out_features) {
  const Fp8GemmOperands q = state_.operands(op);
  const Fp8Amaxes amaxes = ctx_.backend.fp8_kernels().fp8_matmul_forward(out, inp, weight, bias, rows, in_features,
                                                                         out_features, q.input, q.weight);
  state_.record(op, amaxes);
  const auto reduced = input_amaxes_.find({op.layer, static_cast<int>(op.what)});
  if (reduced != input_amaxes_.end()) {  // tensorwise, sequence parallel: the amax its shards reduced to
    TWIN_EXEC_CHECK(reduced->second == amaxes.input || (std::isnan(reduced->second) && std::isnan(amaxes.input)),
                    "layer {}: the gathered FP8 input's amax {} is not its shards' reduced amax {}", op.layer,
                    amaxes.input, reduced->second);
    input_amaxes_.erase(reduced);
  }
}

void Fp8Linear::backward(const Op& op, const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                         const Tensor& dout, const Tensor& inp, const Tensor& weight, int rows, int in_features,
                         int out_features) {
  const Fp8GemmOperands q = state_.operands(op);
  state_.record(
      op, ctx_.backend.fp8_kernels().fp8_matmul_backward(dinp, dweight, dbias, dout, inp, weight, rows, in_features,
                                                         out_features, q.input, q.weight, q.gradient));
}

// Transformer Engine's delay_wgrad_compute (transformer_engine/pytorch/module/linear.py, _Linear.backward, TE 2.x):
// the backward quantizes the output gradient once for both GEMMs, runs the dgrad GEMM and stores the wgrad GEMM's
// quantized operands (`ctx.wgrad_store.put([inputmat_total, grad_output], wgrad_gemm)`); backward_dw runs it later.
// The delayed-scaling amax of the output gradient is recorded at the cast, in B: the same step as unsplit.
Fp8GemmOperands Fp8Linear::backward_input(const Op& op, const Tensor& dinp, const Tensor& dbias, const Tensor& dout,
                                          const Tensor& inp, const Tensor& weight, int rows, int in_features,
                                          int out_features) {
  const Fp8GemmOperands q = state_.operands(op);
  state_.record(
      op, ctx_.backend.fp8_kernels().fp8_matmul_backward(dinp, Tensor{}, dbias, dout, inp, weight, rows, in_features,
                                                         out_features, q.input, q.weight, q.gradient));
  return q;
}

void Fp8Linear::backward_weight(const Fp8GemmOperands& q, const Tensor& dweight, const Tensor& dout, const Tensor& inp,
                                const Tensor& weight, int rows, int in_features, int out_features) {
  ctx_.backend.fp8_kernels().fp8_matmul_backward(Tensor{}, dweight, Tensor{}, dout, inp, weight, rows, in_features,
                                                 out_features, q.input, q.weight, q.gradient);
}

// values (n) <- their elementwise maximum over `g` (NaN if any member's is NaN): an all-gather, then the max in
// member order, so that every member computes the same bits.
void Fp8Linear::max_over(const model::Group g, std::vector<float>& values, std::string_view label) {
  const CommGroup& members = ctx_.group(g);
  if (members.members.size() <= 1 || values.empty()) return;
  std::vector<float> all(values.size() * members.members.size());
  ctx_.comm.all_gather(members, values.data(), all.data(), values.size(), DType::F32, label);
  for (std::size_t i = 0; i < values.size(); ++i) {
    float m = all[i];
    for (std::size_t r = 1; r < members.members.size(); ++r) {
      const float v = all[r * values.size() + i];
      m = std::isnan(m) || std::isnan(v) ? std::numeric_limits<float>::quiet_NaN() : std::max(m, v);
    }
    values[i] = m;
  }
}

void Fp8Linear::reduce_amaxes(const Op& op) {
  const std::string& label = ctx_.label();
  if (op.what == model::ComputeKind::TransformerLayer) {  // delayed scaling: a region ends
    TWIN_EXEC_CHECK(state_.delayed(), "{}: an FP8 region's amax reduction under the {} recipe", label,
                    model::to_string(ctx_.scenario.framework.fp8_recipe));
    std::vector<float> amaxes = state_.pending(op.phase);
    max_over(model::Group::Tensor, amaxes, label);
    if (op.group != model::Group::Tensor) max_over(op.group, amaxes, label);
    state_.update(op.phase, amaxes);
    return;
  }
  // tensorwise: the input shard of a sequence-parallel column-parallel GEMM, before its gather
  LayerStash& s = ctx_.stash(op);
  const bool mlp = op.what == model::ComputeKind::MlpUp && !ctx_.dims.shared_norm;
  const Tensor& shard = mlp ? s.ln2 : s.ln1;
  TWIN_EXEC_CHECK(!shard.empty(), "{}: the FP8 input shard is missing", label);
  std::vector<float> host(shard.numel);
  ctx_.backend.download_f32(host.data(), shard);
  std::vector<float> amax{kernels::cpu::absolute_max(host.data(), host.size())};
  max_over(op.group, amax, label);
  input_amaxes_[{op.layer, static_cast<int>(op.what)}] = amax[0];
}

}  // namespace twin::exec
