// The straggler detector: which rank was slower than its peers at each step, and by how much.
//
// Every rank times its own compute ops (StepClock, an OpObserver of the interpreter, in CPU seconds); the trainer
// gathers each rank's (compute, wait) seconds once per step, riding the all-reduce it already makes for the loss, and
// rank 0 calls find_straggler. Ranks of different pipeline stages do different work, so a rank is judged by its speed,
// its compute seconds over its compute FLOPs (the Program's), against the median speed of the other ranks: a stage with
// more work is not a straggler for that. The lag is the seconds it took beyond what the others' median speed would have
// taken for its own work. nvidia-resiliency-ext's straggler detection scores ranks the same way, against the best
// rank's time (its usage guide, "relative performance score").
#pragma once

#include <vector>

#include "exec/interpreter/interpreter.hpp"
#include "exec/train/faults.hpp"

namespace twin::exec {

// A straggler is reported when it lags its peers' median by more than 20 % and 1 ms. 20 %: runs nobody slowed lag by
// 3 to 6 % at the median step and 14 % at the worst (19 steps each of dp 2, pp 2 x dp 2 and tp 2 x dp 2 on a loaded
// 2-core host, threads launcher; docs/executor.md, "Stragglers"), so jitter alone does not trip it, while a GPU
// throttled to 80 % of its clock does. 1 ms: below it a lag is within one time slice of the host's scheduler (Linux
// CFS's minimum granularity is 0.75 to 3 ms), which no one can act on.
inline constexpr double kStragglerLagFraction = 0.2;
inline constexpr double kStragglerMinLag_s = 1e-3;

struct Straggler {
  int rank = -1;            // the slowest rank (-1: a single rank has no peers)
  double compute_s = 0;     // its compute seconds this step
  double lag_s = 0;         // its compute seconds beyond the peers' median speed applied to its work
  double lag_fraction = 0;  // its speed's shortfall: its seconds per FLOP over the peers' median, minus 1
  double peers_wait_s = 0;  // the median of the other ranks' wait seconds (collectives, messages, the loss reduce)
  // The first step a process runs (of several) is its warm-up: first-touch page faults, threads starting, the BLAS's
  // buffers. Its lag is measured and kept, never reported (under `ctest -j2` an even run's warm-up once lagged 1 ms).
  bool warm_up = false;
  bool reported() const {
    return !warm_up && rank >= 0 && lag_fraction > kStragglerLagFraction && lag_s > kStragglerMinLag_s;
  }
};

// `compute_s`, `wait_s`, `work_flops`: per rank (one entry each). A rank with no FLOPs counts its seconds as its work.
Straggler find_straggler(const std::vector<double>& compute_s, const std::vector<double>& wait_s,
                         const std::vector<double>& work_flops);

// Each rank's compute FLOPs per step, from the Program (a rank's list is its stage's).
std::vector<double> compute_flops_per_rank(const model::Program& program);

// One rank's clock: the busy seconds of its compute ops this step, and, when this rank is the slowed one, the injected
// slowdown after each of them (counted as compute: it is what a slow GPU's compute would have taken). Busy seconds
// are the CPU time of the rank's thread (CLOCK_THREAD_CPUTIME_ID), not the wall clock: on a host where ranks share
// cores, a thread the scheduler set aside for a few milliseconds would otherwise look slow, as a GPU's kernel time
// does not when its host is busy. The CPU backend's calling thread works through each parallel loop to its end, so
// its CPU time is the op's length with any thread count. On a device backend it is the host's launch time.
class StepClock : public OpObserver {
 public:
  explicit StepClock(double slow_factor) : slowdown_(slow_factor), slowed_(slow_factor > 1) {}
  void op_starting(const model::Op& op) override;
  void op_done(const model::Op& op) override;
  // The compute seconds since the last call.
  double take_compute_s();

 private:
  ComputeSlowdown slowdown_;
  bool slowed_;
  double op_start_s_ = 0;
  double compute_s_ = 0;
};

}  // namespace twin::exec
