#include "exec/interpreter/fp8_state.hpp"

#include <utility>

#include <fmt/core.h>

#include "exec/core/check.hpp"
#include "exec/core/errors.hpp"

namespace twin::exec {

namespace k = twin::kernels::cpu;

namespace {
std::pair<int, int> tensor_key(const model::Op& op) {
  return {op.layer, static_cast<int>(op.what)};
}
}  // namespace

Fp8State::Fp8State(const model::Scenario& scenario)
    : format_(scenario.model.fp8), recipe_(scenario.framework.fp8_recipe) {}

void Fp8State::begin_iteration() {
  weight_scales_.clear();
  forward_scales_.clear();
}

Fp8Operand Fp8State::scaled(bool gradient, float scale) const {
  Fp8Operand operand;
  operand.e5m2 = gradient && format_ == model::Fp8Format::Hybrid;
  operand.scale = scale;
  switch (recipe_) {
    case model::Fp8Recipe::Delayed:
      operand.scaling = Fp8Operand::Scaling::PerTensor;
      break;
    case model::Fp8Recipe::Tensorwise:
      operand.scaling = Fp8Operand::Scaling::Current;
      break;
    case model::Fp8Recipe::Blockwise:
      operand.scaling = Fp8Operand::Scaling::Tiles;
      break;
    case model::Fp8Recipe::Mxfp8:
      operand.scaling = Fp8Operand::Scaling::Mx;
      break;
  }
  return operand;
}

float Fp8State::scale(int layer, model::ComputeKind what, Role role) const {
  const auto it = tensors_.find({layer, static_cast<int>(what)});
  if (it == tensors_.end()) return 1.0f;
  const Tensors& t = it->second;
  return role == Role::Input ? t.input.scale() : role == Role::Weight ? t.weight.scale() : t.gradient.scale();
}

std::vector<Fp8TensorScales> Fp8State::saved() const {
  std::vector<Fp8TensorScales> out;
  for (const auto& [key, t] : tensors_) {
    Fp8TensorScales s;
    s.layer = key.first;
    s.what = key.second;
    std::size_t role = 0;
    for (const k::DelayedScaling* d : {&t.input, &t.weight, &t.gradient}) {
      s.scale[role] = d->scale();
      s.amax_history[role++] = d->amax_history();
    }
    out.push_back(std::move(s));
  }
  return out;
}

void Fp8State::restore(const std::vector<Fp8TensorScales>& saved) {
  tensors_.clear();
  for (const Fp8TensorScales& s : saved) {
    Tensors& t = tensors_[{s.layer, s.what}];
    std::size_t role = 0;
    for (k::DelayedScaling* d : {&t.input, &t.weight, &t.gradient}) {
      if (s.amax_history[role].size() != d->amax_history().size()) {
        throw RunError(
            fmt::format("FP8 delayed scaling of layer {} GEMM {}: an amax history of {} steps, this run "
                        "keeps {}",
                        s.layer, s.what, s.amax_history[role].size(), d->amax_history().size()));
      }
      d->restore(s.amax_history[role], s.scale[role]);
      ++role;
    }
  }
}

Fp8GemmOperands Fp8State::operands(const model::Op& op) {
  Fp8GemmOperands out{scaled(false, 1), scaled(false, 1), scaled(true, 1)};
  if (recipe_ == model::Fp8Recipe::Blockwise) out.weight.scaling = Fp8Operand::Scaling::Blocks;  // 128 x 128
  if (!delayed()) return out;
  const auto key = tensor_key(op);
  const std::tuple<int, int, int> forward_key{op.micro_batch, key.first, key.second};
  if (op.phase == model::Phase::Forward) {
    const auto [weight, fresh] = weight_scales_.try_emplace(key, scale(op.layer, op.what, Role::Weight));
    forward_scales_[forward_key] = ForwardScales{scale(op.layer, op.what, Role::Input), weight->second};
  }
  const auto it = forward_scales_.find(forward_key);
  TWIN_EXEC_CHECK(it != forward_scales_.end(), "layer {}: an FP8 GEMM's {} before its forward", op.layer,
                  model::to_string(op.phase));
  out.input.scale = it->second.input;
  out.weight.scale = it->second.weight;
  out.gradient.scale = scale(op.layer, op.what, Role::OutputGradient);
  return out;
}

void Fp8State::record(const model::Op& op, const Fp8Amaxes& amaxes) {
  if (!delayed() || op.phase == model::Phase::Recompute) return;
  Tensors& t = tensors_[tensor_key(op)];
  if (op.phase == model::Phase::Forward) {
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
  TWIN_EXEC_CHECK(reduced.size() == pending(phase).size(), "FP8 amax update: {} amaxes for {} tensors", reduced.size(),
                  pending(phase).size());
  const float e4m3 = k::fp8_max(k::Fp8Format::E4M3);
  const float gradient_max = k::fp8_max(format_ == model::Fp8Format::Hybrid ? k::Fp8Format::E5M2 : k::Fp8Format::E4M3);
  std::size_t next = 0;
  for (auto& [key, t] : tensors_) {
    if (phase == model::Phase::Forward && t.forward_seen) {
      t.input.record(reduced[next++]);
      t.weight.record(reduced[next++]);
      t.input.update(e4m3);
      t.weight.update(e4m3);
      t.forward_seen = false;
    } else if (phase == model::Phase::Backward && t.backward_seen) {
      t.gradient.record(reduced[next++]);
      t.gradient.update(gradient_max);
      t.backward_seen = false;
    }
  }
}

}  // namespace twin::exec
