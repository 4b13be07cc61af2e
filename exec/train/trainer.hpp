// The trainer: runs a Program for N steps on every rank, with data, checkpoints, the loss all-reduce for reporting,
// and the measured timeline of one step.
//
//   train_threads  every rank is a thread of this process (ThreadsWorld): what CI and a laptop run
//   train_rank     this process is one rank of an MPI job (or any Communicator); call it on every rank
//
// Per rank and step: the DataLoader's micro-batches for (step, dp rank) -> Interpreter::run_iteration -> one world
// all-reduce of (loss sum, tokens) so that every rank (rank 0 prints) knows the global mean loss. That all-reduce is
// the executor's own bookkeeping, outside the Program (as Megatron's loss averaging for logging is); the weights'
// squared norm rides along in it. Failures: in train_threads, a rank that throws aborts the world (its peers fail fast
// with a PeerFailure) and the first failing rank's exception is rethrown; ranks that never return after a failure (a
// stuck thread) are named in a RanksStuck, without waiting for them (exec/train/threads_launcher.cpp); in an MPI job the
// failing rank prints its error and aborts the job. A run whose logits, loss or gradient norm become non-finite stops
// with TrainingDiverged naming the step and the rank (or, with skip_nonfinite, skips that update); a step whose loss
// spikes or whose update jumps the weights' norm stops with GuardTripped (exec/train/guards.hpp) before a checkpoint is
// written, and a checkpoint whose weights gave the spike is set aside, so that resuming starts from a good one.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "exec/comm/communicator.hpp"
#include "exec/interpreter/interpreter.hpp"
#include "exec/train/data.hpp"
#include "exec/train/faults.hpp"
#include "exec/train/guards.hpp"
#include "exec/train/straggler.hpp"
#include "model/program/program.hpp"
#include "report/timeline.hpp"

namespace twin::exec {

struct StepReport {
  int step = 0;   // 0-based step just finished
  int steps = 0;  // the run's target
  double loss = 0;
  double grad_norm = 0;
  double learning_rate = 0;
  double iteration_time_s = 0;
  double tokens_per_s = 0;  // this step's
  double weight_norm = 0;   // after the step's update
  bool skipped = false;     // skip_nonfinite: the update was skipped (loss NaN)
  Straggler straggler;      // the rank slowest to compute this step (exec/train/straggler.hpp)
};

struct TrainOptions {
  std::string backend = "cpu";
  int steps = 1;                // train until this many steps are done (a resumed run continues up to it)
  std::string checkpoint_dir;   // empty: no checkpoints
  int checkpoint_every = 0;     // steps between checkpoints; 0: only after the last step
  int keep_checkpoints = 2;     // complete checkpoints kept (older ones are removed; never the last known-good one)
  bool resume = true;           // continue from the newest complete checkpoint in checkpoint_dir
  double comm_timeout_s = 60;   // a collective or recv waiting longer fails, naming the missing ranks
  int threads_per_rank = 0;     // CPU compute threads of each rank; 0: the cores / ranks on this host
  int trace_step = -1;          // step whose ops are timed for the timeline; -1: the run's last step; -2: none
  GuardOptions guards;          // loss-spike and weight-growth limits
  bool skip_nonfinite = false;  // skip an update whose logits, loss or gradients are non-finite, as a loss scaler does
  // Debug, host backends: hold dp_overlap's DP gradient reductions back as the GPU path does, and fail when a kernel
  // touches their memory before the rank waits for them (exec/train/deferred_emulation.hpp, strict mode).
  bool check_deferred_collectives = false;
  std::function<void(const StepReport&)> on_step;   // rank 0, after every step
  std::function<void(const std::string&)> on_note;  // rank 0: what resuming found
  FaultInjection fault;
  SlowRank slow;  // --inject-slow: that rank's compute takes `factor` times as long, every step
};

struct TrainResult {                   // complete on rank 0
  int first_step = 0;                  // steps before it came from a checkpoint
  int steps = 0;                       // the target
  std::vector<double> earlier_losses;  // the checkpoint's record of steps [0, first_step)
  std::vector<double> losses;          // steps [first_step, steps)
  // Mixture-of-Experts: each step's load-balancing loss (coefficient included), summed over the MoE layers and
  // averaged over the global batch's micro-batches; empty for a dense model
  std::vector<double> aux_losses;
  // model.capacity_factor > 0: each step's dropped (token, slot) pairs, summed over the MoE layers and the global batch
  std::vector<long> moe_dropped_slots;
  std::vector<double> iteration_time_s, grad_norms, learning_rates, weight_norms;
  std::vector<int> skipped_steps;            // 0-based steps whose update was skipped (skip_nonfinite)
  // The straggler detector, per step run: the rank slowest to compute (-1 with one rank), the seconds it lagged its
  // peers' median speed, and that lag as a fraction of its peers' time (exec/train/straggler.hpp)
  std::vector<int> slowest_ranks;
  std::vector<double> lag_s, lag_fractions;
  double tokens_per_s = 0;                   // over the run's steps, the first one excluded when there are several
  std::optional<report::Timeline> timeline;  // every rank's ops of the traced step
  int traced_step = -1;
  std::string resumed_from;     // step directory, or empty
  bool resharded = false;       // ... written under another plan, re-sharded into this one
  std::string last_checkpoint;  // step directory written last, or empty
};

// Throws RanksStuck when ranks never returned after the run failed: their threads still reference `program`, `data`
// and `options`, so the caller must end the process (std::_Exit) without destroying them.
TrainResult train_threads(const model::Program& program, const TextDataset& data, const TrainOptions& options);
// `threads_per_rank`: compute threads of this rank (this process holds no other rank).
TrainResult train_rank(const model::Program& program, const TextDataset& data, const TrainOptions& options,
                       Communicator& comm, int threads_per_rank);

// Cores of this host divided among `ranks_on_host` ranks (at least 1).
int default_threads_per_rank(int ranks_on_host);

// One rank's whole run, for the launchers (train_threads, train_rank). `progress` (may be null) is marked before every
// op and step; `threads_launcher`: the rank is a thread (a fault that kills or stops it acts on the thread alone).
void run_rank(const model::Program& program, const TextDataset& data, const TrainOptions& options, Communicator& comm,
              int threads, bool threads_launcher, TrainResult* result, RankProgress* progress);

}  // namespace twin::exec
