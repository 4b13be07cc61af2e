// A cheap lower bound on a plan's iteration time, for pruning a search (`twin search`) before simulating: the
// weight-GEMM work of the busiest pipeline stage at the GPU's fastest GEMM rate, plus the pipeline's fill and drain
// that no schedule of its kind avoids. A closed form: no Program is built.
//
// Why it is a lower bound of what `twin sim` predicts (sim/cost_model.hpp, sim/stage_plan.cpp):
//   - Every weight GEMM (QKV, projection, MLP or routed and shared experts, LM head) is a compute op whose time is at
//     least its FLOPs over `gemm_flops_per_s`, the rate the cost model gives an untiled GEMM (peak x efficiency, the
//     FP8 one where the scenario runs FP8); tile and wave quantization, memory bounds, launches only add. The bound
//     counts no other work: no attention core, no norms, no communication, no optimizer, no selective recompute.
//   - A stage's compute ops run one after another on its compute stream, so the stage is busy for at least the sum.
//     Counted per GPU as the stage's FLOPs over its tp x cp x dp GPUs: every GPU of a stage runs 1/tp of each dense
//     GEMM, and the rank holding the hottest experts runs at least the average expert work (capacity_factor < 1
//     drops tokens: scaled by it).
//   - Fill: a stage's first op waits for micro-batch 0's forward through every virtual stage before its first one.
//     Drain (1F1B, interleaved): its last op is the backward of the last micro-batch on its first chunk, after which
//     that micro-batch's backward (no recompute: it may have run earlier) crosses every earlier virtual stage. Schedules
//     that defer weight gradients (ZB-H1, ZB-V, DualPipeV) may end a stage on a deferred W: no drain is counted.
// With equal stages this is the busiest stage's compute times (1 + (p-1)/(v m)) = 1 / (1 - ideal bubble) of
// model/plan/schedule.hpp; with uneven stages (the embedding, the LM head) it follows each stage's own work.
#pragma once

#include "model/scenario/scenario.hpp"

namespace twin::model {

// Seconds: no simulation of `scenario` on GPUs whose weight GEMMs run at most `gemm_flops_per_s` predicts a shorter
// iteration. Valid for any plan that passes validation.
double iteration_time_lower_bound_s(const Scenario& scenario, double gemm_flops_per_s);

// The weight-GEMM FLOPs one GPU runs for one micro-batch's forward through virtual stage `virtual_stage`: its
// transformer layers and, on the last, the LM head. Backward is twice this; full recompute one more forward.
double virtual_stage_forward_gemm_flops(const Scenario& scenario, std::int64_t virtual_stage);

}  // namespace twin::model
