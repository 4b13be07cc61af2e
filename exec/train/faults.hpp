// Fault injection: one fault at one rank and step, for the fault-injection suite (tests/faults) and for anyone who
// wants to see what twin does when a rank dies, stops, slows down or raises, a checkpoint write is cut short, or a NaN
// appears. `twin run` reads it from the environment (docs/executor.md, "Fault injection"):
//
//   TWIN_FAULT=MODE:rank=R,step=S[,op=N][,seconds=X][,file=NAME]      (step 1-based, as messages count)
//
//   throw   rank R raises at the start of step S
//   kill    rank R dies at the start of step S: its thread ends without a word (threads), its process gets SIGKILL
//   (MPI) stop    rank R stops at the start of step S and never goes on: its thread blocks forever (threads), its
//   process
//           gets SIGSTOP (MPI)
//   slow    rank R sleeps X seconds at the start of step S
//   nan     after op N of rank R's list at step S, a NaN in the first element of the residual stream of the op's
//           micro-batch (forward, recompute), of its gradient (backward), or of the op's gradient bucket (other ops)
//   kill-writing   the process gets SIGKILL half-way through writing checkpoint file NAME (rank-00001.bin,
//           manifest.json) of step S, as a power cut or the out-of-memory killer would end it (rank ignored)
#pragma once

#include <string>
#include <string_view>

namespace twin::exec {

struct FaultInjection {
  enum class Mode { None, Throw, Kill, Stop, Slow, Nan, KillWriting };
  Mode mode = Mode::None;
  int rank = -1;
  int step = -1;  // 0-based
  int op = -1;    // nan: the op's index in the rank's list
  double seconds = 0;
  std::string file;  // kill-writing: the checkpoint file's name

  bool at(int rank_now, int step_now) const { return mode != Mode::None && rank == rank_now && step == step_now; }
};

// `twin run --inject-slow RANK:FACTOR`: that rank's compute takes FACTOR times as long, as a throttled or degraded
// GPU's would (its collectives and messages do not: the others wait for it there). Beside the one-step faults above:
// it lasts the whole run.
struct SlowRank {
  int rank = -1;  // -1: none
  double factor = 1;
  bool at(int rank_now) const { return rank >= 0 && rank == rank_now && factor > 1; }
};

// What makes a compute op FACTOR times as long: after an op of `seconds`, (FACTOR - 1) x seconds more, slept. A sleep
// overshoots by the timer's slack (about 50 us on Linux) however short it is asked to be, and a small model's ops last
// microseconds: so the time owed is kept as a balance and slept once it reaches kMinSleep_s, and the rank's compute
// comes out FACTOR times as long over a step (at least; by the host's wake-up latency more), not per op.
class ComputeSlowdown {
 public:
  explicit ComputeSlowdown(double factor) : factor_(factor) {}
  // Returns the seconds slept now.
  double after_compute(double seconds);

 private:
  static constexpr double kMinSleep_s = 1e-3;  // 20 x the timer slack: the overshoot stays a few percent of a sleep
  double factor_;
  double owed_s_ = 0;
};

// Parses TWIN_FAULT's syntax; throws RunError naming what is wrong.
FaultInjection parse_fault(std::string_view spec);

// The fault `TWIN_FAULT` asks for (Mode::None when it is unset or empty).
FaultInjection fault_from_environment();

// Blocks the calling thread for good (a stopped rank of the threads launcher).
[[noreturn]] void block_forever();

}  // namespace twin::exec
