// The names a scenario spells its choices with (model.dtype = "bf16", cluster.node = "dgx-a100", ...): one table per
// choice, read by the TOML reader, written by to_toml and printed by to_string. Internal to model/.
#pragma once

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "model/scenario/scenario.hpp"

namespace twin::model::names {

inline std::string lowercase(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

template <typename Enum>
struct EnumName {
  Enum value;
  const char* name;
};

inline constexpr EnumName<DType> kDTypes[] = {{DType::BF16, "bf16"}, {DType::FP16, "fp16"}, {DType::FP32, "fp32"}};
inline constexpr EnumName<ScheduleKind> kSchedules[] = {
    {ScheduleKind::GPipe, "gpipe"},
    {ScheduleKind::OneFOneB, "1f1b"},
    {ScheduleKind::Interleaved, "interleaved"},
    {ScheduleKind::ZeroBubbleH1, "zb-h1"},
    {ScheduleKind::ZeroBubbleV, "zb-v"},
    {ScheduleKind::DualPipeV, "dualpipev"},
    {ScheduleKind::DualPipe, "dualpipe"}};
inline constexpr EnumName<Recompute> kRecomputes[] = {
    {Recompute::None, "none"}, {Recompute::Selective, "selective"}, {Recompute::Full, "full"}};
inline constexpr EnumName<NodeKind> kNodes[] = {
    {NodeKind::DgxA100, "dgx-a100"},       {NodeKind::DgxA100_40GB, "dgx-a100-40gb"},
    {NodeKind::DgxH100, "dgx-h100"},       {NodeKind::DgxH200, "dgx-h200"},
    {NodeKind::HgxH800, "hgx-h800"},       {NodeKind::DgxB200, "dgx-b200"},
    {NodeKind::Gb200Nvl72, "gb200-nvl72"}, {NodeKind::CpuHost, "cpu-host"}};
inline constexpr EnumName<Fabric> kFabrics[] = {{Fabric::NodeDefault, "node"},
                                                {Fabric::InfinibandHdr, "infiniband-hdr"},
                                                {Fabric::InfinibandNdr, "infiniband-ndr"},
                                                {Fabric::InfinibandXdr, "infiniband-xdr"},
                                                {Fabric::Roce, "roce"}};
inline constexpr EnumName<Fp8Format> kFp8Formats[] = {
    {Fp8Format::None, "none"}, {Fp8Format::Hybrid, "hybrid"}, {Fp8Format::E4M3, "e4m3"}};
inline constexpr EnumName<Fp8Recipe> kFp8Recipes[] = {{Fp8Recipe::Delayed, "delayed"},
                                                      {Fp8Recipe::Tensorwise, "tensorwise"},
                                                      {Fp8Recipe::Blockwise, "blockwise"},
                                                      {Fp8Recipe::Mxfp8, "mxfp8"}};
inline constexpr EnumName<CpComm> kCpComms[] = {
    {CpComm::P2P, "p2p"}, {CpComm::AllGather, "all_gather"}, {CpComm::AllToAll, "a2a"}};
inline constexpr EnumName<PositionEmbedding> kPositionEmbeddings[] = {
    {PositionEmbedding::Learned, "learned"}, {PositionEmbedding::Alibi, "alibi"}, {PositionEmbedding::Rope, "rope"}};
inline constexpr EnumName<Norm> kNorms[] = {{Norm::LayerNorm, "layernorm"}, {Norm::RmsNorm, "rmsnorm"}};
inline constexpr EnumName<Activation> kActivations[] = {{Activation::Gelu, "gelu"}, {Activation::Swiglu, "swiglu"}};
inline constexpr EnumName<Framework> kFrameworks[] = {
    {Framework::Megatron, "megatron"}, {Framework::DeepSpeed, "deepspeed"}, {Framework::Composer, "composer"}};
inline constexpr EnumName<MoeDispatcher> kMoeDispatchers[] = {{MoeDispatcher::AllToAll, "alltoall"},
                                                              {MoeDispatcher::Flex, "flex"}};
inline constexpr EnumName<AttentionKind> kAttentionKinds[] = {
    {AttentionKind::Unfused, "unfused"}, {AttentionKind::Flash1, "flash1"}, {AttentionKind::Flash2, "flash2"}};

template <typename Enum, std::size_t N>
std::string_view name_of(const EnumName<Enum> (&table)[N], Enum value) {
  for (const auto& entry : table)
    if (entry.value == value) return entry.name;
  return "?";
}

template <typename Enum, std::size_t N>
std::optional<Enum> value_named(const EnumName<Enum> (&table)[N], std::string_view name) {
  for (const auto& entry : table)
    if (entry.name == name) return entry.value;
  return std::nullopt;
}

template <typename Enum, std::size_t N>
std::string allowed_names(const EnumName<Enum> (&table)[N]) {
  std::string out;
  for (const auto& entry : table) out += (out.empty() ? "" : ", ") + std::string(entry.name);
  return out;
}

}  // namespace twin::model::names
