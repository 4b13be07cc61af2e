// The optimizer step's memory traffic: what each framework's optimizer (Megatron-LM's, DeepSpeed's fp16 and
// BF16_Optimizer, Composer's DecoupledAdamW) moves per parameter, with the gradient copies around its DP reduction.
#pragma once

#include "model/ops/op.hpp"
#include "model/scenario/scenario.hpp"

namespace twin::model {

// Bytes of the optimizer step of a rank holding `local_parameters`, of which it updates all, or 1/dp under ZeRO
// (`zero`, over `dp` data-parallel ranks).
double optimizer_step_bytes(const Scenario& s, double local_parameters, int dp, bool zero);
// The optimizer step as a compute op (one memory-bound kernel group).
Op optimizer_step_op(const Scenario& s, double local_parameters, int dp, bool zero);

}  // namespace twin::model
