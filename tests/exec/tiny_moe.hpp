// The tiny Mixture-of-Experts model the executor's MoE tests train (moe_parity_test.cpp, moe_capacity_test.cpp,
// moe_a2a_overlap_test.cpp): 4 layers, the first dense; 4 experts of width 96, top-2, one shared expert; fp32 on the
// cpu-host node, 8 sequences of 32 tokens per step. Tests vary it with `--set`-style overrides.
#pragma once

#include <string>

namespace twin::exec::testing {

inline std::string tiny_moe_toml() {
  return R"(
[model]
name = "tiny-moe"
layers = 4
hidden = 64
heads = 4
seq_len = 32
vocab = 256
dtype = "fp32"
experts = 4
top_k = 2
moe_ffn_hidden = 96
shared_experts = 1
dense_layers = 1

[parallel]
micro_batch = 1
global_batch = 8

[cluster]
node = "cpu-host"

[training]
seed = 5
learning_rate = 3e-3
min_learning_rate = 3e-4
warmup_steps = 1
decay_steps = 10
grad_clip = 1.0
)";
}

}  // namespace twin::exec::testing
