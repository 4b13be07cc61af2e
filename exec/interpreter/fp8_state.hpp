// FP8 training as the executor runs it (model.fp8, framework.fp8_recipe): how each FP8 GEMM's operands are quantized,
// and delayed scaling's state. Which GEMMs run in FP8 is the Program's (model::runs_in_fp8); the recipes' kernels are
// kernels/cpu/fp8.hpp's.
//   delayed     one scale per tensor, fp8_max / amax of that tensor in its previous region (1 until it has one): each
//               region's amaxes are reduced to their maximum over the amax group at the region's Fp8Amax op, and the
//               scales updated. Transformer Engine's DelayedScaling (transformer_engine/common/recipe/__init__.py:
//               margin 0, amax_history_len, amax_compute_algo) as Megatron-Core configures it: an amax history of one
//               step, the most recent amax, margin 0 (megatron/core/transformer/transformer_config.py:
//               fp8_amax_history_len = 1, fp8_amax_compute_algo = "most_recent", fp8_margin = 0).
//   tensorwise  one scale per tensor from its own amax (Float8CurrentScaling)
//   blockwise   activations and gradients in 1 x 128 tiles, weights in 128 x 128 blocks, power-of-2 scales
//   mxfp8       32-element blocks with E8M0 scales
// Formats: E4M3 for inputs and weights; output gradients E5M2 under "hybrid", E4M3 under "e4m3".
//
// Which scale a delayed-scaling GEMM uses when: Transformer Engine casts a GEMM's weight to FP8 once per iteration,
// at the first micro-batch (Megatron-Core passes is_first_microbatch), and keeps the FP8 copies a forward made for its
// backward (and for a recompute of it). So a micro-batch's backward (or recompute) reads the input and weight scales
// its forward used, whatever regions have updated them since; only the output gradient takes the scale of now.
#pragma once

#include <array>
#include <map>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "exec/core/backend.hpp"
#include "kernels/cpu/fp8.hpp"
#include "model/ops/op.hpp"
#include "model/scenario/scenario.hpp"

namespace twin::exec {

// The operands of one FP8 GEMM call: input and weight (forward, recompute, backward), output gradient (backward).
struct Fp8GemmOperands {
  Fp8Operand input, weight, gradient;
};

// A routed expert's GEMM has tensors of its own (Transformer Engine's GroupedLinear: one quantizer per expert), keyed
// by kExpertTensors + 2 x its global expert index (+ 1 for its down projection) where a layer's GEMM is keyed by its
// model::ComputeKind.
inline constexpr int kExpertTensors = 1000;

// Delayed scaling's state of one GEMM's three tensors between iterations (what a checkpoint keeps,
// exec/checkpoint/fp8.hpp): by role (input, weight, output gradient) its scale and its amax history.
struct Fp8TensorScales {
  int layer = 0;  // global layer index
  int what = 0;   // model::ComputeKind of the GEMM, or a routed expert's key (kExpertTensors)
  std::array<float, 3> scale{1, 1, 1};
  std::array<std::vector<float>, 3> amax_history;
  bool operator==(const Fp8TensorScales&) const = default;
};

class Fp8State {
 public:
  explicit Fp8State(const model::Scenario& scenario);

  bool delayed() const { return recipe_ == model::Fp8Recipe::Delayed; }
  // A new iteration: the FP8 weight copies are made again (at each weight's first forward).
  void begin_iteration();
  // How the GEMM of compute op `op` (its layer, GEMM kind, micro-batch and phase) quantizes its operands now;
  // `expert` >= 0: the GEMM of that global routed expert within the op (ExpertUp, ExpertDown).
  Fp8GemmOperands operands(const model::Op& op, int expert = -1);
  // Delayed scaling: the amaxes of what the GEMM of `op` quantized (a recompute records nothing: it repeats its
  // forward's casts).
  void record(const model::Op& op, const Fp8Amaxes& amaxes, int expert = -1);
  // Delayed scaling: `op` (ExpertUp, ExpertDown) ran this rank's experts [first, first + count) of its layer, whatever
  // rows they had.
  void experts_ran(const model::Op& op, int first, int count);
  // The amaxes recorded in this phase's region since the last update, in one order every rank of an amax group
  // shares (by layer and GEMM; each layer whose experts ran lists every global expert's amaxes and whether it saw a
  // row, 0 for those this rank does not hold or that saw none, so that ranks holding other experts line up); then,
  // reduced across the group, back, and every scale they belong to updated (a held expert's wherever a replica of it
  // saw rows).
  std::vector<float> pending(model::Phase phase) const;
  void update(model::Phase phase, const std::vector<float>& reduced);
  // Delayed scaling: the scale `role` of the GEMM `what` of layer `layer` would take now (1 before any update).
  enum class Role : unsigned char { Input, Weight, OutputGradient };
  float scale(int layer, model::ComputeKind what, Role role) const;
  // Delayed scaling's state between iterations, by (layer, GEMM kind), and back: restore() replaces every tensor's
  // state with `saved`'s (a history of another length than this recipe's is an error naming the tensor).
  std::vector<Fp8TensorScales> saved() const;
  void restore(const std::vector<Fp8TensorScales>& saved);

 private:
  struct Tensors {
    // Megatron-Core's defaults: history of one step, the most recent amax, margin 0 (see above)
    kernels::cpu::DelayedScaling input{1, false, 0}, weight{1, false, 0}, gradient{1, false, 0};
    bool forward_seen = false, backward_seen = false;
  };
  struct ForwardScales {
    float input = 1, weight = 1;
  };
  Fp8Operand scaled(bool gradient, float scale) const;
  float scale_of(const std::pair<int, int>& key, Role role) const;  // scale(), by the tensors' key
  // The tensors pending() lists in its order: a layer GEMM's this rank saw in the region; every global expert's of a
  // layer whose experts ran, with whether this rank holds it and saw it.
  struct PendingKey {
    std::pair<int, int> key;
    bool expert = false, held = true, seen = true;
  };
  std::vector<PendingKey> pending_keys(model::Phase phase) const;

  model::Fp8Format format_;
  model::Fp8Recipe recipe_;
  std::map<std::pair<int, int>, Tensors> tensors_;                     // by (layer, GEMM kind)
  std::map<std::pair<int, int>, float> weight_scales_;                 // this iteration's FP8 weight copies' scales
  std::map<std::tuple<int, int, int>, ForwardScales> forward_scales_;  // by (micro-batch, layer, GEMM kind)
  int experts_ = 0;                                                     // model.experts: routed experts a layer
  std::array<std::set<int>, 2> expert_layers_;  // layers whose experts ran in the open forward, backward region
  std::set<int> held_experts_;                   // the global experts this rank holds
};

}  // namespace twin::exec
