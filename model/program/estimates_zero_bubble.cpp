// What a zero-bubble schedule's deferred W keeps (estimates.hpp), from the op shapes the executor keeps them in, in
// the precision the framework keeps them in.
#include "model/ops/kernel_traffic.hpp"
#include "model/program/estimates.hpp"

namespace twin::model {

double deferred_weight_grad_bytes(const Scenario& s, int layer) {
  const Shapes x(s);
  const double attention_width = x.heads_local * x.head_dim;
  // QKV: its input (T, h) and output gradient (T, qkv/t); the projection: (T, a/t) and (T, h)
  double elements = x.tokens * (x.h + x.qkv_local) + x.tokens * (attention_width + x.h);
  // MLP up: (T, h) and (T, up/t); MLP down: (T, f/t) and (T, h)
  if (!s.is_moe_layer(layer)) elements += x.tokens * (x.h + x.up_local) + x.tokens * (x.f / x.t + x.h);
  if (!x.fp8) return x.e * elements;
  // FP8: the four GEMMs run in FP8 and TE's WeightGradStore keeps the wgrad GEMM's quantized operands (linear.py,
  // `wgrad_store.put([inputmat_total, grad_output], ...)`): one byte per element, plus the block scales along the wgrad
  // GEMM's K (blockwise: an fp32 per 1 x 128 tile; MXFP8: an E8M0 byte per 32); a per-tensor scale is one float.
  const double scales = x.fp8_recipe == Fp8Recipe::Blockwise ? 4.0 / 128
                        : x.fp8_recipe == Fp8Recipe::Mxfp8   ? 1.0 / 32
                                                             : 0;
  return (1 + scales) * elements;
}

}  // namespace twin::model
