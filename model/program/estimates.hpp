// Closed-form estimates of a GPT model under a plan: parameters per GPU, model FLOPs per iteration, memory per GPU
// (the counts they start from: model/plan/parameters.hpp).
// Sources:
//   FLOPs: Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
//          SC'21, eq. (3): F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) with full recompute,
//          72 B s l h^2 (1 + s/(6h) + V/(12 l h)) without.
//   Activations: Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models", MLSys'23,
//          Table 2: s b h (10 + 24/t + 5 a s/(h t)) bytes per layer with TP t; s b h (34 + 5 a s/h)/t with sequence
//          parallelism; selective recompute drops the 5 a s/h term; full recompute keeps only the 2 s b h input.
//   Model state: mixed-precision Adam, 20 bytes per parameter (below), ZeRO-1 (Rajbhandari et al., SC'20) shards the
//          12 optimizer bytes across DP.
#pragma once

#include <cstdint>
#include <vector>

#include "model/plan/parameters.hpp"

namespace twin::model {

// Parameters one GPU of `stage` holds (its shard under TP; the tied head's copy of the word embedding counts on the
// last stage when pp > 1).
double parameters_per_gpu(const Scenario& scenario, int stage);

// Of transformer layer `layer`'s parameters on one GPU, the GEMM weights Transformer Engine holds in FP8 under
// framework.fp8_param_gather: the attention's QKV and projection weights, and the dense MLP's (a Mixture-of-Experts
// layer's routed experts are all GEMM weights, counted apart: expert_parameters_per_gpu).
double layer_fp8_weights_per_gpu(const Scenario& scenario, std::int64_t layer);

// Narayanan's model FLOPs per iteration. `with_recompute` selects the 96 (counting the recomputed forward) or the
// 72 prefix. Papers quote TFLOP/s per GPU with the scenario's own recompute; MFU uses the 72 form.
double model_flops_per_iteration(const Scenario& scenario, bool with_recompute);
// The form papers use to quote TFLOP/s: 96 when the scenario recomputes fully, else 72.
double reported_flops_per_iteration(const Scenario& scenario);

// Bytes of model state per parameter, as the framework keeps it through the backward pass (the optimizer's bytes are
// those ZeRO-1 shards across DP):
//   fp32: weights 4, gradients 4, optimizer 8 (Adam m and v) = 16;
//   Megatron-LM with bf16 (gradients accumulate in an fp32 main-grad buffer; the bf16 .grad is freed by the hook that
//     adds it in): weights 2, gradients 4, optimizer 12 (fp32 master weights, m, v) = 18, or 6 + 12/d distributed;
//   Megatron-LM with fp16 (gradients in fp16; the optimizer's fp32 copies of them): 2, 2, 16 = 20, or 4 + 16/d
//     (NVIDIA/Megatron-LM docs/distrib_optimizer.md, May 2022: 18, 20, 16 and 6 + 12/d, 4 + 16/d, 8 + 8/d);
//   DeepSpeed v0.5 (16-bit .grad; its ZeRO-1 keeps fp32 master weights, their gradient partition, m and v:
//     runtime/zero/stage2.py, single_partition_of_fp32_groups): 2, 2, 16;
//   DeepSpeed's BF16_Optimizer (bf16 .grad and an fp32 copy of every gradient, runtime/bf16_optimizer.py; fp32 master
//     weights, m and v sharded): 2, 6, 12.
struct StateBytesPerParameter {
  double weights = 0;
  double gradients = 0;
  double optimizer = 0;
};
StateBytesPerParameter state_bytes_per_parameter(const Scenario& scenario);

struct StageMemory {
  int stage = 0;
  double parameters = 0;          // per GPU
  double weights_bytes = 0;
  double gradients_bytes = 0;
  double optimizer_bytes = 0;     // divided by dp under ZeRO-1
  double activations_bytes = 0;   // stashed activations at the schedule's peak, plus the working set
  int in_flight_micro_batches = 0;  // most (micro-batch, chunk) pairs stashed at once
  double peak_bytes = 0;          // sum of the above
};

struct MemoryEstimate {
  std::vector<StageMemory> stages;
  double capacity_bytes = 0;      // one GPU's memory
  double peak_bytes = 0;          // largest stage
  bool fits = false;              // peak_bytes <= capacity_bytes
};
MemoryEstimate estimate_memory(const Scenario& scenario);
// What a zero-bubble schedule's deferred W of layer `layer` keeps for one micro-batch: its linear layers' inputs and
// output gradients (an MoE layer's attention's two), in the model dtype.
double deferred_weight_grad_bytes(const Scenario& scenario, int layer);

// Korthikanti's activation bytes of one transformer layer for one micro-batch as stashed between its forward and
// backward, under the scenario's TP, sequence parallelism and recompute mode.
double activation_bytes_per_layer(const Scenario& scenario);
// Bytes one layer holds while it runs (what recompute rebuilds before a backward): the no-recompute formula.
double layer_working_set_bytes(const Scenario& scenario);
// The same two for a Mixture-of-Experts layer: the dense MLP's stash replaced by what Megatron-Core's MoE layer keeps
// for its backward, per micro-batch on the EP rank holding the hottest experts (formulas.cpp says what).
double moe_activation_bytes_per_layer(const Scenario& scenario);
double moe_layer_working_set_bytes(const Scenario& scenario);

}  // namespace twin::model
