// FP8 training as the executor runs it (model.fp8, framework.fp8_recipe): how each FP8 GEMM's operands are quantized,
// and delayed scaling's state (Transformer Engine's DelayedScaling with Megatron-Core's defaults: an amax history of
// one step, the most recent amax, margin 0). Which GEMMs run in FP8 is the Program's (model::runs_in_fp8); the
// recipes' kernels are kernels/cpu/fp8.hpp's.
//   delayed     one scale per tensor, fp8_max / amax of that tensor's previous region (1 until it has one); each
//               region's amaxes are reduced to their maximum at the region's Fp8Amax op and the scales updated
//   tensorwise  one scale per tensor from its own amax
//   blockwise   activations and gradients in 1 x 128 tiles, weights in 128 x 128 blocks, power-of-2 scales
//   mxfp8       32-element blocks with E8M0 scales
// Formats: E4M3 for inputs and weights; output gradients E5M2 under "hybrid", E4M3 under "e4m3".
#pragma once

#include <map>
#include <utility>
#include <vector>

#include "exec/backend.hpp"
#include "kernels/cpu/fp8.hpp"
#include "model/op.hpp"
#include "model/scenario.hpp"

namespace twin::exec {

class Fp8State {
 public:
  enum class Role : unsigned char { Input, Weight, OutputGradient };

  explicit Fp8State(const model::Scenario& scenario);

  bool delayed() const { return recipe_ == model::Fp8Recipe::Delayed; }
  // How `role` of the GEMM `what` of layer `layer` is quantized now.
  Fp8Operand operand(int layer, model::ComputeKind what, Role role) const;
  // Delayed scaling: the amax of what a forward (input, weight) or backward (output gradient) call quantized.
  void record(int layer, model::ComputeKind what, const Fp8Amaxes& amaxes, model::Phase phase);
  // The amaxes recorded in this phase's region since the last update, in one order every rank of a group shares
  // (by layer and GEMM); then, reduced across the group, back, and every scale they belong to updated.
  std::vector<float> pending(model::Phase phase) const;
  void update(model::Phase phase, const std::vector<float>& reduced);

 private:
  struct Tensors {
    kernels::cpu::DelayedScaling input{1, false}, weight{1, false}, gradient{1, false};
    bool forward_seen = false, backward_seen = false;
  };
  model::Fp8Format format_;
  model::Fp8Recipe recipe_;
  std::map<std::pair<int, int>, Tensors> tensors_;  // by (layer, GEMM kind)
};

}  // namespace twin::exec
