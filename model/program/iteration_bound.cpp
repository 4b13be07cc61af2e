// The bound, stage by stage: each stage's own compute plus the fill before its first chunk and, where the schedule has
// one, the drain after its last backward; the iteration lasts at least the largest.
#include "model/program/iteration_bound.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <utility>
#include <vector>

#include "model/ops/layer_ops.hpp"

namespace twin::model {
namespace {

double to_double(std::int64_t value) { return static_cast<double>(value); }

// Weight-GEMM FLOPs of one token's forward through one transformer layer, over the whole model (before TP): QKV,
// projection, and the dense MLP or the experts a token runs (its top_k routed, at most capacity_factor of their even
// share when tokens are dropped, and the shared ones). The router's [h, E] GEMM is left out (small, and not timed as a
// weight GEMM).
double layer_forward_flops_per_token(const Scenario& s, bool moe_layer) {
  const double h = to_double(s.model.hidden);
  const double attention = 2 * (h * to_double(s.model.qkv_width()) + to_double(s.model.attention_width()) * h);
  if (!moe_layer) return attention + 2 * (h * to_double(s.mlp_up_width()) + to_double(s.ffn_hidden()) * h);
  const double width = to_double(s.moe_ffn_hidden());
  const double up = (s.model.activation == Activation::Swiglu ? 2 : 1) * width;
  const double kept = s.model.capacity_factor > 0 ? std::min(1.0, s.model.capacity_factor) : 1.0;
  const double experts_run = to_double(s.model.top_k) * kept + to_double(s.model.shared_experts);
  return attention + experts_run * 2 * (h * up + width * h);
}

// One GPU's share of one micro-batch's tokens: a dense GEMM's 1/tp, the context's 1/cp (the experts' work on
// average, the busiest EP rank doing at least that).
double tokens_per_gpu(const Scenario& s) {
  return to_double(s.parallel.micro_batch) * to_double(s.model.seq_len) / to_double(s.parallel.tp * std::max<std::int64_t>(1, s.parallel.cp));
}

// One layer's compute for one micro-batch on one GPU.
struct LayerSeconds {
  double forward = 0;
  double backward = 0;  // input and weight gradients (a zero-bubble schedule's B and W)
  double recompute = 0;
};

LayerSeconds by_flops(const Scenario& s, std::int64_t layer, double gemm_flops_per_s) {
  const double forward = layer_forward_flops_per_token(s, s.is_moe_layer(layer)) * tokens_per_gpu(s) / gemm_flops_per_s;
  return {forward, 2 * forward, s.recompute_of_layer(layer) == Recompute::Full ? forward : 0};
}

double compute_stream_seconds(const std::vector<Op>& ops, const ComputeSeconds& compute_s) {
  double seconds = 0;
  for (const Op& op : ops) {
    if (op.kind == OpKind::Compute && op.stream == Stream::Compute) seconds += compute_s(op);
  }
  return seconds;
}

LayerSeconds by_cost_model(const Scenario& s, std::int64_t layer, const ComputeSeconds& compute_s) {
  const int l = static_cast<int>(layer);
  return {compute_stream_seconds(layer_ops(s, l, Phase::Forward), compute_s),
          compute_stream_seconds(layer_ops(s, l, Phase::Backward), compute_s) +
              compute_stream_seconds(layer_ops(s, l, Phase::WeightGrad), compute_s),
          compute_stream_seconds(layer_ops(s, l, Phase::Recompute), compute_s)};
}

}  // namespace

double virtual_stage_forward_gemm_flops(const Scenario& s, std::int64_t virtual_stage) {
  const auto& p = s.parallel;
  double per_token = 0;
  const std::int64_t first = s.first_layer_of_virtual_stage(virtual_stage);
  for (std::int64_t layer = first; layer < first + s.layers_in_virtual_stage(virtual_stage); ++layer) {
    per_token += layer_forward_flops_per_token(s, s.is_moe_layer(layer));
  }
  if (p.ends_route(virtual_stage)) per_token += 2 * to_double(s.model.hidden) * to_double(s.padded_vocab());
  return tokens_per_gpu(s) * per_token;
}

double iteration_time_lower_bound_s(const Scenario& s, double gemm_flops_per_s, const ComputeSeconds& compute_s) {
  const auto& p = s.parallel;
  // A layer's ops depend on it only through whether it has experts and how it is recomputed.
  std::map<std::pair<bool, Recompute>, LayerSeconds> priced;
  const auto layer_seconds = [&](std::int64_t layer) {
    const auto key = std::make_pair(s.is_moe_layer(layer), s.recompute_of_layer(layer));
    auto it = priced.find(key);
    if (it == priced.end()) {
      it = priced.emplace(key, compute_s ? by_cost_model(s, layer, compute_s) : by_flops(s, layer, gemm_flops_per_s))
               .first;
    }
    return it->second;
  };
  const std::int64_t virtual_stages = p.pp * p.virtual_stages;
  std::vector<LayerSeconds> chunk(static_cast<std::size_t>(virtual_stages));  // one micro-batch through each
  for (std::int64_t vs = 0; vs < virtual_stages; ++vs) {
    LayerSeconds& sum = chunk[static_cast<std::size_t>(vs)];
    const std::int64_t first = s.first_layer_of_virtual_stage(vs);
    for (std::int64_t layer = first; layer < first + s.layers_in_virtual_stage(vs); ++layer) {
      const LayerSeconds one = layer_seconds(layer);
      sum.forward += one.forward;
      sum.backward += one.backward;
      sum.recompute += one.recompute;
    }
  }
  const double head_s = 2 * to_double(s.model.hidden) * to_double(s.padded_vocab()) * tokens_per_gpu(s) / gemm_flops_per_s;
  for (std::int64_t vs = 0; vs < virtual_stages; ++vs) {
    if (!p.ends_route(vs)) continue;
    chunk[static_cast<std::size_t>(vs)].forward += head_s;
    chunk[static_cast<std::size_t>(vs)].backward += 2 * head_s;
  }
  const bool drains = p.schedule == ScheduleKind::GPipe || p.schedule == ScheduleKind::OneFOneB ||
                      p.schedule == ScheduleKind::Interleaved;
  // Each chunk runs every micro-batch, or in DualPipe its direction's half.
  const double m = to_double(p.micro_batches()) / (p.bidirectional() ? 2.0 : 1.0);
  double bound = 0;
  for (std::int64_t stage = 0; stage < p.pp; ++stage) {
    double busy = 0;
    double fill_and_drain = std::numeric_limits<double>::infinity();  // the chunk reached first: its route so far
    for (std::int64_t c = 0; c < p.virtual_stages; ++c) {
      const std::int64_t vs = p.virtual_stage(stage, c);
      const LayerSeconds& one = chunk[static_cast<std::size_t>(vs)];
      busy += m * (one.forward + one.backward + one.recompute);
      double before = 0;
      for (std::int64_t earlier = vs - vs % p.route_length(); earlier < vs; ++earlier) {
        const LayerSeconds& on_the_way = chunk[static_cast<std::size_t>(earlier)];
        before += on_the_way.forward + (drains ? on_the_way.backward : 0);
      }
      fill_and_drain = std::min(fill_and_drain, before);
    }
    bound = std::max(bound, busy + fill_and_drain);
  }
  return bound;
}

}  // namespace twin::model
