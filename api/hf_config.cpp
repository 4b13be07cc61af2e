#include "api/hf_config.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <optional>

#include <fmt/core.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "model/scenario/errors.hpp"

namespace twin::api {

namespace {

using nlohmann::json;

// The architectures whose config classes (transformers' configuration_<type>.py) give the defaults used below when a
// key is left out: SwiGLU (hidden_act "silu" gating an up-projection), RMSNorm, rotary embeddings, untied embeddings,
// no biases. Llama's class alone takes a missing num_key_value_heads as num_attention_heads (multi-head attention);
// the others' defaults are their own model sizes', so the file must give it.
constexpr const char* kKnown[] = {"llama", "mistral", "mixtral", "qwen3", "qwen3_moe"};

class Config {
 public:
  Config(json document, std::string source) : doc_(std::move(document)), source_(std::move(source)) {
    type_ = doc_.contains("model_type") && doc_["model_type"].is_string() ? doc_["model_type"].get<std::string>() : "";
    known_ = std::find(std::begin(kKnown), std::end(kKnown), type_) != std::end(kKnown);
  }

  bool known() const { return known_; }
  const std::string& type() const { return type_; }
  bool has(const char* key) const { return doc_.contains(key) && !doc_[key].is_null(); }

  [[noreturn]] void fail(const std::string& problem) const {
    throw UserError(fmt::format("--hf-config {}: {}", source_, problem));
  }

  // A key every architecture's file must hold, or one an unknown architecture's must.
  [[noreturn]] void missing(const char* key) const {
    if (known_) fail(fmt::format("{} is missing (model_type \"{}\" has no default for it)", key, type_));
    fail(
        fmt::format("{} is missing: model_type \"{}\" is not one twin knows the defaults of ({}), so the file must "
                    "give it",
                    key, type_.empty() ? "(none)" : type_, fmt::join(std::begin(kKnown), std::end(kKnown), ", ")));
  }

  std::int64_t positive(const char* key) const {
    if (!has(key)) missing(key);
    const json& value = doc_[key];
    if (!value.is_number_integer() || value.get<std::int64_t>() < 1) {
      fail(fmt::format("{} must be a whole number of at least 1, got {}", key, value.dump()));
    }
    return value.get<std::int64_t>();
  }

  std::optional<std::int64_t> optional_positive(const char* key) const {
    return has(key) ? std::optional(positive(key)) : std::nullopt;
  }

  bool flag(const char* key, std::optional<bool> known_default) const {
    if (!has(key)) {
      if (known_ && known_default) return *known_default;
      missing(key);
    }
    if (!doc_[key].is_boolean()) fail(fmt::format("{} must be true or false, got {}", key, doc_[key].dump()));
    return doc_[key].get<bool>();
  }

  std::string text(const char* key, const char* known_default) const {
    if (!has(key)) {
      if (known_) return known_default;
      missing(key);
    }
    if (!doc_[key].is_string()) fail(fmt::format("{} must be a string, got {}", key, doc_[key].dump()));
    return doc_[key].get<std::string>();
  }

  const json& operator[](const char* key) const { return doc_[key]; }

