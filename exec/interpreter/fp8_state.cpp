#include "exec/interpreter/fp8_state.hpp"

#include <utility>

#include <fmt/core.h>

#include "exec/core/check.hpp"
#include "exec/core/errors.hpp"

namespace twin::exec {

namespace k = twin::kernels::cpu;

namespace {
std::pair<int, int> tensor_key(const model::Op& op, int expert) {
  if (expert < 0) return {op.layer, static_cast<int>(op.what)};
  return {op.layer, kExpertTensors + 2 * expert + (op.what == model::ComputeKind::ExpertDown ? 1 : 0)};
}

std::size_t region(model::Phase phase) {
  return phase == model::Phase::Forward ? 0 : 1;
}
}  // namespace

Fp8State::Fp8State(const model::Scenario& scenario)
    : format_(scenario.model.fp8),
      recipe_(scenario.framework.fp8_recipe),
      experts_(static_cast<int>(scenario.model.experts)) {}

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
  return scale_of({layer, static_cast<int>(what)}, role);
}

float Fp8State::scale_of(const std::pair<int, int>& key, Role role) const {
  const auto it = tensors_.find(key);
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

Fp8GemmOperands Fp8State::operands(const model::Op& op, int expert) {
  Fp8GemmOperands out{scaled(false, 1), scaled(false, 1), scaled(true, 1)};
  if (recipe_ == model::Fp8Recipe::Blockwise) out.weight.scaling = Fp8Operand::Scaling::Blocks;  // 128 x 128
  if (!delayed()) return out;
  const auto key = tensor_key(op, expert);
  const std::tuple<int, int, int> forward_key{op.micro_batch, key.first, key.second};
  if (op.phase == model::Phase::Forward) {
    const auto [weight, fresh] = weight_scales_.try_emplace(key, scale_of(key, Role::Weight));
    forward_scales_[forward_key] = ForwardScales{scale_of(key, Role::Input), weight->second};
  }
  const auto it = forward_scales_.find(forward_key);
  TWIN_EXEC_CHECK(it != forward_scales_.end(), "layer {}: an FP8 GEMM's {} before its forward", op.layer,
                  model::to_string(op.phase));
  out.input.scale = it->second.input;
  out.weight.scale = it->second.weight;
  out.gradient.scale = scale_of(key, Role::OutputGradient);
  return out;
}

void Fp8State::record(const model::Op& op, const Fp8Amaxes& amaxes, int expert) {
  if (!delayed() || op.phase == model::Phase::Recompute) return;
  Tensors& t = tensors_[tensor_key(op, expert)];
  if (op.phase == model::Phase::Forward) {
    t.input.record(amaxes.input);
    t.weight.record(amaxes.weight);
    t.forward_seen = true;
  } else {
    t.gradient.record(amaxes.gradient);
    t.backward_seen = true;
  }
}

void Fp8State::experts_ran(const model::Op& op, int first, int count) {
  if (!delayed() || op.phase == model::Phase::Recompute) return;
  expert_layers_[region(op.phase)].insert(op.layer);
  for (int expert = first; expert < first + count; ++expert) held_experts_.insert(expert);
}

std::vector<Fp8State::PendingKey> Fp8State::pending_keys(model::Phase phase) const {
  const bool forward = phase == model::Phase::Forward;
  const auto seen = [forward](const Tensors& t) { return forward ? t.forward_seen : t.backward_seen; };
  const std::set<int>& expert_layers = expert_layers_[region(phase)];
  std::set<int> layers(expert_layers.begin(), expert_layers.end());
  for (const auto& [key, t] : tensors_) layers.insert(key.first);
  std::vector<PendingKey> keys;
  for (const int layer : layers) {
    for (auto it = tensors_.lower_bound({layer, 0}); it != tensors_.end() && it->first.first == layer; ++it) {
      if (it->first.second < kExpertTensors && seen(it->second)) keys.push_back({it->first});
    }
    if (expert_layers.count(layer) == 0) continue;
    for (int slot = 0; slot < 2 * experts_; ++slot) {
      const std::pair<int, int> key{layer, kExpertTensors + slot};
      const auto it = tensors_.find(key);
      keys.push_back({key, true, held_experts_.count(slot / 2) > 0, it != tensors_.end() && seen(it->second)});
    }
  }
  return keys;
}

// Per layer GEMM its amaxes (forward: input, weight; backward: output gradient); per expert the same, 0 where this
// rank saw none, and 1 or 0: whether it saw rows (so that a replica of the expert that saw none updates with the one
// that did, as one rank, which saw them all, would).
std::vector<float> Fp8State::pending(model::Phase phase) const {
  const bool forward = phase == model::Phase::Forward;
  std::vector<float> amaxes;
  for (const PendingKey& k : pending_keys(phase)) {
    const Tensors* t = k.seen ? &tensors_.at(k.key) : nullptr;
    if (forward) {
      amaxes.push_back(t ? t->input.amax_history()[0] : 0.0f);
      amaxes.push_back(t ? t->weight.amax_history()[0] : 0.0f);
    } else {
      amaxes.push_back(t ? t->gradient.amax_history()[0] : 0.0f);
    }
    if (k.expert) amaxes.push_back(k.seen ? 1.0f : 0.0f);
  }
  return amaxes;
}

void Fp8State::update(model::Phase phase, const std::vector<float>& reduced) {
  const auto keys = pending_keys(phase);
  const bool forward = phase == model::Phase::Forward;
  std::size_t expected = 0;
  for (const PendingKey& k : keys) expected += (forward ? 2 : 1) + (k.expert ? 1 : 0);
  TWIN_EXEC_CHECK(reduced.size() == expected, "FP8 amax update: {} amaxes for {}", reduced.size(), expected);
  const float e4m3 = k::fp8_max(k::Fp8Format::E4M3);
  const float gradient_max = k::fp8_max(format_ == model::Fp8Format::Hybrid ? k::Fp8Format::E5M2 : k::Fp8Format::E4M3);
  std::size_t next = 0;
  for (const PendingKey& k : keys) {
    const std::size_t at = next;
    next += (forward ? 2 : 1) + (k.expert ? 1 : 0);
    if (!k.held || (k.expert && !(reduced[next - 1] > 0))) continue;  // another rank's expert, or no replica's rows
    Tensors& t = tensors_[k.key];
    if (forward) {
      t.input.record(reduced[at]);
      t.weight.record(reduced[at + 1]);
      t.input.update(e4m3);
      t.weight.update(e4m3);
      t.forward_seen = false;
    } else {
      t.gradient.record(reduced[at]);
      t.gradient.update(gradient_max);
      t.backward_seen = false;
    }
  }
  expert_layers_[region(phase)].clear();
}

}  // namespace twin::exec
