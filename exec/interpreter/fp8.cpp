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
#include "exec/interpreter/fp8_state.hpp"
#include "exec/interpreter/interpreter.hpp"
#include "kernels/cpu/fp8.hpp"
#include "model/ops/compute_ops.hpp"

namespace twin::exec {

using model::Op;

void Interpreter::linear_forward(const Op& op, const Tensor& out, const Tensor& inp, const Tensor& weight,
                                 const Tensor& bias, int rows, int in_features, int out_features) {
  if (!model::runs_in_fp8(scenario_, op.what)) {
    backend_.matmul_forward(out, inp, weight, bias, rows, in_features, out_features);
    return;
  }
  const Fp8GemmOperands q = fp8_->operands(op);
  const Fp8Amaxes amaxes = backend_.fp8_kernels().fp8_matmul_forward(out, inp, weight, bias, rows, in_features,
                                                                     out_features, q.input, q.weight);
  fp8_->record(op, amaxes);
  const auto reduced = fp8_input_amaxes_.find({op.layer, static_cast<int>(op.what)});
  if (reduced != fp8_input_amaxes_.end()) {  // tensorwise, sequence parallel: the amax its shards reduced to
    TWIN_EXEC_CHECK(reduced->second == amaxes.input || (std::isnan(reduced->second) && std::isnan(amaxes.input)),
                    "layer {}: the gathered FP8 input's amax {} is not its shards' reduced amax {}", op.layer,
                    amaxes.input, reduced->second);
    fp8_input_amaxes_.erase(reduced);
  }
}

void Interpreter::linear_backward(const Op& op, const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                                  const Tensor& dout, const Tensor& inp, const Tensor& weight, int rows,
                                  int in_features, int out_features) {
  if (op.defers_weight_grad) {
    // A zero-bubble B: the input gradient (and the bias's) now, the weight gradient in the op's W. dout is copied:
    // the stream's gradient it may be is updated in place before W runs.
    TWIN_EXEC_CHECK(!model::runs_in_fp8(scenario_, op.what), "layer {}: a deferred weight gradient in FP8", op.layer);
    Tensor kept = backend_.allocate(dout.numel, dout.dtype);
    backend_.copy(kept, dout);
    chunk(op).deferred[{op.layer, static_cast<int>(op.what)}] = {inp, kept};
    backend_.matmul_backward(dinp, Tensor{}, dbias, dout, inp, weight, rows, in_features, out_features);
    return;
  }
  if (!model::runs_in_fp8(scenario_, op.what)) {
    backend_.matmul_backward(dinp, dweight, dbias, dout, inp, weight, rows, in_features, out_features);
    return;
  }
  const Fp8GemmOperands q = fp8_->operands(op);
  fp8_->record(op,
               backend_.fp8_kernels().fp8_matmul_backward(dinp, dweight, dbias, dout, inp, weight, rows, in_features,
                                                          out_features, q.input, q.weight, q.gradient));
}

// values (n) <- their elementwise maximum over `g` (NaN if any member's is NaN): an all-gather, then the max in
// member order, so that every member computes the same bits.
void Interpreter::max_over(const model::Group g, std::vector<float>& values, std::string_view label) {
  const CommGroup& members = group(g);
  if (members.members.size() <= 1 || values.empty()) return;
  std::vector<float> all(values.size() * members.members.size());
  comm_.all_gather(members, values.data(), all.data(), values.size(), DType::F32, label);
  for (std::size_t i = 0; i < values.size(); ++i) {
    float m = all[i];
    for (std::size_t r = 1; r < members.members.size(); ++r) {
      const float v = all[r * values.size() + i];
      m = std::isnan(m) || std::isnan(v) ? std::numeric_limits<float>::quiet_NaN() : std::max(m, v);
    }
    values[i] = m;
  }
}

void Interpreter::reduce_fp8_amaxes(const Op& op) {
  const std::string& label = labels_[current_op_];
  if (op.what == model::ComputeKind::TransformerLayer) {  // delayed scaling: a region ends
    TWIN_EXEC_CHECK(fp8_->delayed(), "{}: an FP8 region's amax reduction under the {} recipe", label,
                    model::to_string(scenario_.framework.fp8_recipe));
    std::vector<float> amaxes = fp8_->pending(op.phase);
    max_over(model::Group::Tensor, amaxes, label);
    if (op.group != model::Group::Tensor) max_over(op.group, amaxes, label);
    fp8_->update(op.phase, amaxes);
    return;
  }
  // tensorwise: the input shard of a sequence-parallel column-parallel GEMM, before its gather
  LayerStash& s = stash(op);
  const bool mlp = op.what == model::ComputeKind::MlpUp && !dims_.shared_norm;
  const Tensor& shard = mlp ? s.ln2 : s.ln1;
  TWIN_EXEC_CHECK(!shard.empty(), "{}: the FP8 input shard is missing", label);
  std::vector<float> host(shard.numel);
  backend_.download_f32(host.data(), shard);
  std::vector<float> amax{kernels::cpu::absolute_max(host.data(), host.size())};
  max_over(op.group, amax, label);
  fp8_input_amaxes_[{op.layer, static_cast<int>(op.what)}] = amax[0];
}

}  // namespace twin::exec
