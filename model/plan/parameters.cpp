#include "model/plan/parameters.hpp"

#include "model/scenario/counts.hpp"

namespace twin::model {

double norm_parameters(const Scenario& s) {
  return (s.model.norm == Norm::RmsNorm ? 1 : 2) * d(s.model.hidden);
}

// Split by columns: QKV and MLP-up (weights and biases); by rows: projection and MLP-down (their biases and both
// layernorms replicated). The QKV width counts the key/value heads (grouped-query attention), the MLP-up width
// SwiGLU's gate half.
double layer_parameters_per_rank(const Scenario& s, std::int64_t tp) {
  const double h = d(s.model.hidden), f = d(s.ffn_hidden()), t = d(tp);
  const double qkv = d(s.model.qkv_width()), up = d(s.mlp_up_width()), attention = d(s.model.attention_width());
  const double bias = s.model.linear_bias ? 1 : 0;
  const double split = h * qkv + bias * qkv  // QKV
                       + attention * h       // attention projection weight
                       + h * up + bias * up  // MLP up
                       + f * h;              // MLP down weight
  const double replicated = bias * h         // attention projection bias
                            + bias * h       // MLP down bias
                            + (s.model.shared_norm ? 1 : 2) * norm_parameters(s);
  return split / t + replicated;
}

ParameterCount count_parameters(const Scenario& s) {
  ParameterCount count;
  const double h = d(s.model.hidden), V = d(s.padded_vocab());
  count.per_layer = layer_parameters_per_rank(s, 1);
  count.embedding = V * h + position_embedding_parameters(s);
  count.final_layer_norm = norm_parameters(s);
  count.lm_head = s.framework.tied_embeddings ? 0 : V * h;
  count.total = d(s.model.layers) * count.per_layer + count.embedding + count.final_layer_norm + count.lm_head;
  return count;
}

double position_embedding_parameters(const Scenario& s) {
  return s.model.position_embedding == PositionEmbedding::Learned ? d(s.model.seq_len) * d(s.model.hidden) : 0;
}

double layer_parameters_per_gpu(const Scenario& s) { return layer_parameters_per_rank(s, s.parallel.tp); }

}  // namespace twin::model
