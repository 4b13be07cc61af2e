// The trainer's guards: a step's loss and the weights it leaves are checked before anything is built on them (a
// checkpoint, the next step). Every rank holds the same loss (all-reduced for reporting) and the same weight norm
// (all-reduced), so every rank decides alike and the run stops everywhere at the same point.
//
//   loss spike     the step's loss is above kLossSpikeFactor x the median of the last kLossWindow finite losses (the
//                  first step: above kLossSpikeFactor x ln(vocabulary), a uniform guess's loss, where an initialised
//                  model starts). A step's loss is the loss of the weights the step began with: a spike says the
//                  previous step's update (and a checkpoint of it) is bad.
//   weight growth  one step multiplied the global L2 norm of the weights by more than kWeightGrowthLimit (AdamW moves
//                  each weight by about the learning rate per step: a step that doubles the whole model's norm is an
//                  update of the size of the weights themselves), or left it non-finite.
//
// The thresholds are twin's own, not a framework's: far above what a healthy run shows (`twin run gpt-tiny --steps
// 300`, the README's curve: a loss at most 1.073 x the median of the 20 before it, a weight norm growing at most
// 1.0028 x per step; every run of the tests passes them), and low enough that gpt-tiny at learning rate 10 (3000 x
// its own) stops at step 1, where its weights' norm grows 12 x. `--loss-spike-factor` and `--weight-growth-limit`
// change them (0: off).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace twin::exec {

constexpr double kLossSpikeFactor = 3.0;
constexpr int kLossWindow = 20;
constexpr double kWeightGrowthLimit = 2.0;
// --skip-nonfinite: this many skipped steps in a row end the run (nothing changes between them that could make the
// next one finite, unlike a loss scaler, which lowers its scale after each).
constexpr int kMaxConsecutiveSkips = 5;

struct GuardOptions {
  double loss_spike_factor = kLossSpikeFactor;      // 0: no loss-spike guard
  double weight_growth_limit = kWeightGrowthLimit;  // 0: no weight-norm guard (a non-finite norm still stops)
};

class TrainingGuards {
 public:
  // `uniform_loss`: ln(vocabulary); `history`: the losses of the steps before this run (a checkpoint's record).
  TrainingGuards(GuardOptions options, double uniform_loss, const std::vector<double>& history);

  // Why the loss of `step` (1-based in the text) is not sane, or nothing; a sane loss joins the history.
  std::optional<std::string> check_loss(double loss);
  // Why the weights' norm after a step is not sane, or nothing.
  std::optional<std::string> check_weights(double norm_before, double norm_after) const;

 private:
  GuardOptions options_;
  double uniform_loss_;
  std::vector<double> recent_;  // the last kLossWindow finite losses, oldest first
};

}  // namespace twin::exec
