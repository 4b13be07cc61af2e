#include "exec/fp8_state.hpp"

#include <algorithm>

namespace twin::exec {

namespace k = twin::kernels::cpu;

Fp8State::Fp8State(const model::Scenario& scenario)
    : format_(scenario.model.fp8), recipe_(scenario.framework.fp8_recipe) {}

Fp8Operand Fp8State::operand(int layer, model::ComputeKind what, Role role) const {
  Fp8Operand operand;
  operand.e5m2 = role == Role::OutputGradient && format_ == model::Fp8Format::Hybrid;
  switch (recipe_) {
    case model::Fp8Recipe::Delayed: {
      operand.scaling = Fp8Operand::Scaling::PerTensor;
      const auto it = tensors_.find({layer, static_cast<int>(what)});
      if (it != tensors_.end()) {
        const Tensors& t = it->second;
        operand.scale = role == Role::Input ? t.input.scale() : role == Role::Weight ? t.weight.scale()
                                                                                     : t.gradient.scale();
      }
      break;
    }
    case model::Fp8Recipe::Tensorwise:
      operand.scaling = Fp8Operand::Scaling::Current;
      break;
    case model::Fp8Recipe::Blockwise:
      operand.scaling = role == Role::Weight ? Fp8Operand::Scaling::Blocks : Fp8Operand::Scaling::Tiles;
      break;
    case model::Fp8Recipe::Mxfp8:
      operand.scaling = Fp8Operand::Scaling::Mx;
      break;
  }
  return operand;
}

void Fp8State::record(int layer, model::ComputeKind what, const Fp8Amaxes& amaxes, model::Phase phase) {
  if (!delayed() || phase == model::Phase::Recompute) return;  // a recompute reuses its forward's scales
  Tensors& t = tensors_[{layer, static_cast<int>(what)}];
  if (phase == model::Phase::Forward) {
    t.input.record(amaxes.input);
    t.weight.record(amaxes.weight);
    t.forward_seen = true;
  } else {
    t.gradient.record(amaxes.gradient);
    t.backward_seen = true;
  }
}

std::vector<float> Fp8State::pending(model::Phase phase) const {
  std::vector<float> amaxes;
  for (const auto& [key, t] : tensors_) {
    if (phase == model::Phase::Forward && t.forward_seen) {
      amaxes.push_back(t.input.amax_history()[0]);
      amaxes.push_back(t.weight.amax_history()[0]);
    } else if (phase == model::Phase::Backward && t.backward_seen) {
      amaxes.push_back(t.gradient.amax_history()[0]);
    }
  }
  return amaxes;
}

void Fp8State::update(model::Phase phase, const std::vector<float>& reduced) {
  const float e4m3 = k::fp8_max(k::Fp8Format::E4M3);
  const float gradient_max = k::fp8_max(format_ == model::Fp8Format::Hybrid ? k::Fp8Format::E5M2 : k::Fp8Format::E4M3);
  std::size_t next = 0;
  for (auto& [key, t] : tensors_) {
    if (phase == model::Phase::Forward && t.forward_seen) {
      t.input.record(reduced.at(next++));
      t.weight.record(reduced.at(next++));
      t.input.update(e4m3);
      t.weight.update(e4m3);
      t.forward_seen = false;
    } else if (phase == model::Phase::Backward && t.backward_seen) {
      t.gradient.record(reduced.at(next++));
      t.gradient.update(gradient_max);
      t.backward_seen = false;
    }
  }
}

}  // namespace twin::exec
