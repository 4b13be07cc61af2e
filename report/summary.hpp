// The numbers of one iteration, computed from a Program and a Timeline (any engine): iteration time, bubble per stage,
// model TFLOP/s per GPU (Narayanan's count), MFU, memory per GPU, and where each stage's time went.
//
// Per-stage numbers come from the stage's representative rank: the first recorded rank of the stage (engines record
// dp = 0, tp = 0 of every stage). The time split partitions [0, iteration time] of that rank's compute stream:
//   compute  a compute op runs on the compute stream
//   tp       a TP collective blocks the compute stream while it moves data (OpSpan::active_s to end_s)
//   dp       a DP / embedding / world collective does, or the compute stream is idle while the DataParallel stream
//            moves data (exposed gradient reduction)
//   pp       the compute stream is idle while a Recv's bytes are arriving (exposed pipeline communication)
//   host     a compute op's predecessors are done but the host has not issued it yet (OpSpan::start_s to active_s:
//            the host paces the GPU, cluster.host_us_per_kernel)
//   bubble   the compute stream is idle or only waits (for a Recv whose data has not left, for the other members of
//            a collective) and nothing of the above is happening: pipeline fill and drain, imbalance
// The compute stream is busy while a compute op runs or a collective on it moves data; bubble_fraction
// (docs/architecture.md) is the rest over the iteration time: pp + host + bubble + exposed dp from the DataParallel
// stream.
#pragma once

#include <array>
#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/program/program.hpp"
#include "report/timeline.hpp"

namespace twin::report {

// Where a rank's iteration goes, each instant counted once, in this order of priority: compute, exposed TP (and
// expert-TP) collectives, exposed context-parallel exchanges (cp), exposed expert token exchanges (ep: the dispatch and
// combine all-to-alls, the counts' all-gather), exposed gradient and optimizer collectives (dp, whatever group they
// reduce over), pipeline transfers, waiting for the host, and the rest (fill/drain).
struct TimeSplit {
  double compute_s = 0;
  double tp_s = 0;
  double cp_s = 0;
  double ep_s = 0;
  double dp_s = 0;
  double pp_s = 0;
  double host_s = 0;
  double bubble_s = 0;
};

// Compute seconds by kernel kind, indexed by model::ComputeKind.
using ComputeByKind = std::array<double, model::kComputeKindCount>;

// The parts of a fused TransformerLayer op (layer granularity) and what each costs, from a cost model: lets a
// summary split such an op by kind. Empty: fused ops stay `transformer_layer`.
using LayerParts = std::function<std::vector<std::pair<model::ComputeKind, double>>(const model::Op& fused)>;

struct StageSummary {
  int stage = 0;
  int rank = 0;                // the rank the numbers come from
  double busy_s = 0;           // compute stream busy (compute ops, collectives on it moving data)
  double idle_s = 0;           // iteration time - busy
  double bubble_fraction = 0;  // idle / iteration time
  TimeSplit split;
  ComputeByKind compute_by_kind{};  // sums to split.compute_s
};

struct MemorySummary {
  double weights_bytes = 0;  // of the stage with the highest peak
  double gradients_bytes = 0;
  double optimizer_bytes = 0;
  double activations_bytes = 0;
  double peak_bytes = 0;      // largest stage
  double capacity_bytes = 0;  // one GPU
  bool fits = false;
};

struct Summary {
  std::string scenario;  // model name
  std::string engine;    // "sim (group fidelity)", "exec (cuda)"
  int gpus = 0;
  int tp = 1, pp = 1, dp = 1;
  int cp = 1;  // context parallel (parallel.cp): printed, and in the JSON, only when > 1
  int ep = 1;  // expert parallel (parallel.ep): its exchanges' share printed only when > 1
  int micro_batches = 0;
  // What `twin compare` checks both sides share: the model's shape, the batch, and the hardware (the scenario's
  // cluster.node, e.g. "dgx-a100" or "cpu-host", or the GPU a simulation ran on when it was another).
  long long layers = 0, hidden = 0, heads = 0, seq_len = 0, global_batch = 0, micro_batch = 0;
  std::string hardware;
  std::string precision;  // "bf16", or with FP8 GEMMs "fp8 hybrid, delayed" (the format, then the recipe)
  double iteration_time_s = 0;
  double bubble_fraction = 0;  // mean over stages
  double model_flops = 0;      // model::reported_flops_per_iteration
  double tflops_per_gpu = 0;   // model_flops / (time * gpus) / 1e12
  double mfu = 0;              // 72-form model FLOPs / (time * gpus * peak)
  double peak_flops_per_gpu = 0;
  MemorySummary memory;
  TimeSplit split;                  // mean over stages, seconds
  ComputeByKind compute_by_kind{};  // mean over stages, seconds
  std::vector<StageSummary> stages;
};

// `peak_flops_per_gpu`: the matrix-multiply peak of one GPU for the scenario's dtype (for MFU). `engine`: a label.
// `gpu_memory_bytes`: capacity of one GPU when it differs from the scenario's node (0: the node's). Stages without a
// recorded rank are skipped (their entries are absent).
// `layer_parts`: splits fused layer ops by kind in compute_by_kind (see LayerParts).
Summary summarize(const model::Program& program, const Timeline& timeline, double peak_flops_per_gpu,
                  const std::string& engine, double gpu_memory_bytes = 0, const LayerParts& layer_parts = {});

// Time split of one recorded rank (see above).
TimeSplit time_split(const model::Program& program, const RankTimeline& rank, double iteration_time_s);

// Compute seconds of one recorded rank by kind: each compute op's end - start (the time split's compute, op by op),
// a fused layer op split among its parts in proportion to their costs when `layer_parts` is given.
ComputeByKind compute_by_kind(const model::Program& program, const RankTimeline& rank,
                              const LayerParts& layer_parts = {});

// The summary as JSON (deterministic: same Summary, same bytes). Keys: iteration_time_s, bubble_fraction,
// tflops_per_gpu, mfu, memory_per_gpu_bytes, memory, time_split, compute_by_kind_s, stages, scenario, engine.
nlohmann::json summary_to_json(const Summary& summary);

// A readable table for the terminal.
std::string summary_table(const Summary& summary);

// Its "compute by kernel" part: the compute share of the iteration by group of kernel kinds (GEMMs, attention core,
// layer norms / residuals / GELU, embedding and loss, optimizer), e.g. "GEMMs 66.9 %, attention core 3.3 %, ...".
std::string compute_by_kernel_line(const Summary& summary);

}  // namespace twin::report
