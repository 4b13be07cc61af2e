#include "exec/train/guards.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/core.h>

namespace twin::exec {

TrainingGuards::TrainingGuards(GuardOptions options, double uniform_loss, const std::vector<double>& history)
    : options_(options), uniform_loss_(uniform_loss) {
  for (double loss : history) {
    if (!std::isfinite(loss)) continue;  // a skipped step's
    recent_.push_back(loss);
    if (recent_.size() > static_cast<std::size_t>(kLossWindow)) recent_.erase(recent_.begin());
  }
}

std::optional<std::string> TrainingGuards::check_loss(double loss) {
  if (options_.loss_spike_factor > 0 && std::isfinite(loss)) {
    std::string reference;
    double limit = 0;
    if (recent_.empty()) {
      limit = options_.loss_spike_factor * uniform_loss_;
      reference = fmt::format("ln(vocabulary) = {:.3f}, a uniform guess's loss", uniform_loss_);
    } else {
      std::vector<double> sorted = recent_;
      std::sort(sorted.begin(), sorted.end());
      const std::size_t n = sorted.size();
      const double median = n % 2 == 1 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
      limit = options_.loss_spike_factor * median;
      reference = fmt::format("{:.4f}, the median of the last {} step{}", median, n, n == 1 ? "" : "s");
    }
    if (loss > limit) {
      return fmt::format("the loss spiked to {:.4g}, above {:g} x {} (--loss-spike-factor)", loss,
                         options_.loss_spike_factor, reference);
    }
  }
  if (std::isfinite(loss)) {
    recent_.push_back(loss);
    if (recent_.size() > static_cast<std::size_t>(kLossWindow)) recent_.erase(recent_.begin());
  }
  return std::nullopt;
}

std::optional<std::string> TrainingGuards::check_weights(double norm_before, double norm_after) const {
  if (!std::isfinite(norm_after)) {
    return fmt::format("the weights' norm became non-finite ({}) after the update", norm_after);
  }
  if (options_.weight_growth_limit > 0 && norm_before > 0 && norm_after > options_.weight_growth_limit * norm_before) {
    return fmt::format(
        "the update multiplied the weights' norm by {:.3g} (from {:.4g} to {:.4g}), more than the limit "
        "of {:g} per step (--weight-growth-limit)",
        norm_after / norm_before, norm_before, norm_after, options_.weight_growth_limit);
  }
  return std::nullopt;
}

}  // namespace twin::exec
