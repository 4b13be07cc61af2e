// What the context-parallel simulator tests share: Llama 3 8B at long sequences on DGX H100s, and the closed form's
// view of a scenario's attention (model/ops/context_parallel.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "model/ops/context_parallel.hpp"
#include "model/scenario/scenario.hpp"

namespace twin::sim::cp_scenarios {

// Llama 3 8B (Meta's model card: 32 layers, hidden 4096, 32 heads, 8 key/value heads, FFN 14336) on DGX H100s, TP 8
// with sequence parallelism, one sequence per iteration, CP over cp nodes.
inline model::Scenario llama3_8b(std::int64_t seq, std::int64_t cp, std::string_view cp_comm = "all_gather") {
  const std::int64_t nodes = cp;  // TP 8 fills a node
  const std::string toml = fmt::format(R"(
[model]
name = "llama3-8b"
layers = 32
hidden = 4096
heads = 32
kv_heads = 8
ffn_hidden = 14336
seq_len = {}
vocab = 128256
dtype = "bf16"
norm = "rmsnorm"
activation = "swiglu"
position_embedding = "rope"
linear_bias = false
[parallel]
tp = 8
cp = {}
micro_batch = 1
global_batch = 2
sequence_parallel = true
zero_stage = 1
dp_overlap = true
[cluster]
nodes = {}
node = "dgx-h100"
[framework]
name = "megatron"
tied_embeddings = false
dropout = false
attention = "flash2"
cp_comm = "{}"
)",
                                       seq, cp, nodes, cp_comm);
  return model::parse_scenario(toml, "test");
}

// The scenario's attention as the closed form takes it (bf16: 2 bytes an element).
inline model::CpAttention cp_attention(const model::Scenario& s) {
  return model::CpAttention{s.parallel.micro_batch, s.model.seq_len, s.model.heads, s.model.key_value_heads(),
                            s.model.head_dim(),     s.parallel.tp,   s.parallel.cp, 2};
}

}  // namespace twin::sim::cp_scenarios
