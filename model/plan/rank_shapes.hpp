// RankShapes: the integer widths one rank works on, derived once from a scenario's model and plan. Every rank of a
// plan has the same widths (which slice it holds is its coordinates' business, model/plan/ranks.hpp), so a Program
// carries one. The simulator's op shapes (model::Shapes, model/ops/kernel_traffic.hpp) and the executor's
// (exec::Dims, exec::MoeDims, exec/shard/model_shard.hpp) are views of it.
//
// The divisions are exact on a validated scenario (model/scenario/scenario_rules*.cpp refuses heads, key/value heads,
// ffn_hidden not divisible by parallel.tp, seq_len by 2 * parallel.cp, experts by parallel.ep, moe_ffn_hidden by
// parallel.etp; padded_vocab is a multiple of tp by construction). On one that is not (a caller may ask before
// validating) they round down, and a size below 1 counts as 1, so that nothing divides by zero.
#pragma once

#include <cstdint>

#include "model/scenario/scenario.hpp"

namespace twin::model {

struct RankShapes {
  // One micro-batch on one rank.
  std::int64_t micro_batch = 0;    // sequences per micro-batch (parallel.micro_batch)
  std::int64_t seq_len = 0;        // tokens of a whole sequence (model.seq_len)
  std::int64_t seq_local = 0;      // seq_len / cp: a CP rank's part of each sequence (two chunks, context_parallel.hpp)
  std::int64_t tokens = 0;         // micro_batch * seq_local
  bool sequence_parallel = false;  // parallel.sequence_parallel with tp > 1
  std::int64_t tokens_sp = 0;      // tokens / tp with sequence parallelism (outside the TP region), tokens without

  // The dense layers' widths on one of tp ranks (whole heads; column-parallel rows, row-parallel columns).
  std::int64_t hidden = 0;          // model.hidden, replicated
  std::int64_t head_dim = 0;        // one head's width
  std::int64_t heads_local = 0;     // heads / tp
  std::int64_t kv_heads_local = 0;  // key/value heads / tp (heads_local without grouped-query attention)
  std::int64_t qkv_local = 0;       // the QKV projection's output: (heads_local + 2 kv_heads_local) head_dim
  std::int64_t rotary_dim = 0;      // dimensions of a head that rotary embeddings rotate
  std::int64_t ffn = 0;             // the whole MLP width (ffn_hidden)
  std::int64_t ffn_local = 0;       // ffn / tp
  std::int64_t up_local = 0;        // the MLP-up output: ffn_local, 2 ffn_local with SwiGLU ([gate | up])
  std::int64_t vocab = 0;           // the real vocabulary (model.vocab)
  std::int64_t vocab_local = 0;     // padded_vocab / tp: one rank's rows of the padded vocabulary

  // Mixture-of-Experts layers (all zero for a dense model).
  std::int64_t experts = 0, top_k = 0;  // routed experts per MoE layer, experts per token
  std::int64_t local_experts = 0;       // experts / ep: the routed experts one EP rank holds
  std::int64_t expert_ffn_local = 0;    // one expert's width on one of etp ranks: moe_ffn_hidden / etp
  std::int64_t expert_up_local = 0;     // its up projection's: expert_ffn_local, twice that with SwiGLU
  std::int64_t shared_ffn = 0;          // the shared experts' summed width, replicated (0: none)
  std::int64_t shared_up = 0;           // their up projection's

  // The first row of TP rank `tp_rank`'s vocabulary shard.
  std::int64_t vocab_start(std::int64_t tp_rank) const { return tp_rank * vocab_local; }

  bool operator==(const RankShapes&) const = default;
};

RankShapes rank_shapes(const Scenario& scenario);

}  // namespace twin::model
