#include "model/ops/op.hpp"

#include <stdexcept>

#include <fmt/format.h>

namespace twin::model {
namespace {

template <typename Enum, std::size_t N>
std::string_view lookup(const char* const (&names)[N], Enum value) {
  const auto index = static_cast<std::size_t>(value);
  return index < N ? names[index] : "?";
}

}  // namespace

P2PTag p2p_tag(const Op& op) {
  return P2PTag{op.micro_batch, op.tag_virtual_stage, op.phase};
}

std::uint64_t p2p_tag_key(const P2PTag& tag) {
  if (tag.micro_batch < 0 || tag.micro_batch >= kP2PTagMicroBatches || tag.sender_virtual_stage < 0 ||
      tag.sender_virtual_stage >= kP2PTagVirtualStages ||
      (tag.phase != Phase::Forward && tag.phase != Phase::Backward)) {
    throw std::out_of_range(
        fmt::format("point-to-point tag out of range: micro-batch {} (0 to {}), virtual stage {} (0 to {}), phase {}",
                    tag.micro_batch, kP2PTagMicroBatches - 1, tag.sender_virtual_stage, kP2PTagVirtualStages - 1,
                    to_string(tag.phase)));
  }
  const std::uint64_t backward = tag.phase == Phase::Backward ? 1 : 0;
  return backward << 29 | static_cast<std::uint64_t>(tag.sender_virtual_stage) << 18 |
         static_cast<std::uint64_t>(tag.micro_batch);
}

std::string_view to_string(OpKind value) {
  static const char* const names[] = {"compute", "collective", "send", "recv"};
  return lookup(names, value);
}
std::string_view to_string(Phase value) {
  static const char* const names[] = {"forward", "backward", "recompute", "optimizer", "weight_grad"};
  return lookup(names, value);
}
std::string_view to_string(Stream value) {
  static const char* const names[] = {"compute", "data_parallel", "pipeline", "expert"};
  return lookup(names, value);
}
std::string_view to_string(ComputeKind value) {
  static const char* const names[] = {"embedding",
                                      "layernorm_attention",
                                      "qkv_projection",
                                      "attention_core",
                                      "attention_projection",
                                      "attention_residual",
                                      "layernorm_mlp",
                                      "mlp_up",
                                      "gelu",
                                      "swiglu",
                                      "mlp_down",
                                      "mlp_residual",
                                      "final_layernorm",
                                      "lm_head",
                                      "cross_entropy",
                                      "router",
                                      "expert_permute",
                                      "expert_up",
                                      "expert_down",
                                      "expert_unpermute",
                                      "expert_splits_sync",
                                      "transformer_layer",
                                      "optimizer_step"};
  return lookup(names, value);
}
std::string_view to_string(CollectiveKind value) {
  static const char* const names[] = {"all_reduce", "reduce_scatter", "all_gather", "all_to_all"};
  return lookup(names, value);
}
std::string_view to_string(Group value) {
  static const char* const names[] = {"tensor",        "data",
                                      "embedding",     "world",
                                      "context",       "data_with_context",
                                      "pipeline",      "expert",
                                      "expert_tensor", "expert_tensor_and_expert",
                                      "expert_data",   "mirror_stages"};
  static_assert(std::size(names) == kGroupCount, "a name for every Group");
  return lookup(names, value);
}
std::string_view to_string(Payload value) {
  static const char* const names[] = {
      "layer_output",         "layer_input",          "input_grad",           "output_grad",
      "cross_entropy_stats",  "layernorm_grads",      "embedding_grads",      "gradients",
      "parameters",           "grad_norm_squared",    "tokens",               "expert_counts",
      "checkpointed_input",   "fp8_amax",             "context_keys",         "context_values",
      "context_key_grads",    "context_value_grads",  "ulysses_queries",      "ulysses_keys",
      "ulysses_values",       "ulysses_output",       "ulysses_output_grad",  "ulysses_query_grads",
      "ulysses_key_grads",    "ulysses_value_grads",  "expert_probs"};
  static_assert(std::size(names) == kPayloadCount, "a name for every Payload");
  return lookup(names, value);
}
std::string_view to_string(Granularity value) {
  static const char* const names[] = {"op", "layer"};
  return lookup(names, value);
}
std::string_view to_string(KernelKind value) {
  static const char* const names[] = {
      "gemm", "stream", "attention_gemms", "attention_operand", "attention_passes", "flash_attention", "fp8_gemm"};
  return lookup(names, value);
}

}  // namespace twin::model
