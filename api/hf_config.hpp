// A Hugging Face `config.json` as a scenario's model: the keys of the transformers config classes, turned into the
// overrides `--set model.*` would give (`twin ... --hf-config config.json`). The architecture (`model_type`) says what
// a key the file leaves out means, as its config class's default does; for an architecture twin does not know, every
// key it needs must be in the file, and the first one missing is named.
//
//   config.json                                  scenario key
//   hidden_size, num_hidden_layers               model.hidden, model.layers
//   num_attention_heads, num_key_value_heads     model.heads, model.kv_heads
//   head_dim                                     model.head_dim (absent: hidden_size / num_attention_heads)
//   intermediate_size                            model.ffn_hidden
//   vocab_size, max_position_embeddings          model.vocab, model.seq_len (the longest context, not always the
//                                                training one: --seq-length or --set model.seq_len overrides it)
//   hidden_act                                   model.activation (silu: SwiGLU, gelu: GELU)
//   rms_norm_eps / layer_norm_eps                model.norm
//   rope_theta, partial_rotary_factor            model.position_embedding = rope, model.rotary_fraction
//   attention_bias, mlp_bias                     model.linear_bias
//   num_experts / num_local_experts              model.experts (routed experts per layer)
//   num_experts_per_tok, moe_intermediate_size   model.top_k, model.moe_ffn_hidden (absent: intermediate_size)
//   mlp_only_layers, decoder_sparse_step         model.dense_layers (the leading dense layers)
//   tie_word_embeddings                          framework.tied_embeddings
#pragma once

#include <string>
#include <vector>

#include "model/scenario/scenario.hpp"

namespace twin::api {

// The overrides of the model in the config.json at `path`, every model key it sets named (so that none of the base
// scenario's model is left standing: a dense config on a MoE scenario is dense). Throws UserError naming the file and
// the key that is missing or wrong.
std::vector<model::Override> hf_config_overrides(const std::string& path);

// The same, of a config already read (`source` names it in errors).
std::vector<model::Override> hf_config_overrides_of_text(const std::string& json_text, const std::string& source);

}  // namespace twin::api
