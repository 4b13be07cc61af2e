// A cheap lower bound on a plan's iteration time, for pruning a search (`twin search`) before simulating: the compute
// of the busiest pipeline stage, plus the pipeline's fill and drain that no schedule of its kind avoids. No Program is
// built: one micro-batch's ops of each layer at most.
//
// Each transformer layer's forward, backward and recompute for one micro-batch are priced either by their weight-GEMM
// FLOPs at `gemm_flops_per_s` (the closed form) or, tighter, by the cost model's own seconds for each of the layer's
// compute ops (layer_ops, model/ops/layer_ops.hpp: every kernel, the attention core and the elementwise passes
// included); the LM head by its FLOPs.
//
// Why it is a lower bound of what `twin sim` predicts (sim/cost_model.hpp, sim/stage_plan.cpp):
//   - A compute op of the Program lasts what the cost model says (`compute_s`); a weight GEMM at least its FLOPs over
//     `gemm_flops_per_s`, the rate the cost model gives an untiled GEMM (peak x efficiency, the FP8 one where the
//     scenario runs FP8): tile and wave quantization, memory bounds, launches only add. Nothing else is counted: no
//     communication, no embedding or loss, no optimizer.
//   - A stage's compute ops run one after another on its compute stream, so the stage is busy for at least the sum.
//     Per GPU: every GPU of a stage runs 1/tp of each dense GEMM; by FLOPs, the experts' average work, which the rank
//     holding the hottest experts at least runs (capacity_factor < 1 drops tokens: scaled by it); by the cost model,
//     that rank's own (rank fidelity scales only the others' expert GEMMs down).
//   - Fill: a stage's first op waits for micro-batch 0's forward through every virtual stage before its first one.
//     Drain (1F1B, interleaved): its last op is the backward of the last micro-batch on its first chunk, after which
//     that micro-batch's backward (no recompute: it may have run earlier) crosses every earlier virtual stage. Schedules
//     that defer weight gradients (ZB-H1, ZB-V, DualPipeV, DualPipe) may end a stage on a deferred W: no drain is
//     counted.
// With equal stages this is the busiest stage's compute times (1 + (p-1)/(v m)) = 1 / (1 - ideal bubble) of
// model/plan/schedule.hpp; with uneven stages (the embedding, the LM head) it follows each stage's own work.
#pragma once

#include <functional>

#include "model/ops/op.hpp"
#include "model/scenario/scenario.hpp"

namespace twin::model {

// Seconds the cost model gives compute op `op` of the scenario's Program (sim/'s, handed in: model/ does not know it).
using ComputeSeconds = std::function<double(const Op& op)>;

// Seconds: no simulation of `scenario` on GPUs whose weight GEMMs run at most `gemm_flops_per_s` predicts a shorter
// iteration. With `compute_s`, each layer's compute ops priced by it (tighter); without, by their GEMM FLOPs. Valid for
// any plan that passes validation.
double iteration_time_lower_bound_s(const Scenario& scenario, double gemm_flops_per_s,
                                    const ComputeSeconds& compute_s = nullptr);

// The weight-GEMM FLOPs one GPU runs for one micro-batch's forward through virtual stage `virtual_stage`: its
// transformer layers and, on the last, the LM head. Backward is twice this; full recompute one more forward.
double virtual_stage_forward_gemm_flops(const Scenario& scenario, std::int64_t virtual_stage);

}  // namespace twin::model
