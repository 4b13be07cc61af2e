// Goodput at scale: what a training run delivers per wall-clock hour once interruptions, checkpoints and restarts
// are counted (`twin goodput`, and `--goodput` of sim, search and sweep).
//
// The model (Young, "A first order approximation to the optimum checkpoint interval", CACM 1974; Daly, "A higher
// order estimate of the optimum checkpoint interval for restart dumps", FGCS 2006): interruptions of the whole job
// arrive as a Poisson process of rate lambda = the per-GPU-hour rates (one per component) x the job's GPUs, while it
// trains. Training runs in segments of `interval_s` of useful work followed by a checkpoint that training waits
// `blocking_s` for; an interruption loses the work since the last checkpoint that reached storage and costs
// `restart_s` (re-queue, start, communicators) plus the checkpoint's load. Interruptions during a restart are not
// counted (they would lengthen it; at Llama 3's rate one restart of 10 minutes meets one with probability 5 %).
//
//   blocking checkpoints: a segment is T = interval + blocking long and must survive whole; its expected wall time is
//     E = (e^{lambda T} - 1) (1/lambda + R)          (exact for this process; R = restart + load)
//   asynchronous (Megatron-Core's --async-save): training waits only for the snapshot to host memory; the write to
//     storage (`commit_s`) runs under the next segment, and an interruption before it lands loses that segment too:
//     E ~= (e^{lambda T} - 1) (1/lambda + R + commit)  (first order in lambda x commit)
//   goodput = interval / E; the optimal interval minimises E / interval (found numerically; Young's sqrt(2 C M) and
//   Daly's higher-order form are reported beside it, M = 1/lambda).
//
// goodput_monte_carlo draws the same process (seeded) and reports its mean and spread; for blocking checkpoints its
// mean converges to the closed form above.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/scenario/scenario.hpp"

namespace twin::model {

// Interruptions per GPU-hour of the job, by the component that caused them.
struct FailureRates {
  double gpu = 0;       // the GPU, its HBM and SRAM, its system processor, silent data corruption, thermal
  double host = 0;      // host maintenance, SSD, power supply, chassis, IO board, CPU, system memory
  double nic = 0;       // the compute NIC
  double network = 0;   // switches and cables
  double software = 0;  // software bugs, dependencies, NCCL watchdog timeouts
  double total() const { return gpu + host + nic + network + software; }
};

// The cited defaults: Llama 3 405B's 419 unexpected interruptions in 54 days on 16,384 H100 (Llama Team, "The Llama 3
// Herd of Models", arXiv:2407.21783, sec. 3.3.4, Table 5), by component, over its 54 x 24 x 16,384 GPU-hours.
FailureRates llama3_failure_rates();
// The scenario's: each cluster.*_failures_per_gpu_hour given, else its default.
FailureRates failure_rates(const Scenario& scenario);

// The checkpoint of a run: every parameter's weights in the model's dtype and its optimizer state (fp32 master copy
// when the weights are 16-bit, Adam's m and v: Megatron-Core's distributed checkpoint saves these; gradients are not
// saved), and how long writing, loading and the snapshot to host memory take.
struct CheckpointCost {
  double bytes = 0;                // the whole job's
  double storage_bytes_per_s = 0;  // the job's aggregate write and read rate
  double write_s = 0;              // bytes / storage rate
  double load_s = 0;               // the same, read back at restart
  double snapshot_s = 0;           // the largest GPU's share of the state, copied to host memory
  bool async = false;              // framework.async_checkpoint
  double blocking_s() const { return async ? snapshot_s : write_s; }
  double commit_s() const { return async ? write_s : 0; }  // after the blocking part, until it is on storage
};
// `host_copy_bytes_per_s`: one GPU's link to host memory, per direction (topology::host_link_bytes_per_s).
CheckpointCost checkpoint_cost(const Scenario& scenario, double host_copy_bytes_per_s);
// The default storage rate: Llama 3's Tectonic sustained 2 TB/s for 16,384 GPUs (sec. 3.3.1), scaled to the job's
// GPUs (a storage system is sized with its cluster).
double default_storage_bytes_per_s(const Scenario& scenario);
// The default restart time (cluster.restart_s unset).
double default_restart_s();

// What the closed form and the Monte Carlo need: numbers only.
struct GoodputInputs {
  double iteration_time_s = 0;
  double gpus = 0;
  double failures_per_gpu_hour = 0;
  double blocking_s = 0;  // C: training waits this long per checkpoint
  double commit_s = 0;    // asynchronous: the write after the blocking part
  double restart_s = 0;   // R: from an interruption to training again, the checkpoint's load included
  double interval_s = 0;  // useful work between checkpoints; 0: the optimal one
};
GoodputInputs goodput_inputs(const Scenario& scenario, double iteration_time_s, const CheckpointCost& checkpoint);

struct GoodputEstimate {
  double failures_per_day = 0;
  double mtbf_s = 0;                        // M = 1 / lambda (infinite without failures)
  double interval_s = 0;                    // the interval evaluated (the optimal one unless given)
  double optimal_interval_s = 0;            // minimises the expected wall time per useful second
  double young_interval_s = 0;              // sqrt(2 C M)
  double daly_interval_s = 0;               // Daly 2006, eq. 20 (C < 2M), else M
  double goodput_fraction = 1;              // useful training time over wall time
  double lost_work_per_failure_s = 0;       // work redone after an interruption, on average
  double downtime_per_failure_s = 0;        // restart and load
  double checkpoint_overhead_fraction = 0;  // of the wall time, waiting for checkpoints
  double failure_loss_fraction = 0;         // of the wall time, lost work and restarts
};
// Throws std::invalid_argument on inputs that are not numbers of their kind (a non-positive iteration time, ...).
GoodputEstimate goodput_closed_form(const GoodputInputs& inputs);

// The expected wall time of one segment of `interval_s` useful seconds (the closed form above).
double expected_segment_s(const GoodputInputs& inputs, double interval_s);

struct MonteCarloGoodput {
  int trials = 0;
  double goodput_fraction = 0;  // total useful time over total wall time, over every trial
  double confidence95 = 0;      // half-width of its 95 % interval (delta method over the trials' wall times)
  double wall_s_mean = 0, wall_s_stddev = 0, wall_s_p05 = 0, wall_s_p95 = 0;  // one trial's wall time
  double failures_mean = 0;                                                   // interruptions per trial
};
// `trials` runs of `useful_s` of training each (the interval: inputs.interval_s, or the optimal one), drawn from
// `seed` (the same seed draws the same uniform numbers on any machine: std::mt19937_64, whose output the standard
// fixes, and inverse-transform sampling instead of a library distribution).
MonteCarloGoodput goodput_monte_carlo(const GoodputInputs& inputs, double useful_s, int trials, std::uint64_t seed);

}  // namespace twin::model