 private:
  json doc_;
  std::string source_;
  std::string type_;
  bool known_ = false;
};

std::string activation_of(const Config& c) {
  const std::string act = c.text("hidden_act", "silu");
  if (act == "silu" || act == "swish") return "swiglu";  // gating an up-projection, as LlamaMLP does
  if (act == "gelu" || act == "gelu_new" || act == "gelu_fast" || act == "gelu_pytorch_tanh") return "gelu";
  c.fail(fmt::format("hidden_act \"{}\" is not one twin models (silu: SwiGLU; gelu, gelu_new, gelu_pytorch_tanh: GELU)",
                     act));
}

std::string norm_of(const Config& c) {
  if (c.has("rms_norm_eps")) return "rmsnorm";
  if (c.has("layer_norm_eps") || c.has("layer_norm_epsilon")) return "layernorm";
  if (c.known()) return "rmsnorm";
  c.missing("rms_norm_eps (RMSNorm) or layer_norm_eps (LayerNorm)");
}

// The Mixture-of-Experts keys (Qwen3-MoE's num_experts, Mixtral's num_local_experts); none for a dense model.
void add_experts(const Config& c, std::int64_t ffn, std::int64_t layers, std::vector<model::Override>& out) {
  const char* experts_key = c.has("num_experts")         ? "num_experts"
                            : c.has("num_local_experts") ? "num_local_experts"
                                                         : "";
  if (*experts_key == '\0') {  // dense (the other MoE keys are refused on a dense model: a MoE scenario's stay named)
    out.push_back({"model.experts", "0"});
    return;
  }
  out.push_back({"model.experts", std::to_string(c.positive(experts_key))});
  out.push_back({"model.top_k", std::to_string(c.positive("num_experts_per_tok"))});
  out.push_back({"model.moe_ffn_hidden", std::to_string(c.optional_positive("moe_intermediate_size").value_or(ffn))});
  out.push_back({"model.shared_experts", "0"});
  if (c.has("decoder_sparse_step") && c["decoder_sparse_step"] != 1) {
    c.fail(fmt::format("decoder_sparse_step = {}: twin models MoE in every layer after the leading dense ones (1)",
                       c["decoder_sparse_step"].dump()));
  }
  // mlp_only_layers: the dense layers, which twin models as the leading ones (DeepSeek-V3's first_k_dense_replace)
  std::int64_t dense = 0;
  if (c.has("mlp_only_layers")) {
    const json& listed = c["mlp_only_layers"];
    if (!listed.is_array()) c.fail("mlp_only_layers must be a list of layer indices");
    for (std::size_t i = 0; i < listed.size(); ++i) {
      if (listed[i] != static_cast<std::int64_t>(i)) {
        c.fail(fmt::format("mlp_only_layers = {}: twin models the dense layers as the leading ones (0, 1, ...)",
                           listed.dump()));
      }
    }
    dense = static_cast<std::int64_t>(listed.size());
    if (dense >= layers) c.fail(fmt::format("mlp_only_layers = {} leaves no MoE layer", listed.dump()));
  }
  out.push_back({"model.dense_layers", std::to_string(dense)});
}

}  // namespace

std::vector<model::Override> hf_config_overrides_of_text(const std::string& json_text, const std::string& source) {
  json document;
  try {
    document = json::parse(json_text);
  } catch (const json::parse_error& error) {
    throw UserError(fmt::format("--hf-config {}: not valid JSON ({})", source, error.what()));
  }
  if (!document.is_object()) throw UserError(fmt::format("--hf-config {}: not a JSON object", source));
  const Config c(std::move(document), source);
  std::vector<model::Override> out;
  const std::int64_t hidden = c.positive("hidden_size"), layers = c.positive("num_hidden_layers");
  const std::int64_t heads = c.positive("num_attention_heads");
  const std::int64_t kv_heads =
      c.has("num_key_value_heads") || c.type() != "llama" ? c.positive("num_key_value_heads") : heads;
  const std::int64_t head_dim = c.optional_positive("head_dim").value_or(hidden / heads);
  const std::int64_t ffn = c.positive("intermediate_size");
  std::string name = c.type().empty() ? "hf-config" : c.type();
  if (c.has("_name_or_path") && c["_name_or_path"].is_string() && !c["_name_or_path"].get<std::string>().empty()) {
    name = c["_name_or_path"].get<std::string>();
    name = name.substr(name.find_last_of('/') + 1);
  }
  out.push_back({"model.name", name});
  out.push_back({"model.hidden", std::to_string(hidden)});
  out.push_back({"model.layers", std::to_string(layers)});
  out.push_back({"model.heads", std::to_string(heads)});
  out.push_back({"model.kv_heads", std::to_string(kv_heads)});
  out.push_back({"model.head_dim", std::to_string(head_dim)});
  out.push_back({"model.ffn_hidden", std::to_string(ffn)});
  out.push_back({"model.vocab", std::to_string(c.positive("vocab_size"))});
  out.push_back({"model.seq_len", std::to_string(c.positive("max_position_embeddings"))});
  out.push_back({"model.activation", activation_of(c)});
  out.push_back({"model.norm", norm_of(c)});
  const bool rope = c.known() || c.has("rope_theta") || c.has("partial_rotary_factor");
  out.push_back({"model.position_embedding", rope ? "rope" : "learned"});
  if (rope) {
    const double fraction = c.has("partial_rotary_factor") && c["partial_rotary_factor"].is_number()
                                ? c["partial_rotary_factor"].get<double>()
                                : 1.0;
    out.push_back({"model.rotary_fraction", fmt::format("{}", fraction)});
  }
  const bool bias =
      (c.has("attention_bias") && c.flag("attention_bias", false)) || (c.has("mlp_bias") && c.flag("mlp_bias", false));
  out.push_back({"model.linear_bias", bias ? "true" : "false"});
  out.push_back({"model.parallel_residual", "false"});
  add_experts(c, ffn, layers, out);
  out.push_back({"framework.tied_embeddings", c.flag("tie_word_embeddings", false) ? "true" : "false"});
  return out;
}

std::vector<model::Override> hf_config_overrides(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(fmt::format("--hf-config {}: cannot be read", path));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return hf_config_overrides_of_text(text, path);
}

}  // namespace twin::api
