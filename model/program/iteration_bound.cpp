// The bound, stage by stage: each stage's own GEMM work plus the fill before its first chunk and, where the schedule
// has one, the drain after its last backward; the iteration lasts at least the largest.
#include "model/program/iteration_bound.hpp"

#include <algorithm>

namespace twin::model {
namespace {

double d(std::int64_t value) { return static_cast<double>(value); }

// Weight-GEMM FLOPs of one token's forward through one transformer layer, over the whole model (before TP): QKV,
// projection, and the dense MLP or the experts a token runs (its top_k routed, at most capacity_factor of their even
// share when tokens are dropped, and the shared ones). The router's [h, E] GEMM is left out (small, and not timed as a
// weight GEMM).
double layer_forward_flops_per_token(const Scenario& s, bool moe_layer) {
  const double h = d(s.model.hidden);
  const double attention = 2 * (h * d(s.model.qkv_width()) + d(s.model.attention_width()) * h);
  if (!moe_layer) return attention + 2 * (h * d(s.mlp_up_width()) + d(s.ffn_hidden()) * h);
  const double width = d(s.moe_ffn_hidden());
  const double up = (s.model.activation == Activation::Swiglu ? 2 : 1) * width;
  const double kept = s.model.capacity_factor > 0 ? std::min(1.0, s.model.capacity_factor) : 1.0;
  const double experts_run = d(s.model.top_k) * kept + d(s.model.shared_experts);
  return attention + experts_run * 2 * (h * up + width * h);
}

}  // namespace

double virtual_stage_forward_gemm_flops(const Scenario& s, std::int64_t virtual_stage) {
  const auto& p = s.parallel;
  // One micro-batch's tokens, split over the stage's tp x cp GPUs (a dense GEMM's 1/tp each; the experts' work on
  // average, the busiest EP rank doing at least that).
  const double tokens = d(p.micro_batch) * d(s.model.seq_len);
  double per_token = 0;
  const std::int64_t first = s.first_layer_of_virtual_stage(virtual_stage);
  for (std::int64_t layer = first; layer < first + s.layers_in_virtual_stage(virtual_stage); ++layer) {
    per_token += layer_forward_flops_per_token(s, s.is_moe_layer(layer));
  }
  if (virtual_stage == p.pp * p.virtual_stages - 1) per_token += 2 * d(s.model.hidden) * d(s.padded_vocab());
  return tokens * per_token / d(p.tp * std::max<std::int64_t>(1, p.cp));
}

double iteration_time_lower_bound_s(const Scenario& s, double gemm_flops_per_s) {
  const auto& p = s.parallel;
  const std::int64_t virtual_stages = p.pp * p.virtual_stages;
  std::vector<double> forward_s(static_cast<std::size_t>(virtual_stages));
  for (std::int64_t vs = 0; vs < virtual_stages; ++vs) {
    forward_s[static_cast<std::size_t>(vs)] = virtual_stage_forward_gemm_flops(s, vs) / gemm_flops_per_s;
  }
  // The recomputed layers' forward: priced at the cheapest layer's, since which layers they are does not matter here.
  double cheapest_layer_s = layer_forward_flops_per_token(s, false);
  if (s.model.is_moe()) cheapest_layer_s = std::min(cheapest_layer_s, layer_forward_flops_per_token(s, true));
  cheapest_layer_s *= d(p.micro_batch) * d(s.model.seq_len) / d(p.tp * std::max<std::int64_t>(1, p.cp)) /
                      gemm_flops_per_s;
  const bool drains = p.schedule == ScheduleKind::GPipe || p.schedule == ScheduleKind::OneFOneB ||
                      p.schedule == ScheduleKind::Interleaved;
  const double m = d(p.micro_batches());
  double bound = 0;
  for (std::int64_t stage = 0; stage < p.pp; ++stage) {
    double busy = d(s.recomputed_layers_on_stage(stage)) * cheapest_layer_s * m;
    std::int64_t first_chunk = virtual_stages;
    for (std::int64_t chunk = 0; chunk < p.virtual_stages; ++chunk) {
      const std::int64_t vs = p.virtual_stage(stage, chunk);
      busy += 3 * forward_s[static_cast<std::size_t>(vs)] * m;  // forward, and backward twice it
      first_chunk = std::min(first_chunk, vs);
    }
    double fill = 0;
    for (std::int64_t vs = 0; vs < first_chunk; ++vs) fill += forward_s[static_cast<std::size_t>(vs)];
    bound = std::max(bound, busy + (drains ? 3 : 1) * fill);  // the drain's backward: twice the fill's forward
  }
  return bound;
}

}  // namespace twin::model
