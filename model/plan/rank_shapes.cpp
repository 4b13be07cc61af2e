#include "model/plan/rank_shapes.hpp"

#include <algorithm>

namespace twin::model {

namespace {

// A parallel size as a divisor: at least 1 (see the header: a scenario not yet validated may hold 0).
std::int64_t ways(std::int64_t size) {
  return std::max<std::int64_t>(1, size);
}

}  // namespace

RankShapes rank_shapes(const Scenario& s) {
  const ModelSpec& m = s.model;
  const std::int64_t tp = ways(s.parallel.tp), cp = ways(s.parallel.cp);
  const std::int64_t up = m.activation == Activation::Swiglu ? 2 : 1;
  RankShapes r;
  r.micro_batch = s.parallel.micro_batch;
  r.seq_len = m.seq_len;
  r.seq_local = m.seq_len / cp;
  r.tokens = r.micro_batch * r.seq_local;
  r.sequence_parallel = s.parallel.sequence_parallel && tp > 1;
  r.tokens_sp = r.sequence_parallel ? r.tokens / tp : r.tokens;
  r.hidden = m.hidden;
  r.head_dim = m.head_dim();
  r.heads_local = m.heads / tp;
  r.kv_heads_local = m.key_value_heads() / tp;
  r.qkv_local = (r.heads_local + 2 * r.kv_heads_local) * r.head_dim;
  r.rotary_dim = m.rotary_dim();
  r.ffn = s.ffn_hidden();
  r.ffn_local = r.ffn / tp;
  r.up_local = up * r.ffn_local;
  r.vocab = m.vocab;
  r.vocab_local = s.padded_vocab() / tp;
  if (!m.is_moe()) return r;
  r.experts = m.experts;
  r.top_k = m.top_k;
  r.local_experts = m.experts / ways(s.parallel.ep);
  r.expert_ffn_local = s.moe_ffn_hidden() / ways(s.parallel.etp);
  r.expert_up_local = up * r.expert_ffn_local;
  r.shared_ffn = m.shared_experts * s.moe_ffn_hidden();
  r.shared_up = up * r.shared_ffn;
  return r;
}

}  // namespace twin::model
