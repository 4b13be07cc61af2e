// Closed-form parameter counts of a GPT model (dense or Mixture-of-Experts layers, TP shards): what the model holds,
// before any plan's memory or time. model/program/estimates.hpp builds memory and FLOP estimates on these.
#pragma once

#include "model/scenario/scenario.hpp"

namespace twin::model {

// Parameters of one layer norm: a weight and a bias (LayerNorm) or a weight alone (RMSNorm).
double norm_parameters(const Scenario& scenario);

// Parameters of one transformer layer held by one of `tp` tensor-parallel ranks (its column and row shards plus the
// replicated biases and norms).
double layer_parameters_per_rank(const Scenario& scenario, std::int64_t tp);

struct ParameterCount {
  double per_layer = 0;          // one transformer layer (unsharded)
  double embedding = 0;          // word (padded vocab) + position embedding
  double final_layer_norm = 0;
  double lm_head = 0;            // 0 with tied embeddings (the head reuses the word embedding)
  double total = 0;              // the model, counted once
};
ParameterCount count_parameters(const Scenario& scenario);

// The learned position embedding's parameters (seq_len x hidden, on the first stage, replicated across TP); none
// under ALiBi or rotary embeddings.
double position_embedding_parameters(const Scenario& scenario);

// Parameters of one transformer layer held by one GPU (its TP shard plus the replicated layernorms and biases).
double layer_parameters_per_gpu(const Scenario& scenario);

}  // namespace twin::model
