// What a zero-bubble schedule's deferred W keeps (estimates.hpp), from the op shapes the executor keeps them in.
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
  return x.e * elements;
}

}  // namespace twin::model
