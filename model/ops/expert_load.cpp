#include "model/ops/expert_load.hpp"

#include <algorithm>
#include <vector>

#include "model/ops/moe_ops.hpp"

namespace twin::model {

bool expert_load_skew_capped(const Scenario& s) {
  if (!s.model.is_moe() || s.model.expert_load_skew <= 0 || s.model.capacity_factor <= 0) return false;
  Scenario balanced = s;
  balanced.model.expert_load_skew = 0;
  const std::vector<double> skewed = ep_rank_row_shares(s), even = ep_rank_row_shares(balanced);
  // Relative slack for the shares' rounding (sums of up to a few hundred doubles).
  return *std::max_element(skewed.begin(), skewed.end()) <= *std::max_element(even.begin(), even.end()) * (1 + 1e-9);
}

}  // namespace twin::model
