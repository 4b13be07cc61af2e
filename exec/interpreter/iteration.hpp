// What one iteration of a rank's op list takes and gives back (Interpreter::run_iteration), and what a launcher may
// hang on it: a progress mark for its watchdog, an observer of every op.
#pragma once

#include <atomic>
#include <vector>

#include "exec/core/micro_batch.hpp"
#include "model/ops/op.hpp"

namespace twin::exec {

// Where a rank is, for a launcher's watchdog on another thread: marked before every op.
struct RankProgress {
  std::atomic<double> at_s{0};  // steady-clock seconds of the last mark
  std::atomic<int> step{-1}, op{-1};
  void mark(int step_now, int op_now);
};

// Told of every op of a rank just before and just after it runs (the traced step's timing ends after op_done):
// exec/train's straggler detector and slow-rank injection (exec/train/straggler.hpp) keep their own clocks.
class OpObserver {
 public:
  virtual ~OpObserver() = default;
  virtual void op_starting(const model::Op& op) = 0;
  virtual void op_done(const model::Op& op) = 0;
};

struct IterationInput {
  int step = 0;                           // 0-based iteration index (learning-rate schedule, Adam step = step + 1)
  std::vector<MicroBatch> micro_batches;  // this DP rank's m micro-batches
  // Skip the update, as a loss scaler does, when the logits, the loss or the gradient norm are non-finite on any rank
  // (the norm's all-reduce carries the verdict to every rank): weights and Adam state stay as they were.
  bool skip_nonfinite = false;
  int poison_after_op = -1;          // fault injection: a NaN after this op (exec/train/faults.hpp, nan); -1: none
  RankProgress* progress = nullptr;  // marked before every op when given
  OpObserver* observer = nullptr;    // told of every op's start and end when given
};

struct IterationOutput {
  double loss_sum = 0;     // sum of the per-token losses this rank counts (last stage, tp rank 0), else 0; NaN when
                           // the logits or the loss were non-finite (skip_nonfinite)
  double loss_tokens = 0;  // how many tokens that sum covers
  double grad_norm = 0;    // global gradient norm before clipping
  double learning_rate = 0;
  bool skipped = false;  // skip_nonfinite: the update was skipped (every rank alike)
  // Mixture-of-Experts: this rank's share of the load-balancing losses (coefficient included) summed over its MoE
  // layers and micro-batches; the shares of all ranks sum to the global batch's (sequence shards add up).
  double aux_loss_sum = 0;
  // model.capacity_factor > 0: the (token, slot) pairs this rank's MoE layers dropped (forward passes, not recompute)
  double moe_dropped_slots = 0;
};

// Measured start and end of one op (seconds since the run's epoch).
struct OpTiming {
  int op_index;
  double start_s, end_s;
};

}  // namespace twin::exec
