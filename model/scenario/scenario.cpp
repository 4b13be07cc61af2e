// A Scenario's names and derived quantities: what each choice is called, the node kinds' GPUs and memory, and the
// layers, vocabulary and recompute a plan implies. Reading and writing TOML: scenario_toml.cpp; the rules a valid
// scenario obeys: scenario_rules.cpp.
#include "model/scenario/scenario.hpp"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "model/scenario/scenario_names.hpp"

namespace twin::model {

namespace {
// Both overloads of failure_model_fields: `Cluster` is ClusterSpec or const ClusterSpec.
template <typename Cluster>
auto reliability_fields(Cluster& c) {
  using Field = decltype(&c.restart_s);
  return std::array<std::pair<const char*, Field>, 7>{{{"gpu_failures_per_gpu_hour", &c.gpu_failures_per_gpu_hour},
                                                       {"host_failures_per_gpu_hour", &c.host_failures_per_gpu_hour},
                                                       {"nic_failures_per_gpu_hour", &c.nic_failures_per_gpu_hour},
                                                       {"switch_failures_per_gpu_hour", &c.switch_failures_per_gpu_hour},
                                                       {"software_failures_per_gpu_hour",
                                                        &c.software_failures_per_gpu_hour},
                                                       {"storage_gb_per_s", &c.storage_gb_per_s},
                                                       {"restart_s", &c.restart_s}}};
}
}  // namespace

std::array<std::pair<const char*, std::optional<double>*>, 7> failure_model_fields(ClusterSpec& c) {
  return reliability_fields(c);
}
std::array<std::pair<const char*, const std::optional<double>*>, 7> failure_model_fields(const ClusterSpec& c) {
  return reliability_fields(c);
}

int dtype_bytes(DType dtype) {
  return dtype == DType::FP32 ? 4 : 2;
}
std::string_view to_string(DType value) {
  return names::name_of(names::kDTypes, value);
}
std::string_view to_string(ScheduleKind value) {
  return names::name_of(names::kSchedules, value);
}
std::string_view to_string(Recompute value) {
  return names::name_of(names::kRecomputes, value);
}
std::string_view to_string(PositionEmbedding value) {
  return names::name_of(names::kPositionEmbeddings, value);
}
std::string_view to_string(Norm value) {
  return names::name_of(names::kNorms, value);
}
std::string_view to_string(Activation value) {
  return names::name_of(names::kActivations, value);
}
std::string_view to_string(NodeKind value) {
  return names::name_of(names::kNodes, value);
}
std::string_view to_string(AttentionKind value) {
  return names::name_of(names::kAttentionKinds, value);
}
std::string_view to_string(MoeDispatcher value) {
  return names::name_of(names::kMoeDispatchers, value);
}

std::string_view to_string(Fabric value) {
  return names::name_of(names::kFabrics, value);
}

std::string_view to_string(Framework value) {
  return names::name_of(names::kFrameworks, value);
}

namespace {

// One row per node kind: its GPUs and each GPU's memory, in bytes (binary units, as the GPU's driver reports them).
struct NodeFacts {
  NodeKind kind;
  int gpus_per_node;
  double gpu_memory_bytes;
};
constexpr double kMiB = 1024.0 * 1024.0;
constexpr NodeFacts kNodeFacts[] = {
    // DGX A100 user guide: 8x A100-SXM4-80GB, 81920 MiB each (nvidia-smi; "80GB" in the A100 datasheet).
    {NodeKind::DgxA100, 8, 81920 * kMiB},
    // DGX A100 320GB: the same chassis with 8x A100-SXM4-40GB, 40960 MiB each (A100 datasheet, "40GB").
    {NodeKind::DgxA100_40GB, 8, 40960 * kMiB},
    // DGX H100 user guide: 8x H100-SXM5 80GB: five active 16 GiB HBM3 stacks (NVIDIA H100 Tensor Core GPU
    // Architecture whitepaper), 81920 MiB.
    {NodeKind::DgxH100, 8, 81920 * kMiB},
    // DGX H200 datasheet: 8x H200-SXM "141GB" of HBM3e; the driver reports 143771 MiB (nvidia-smi on an H200 SXM).
    {NodeKind::DgxH200, 8, 143771 * kMiB},
    // HGX H800 8-GPU: 8x H800 SXM5 80GB, H100 SXM5's memory (H800 datasheet: 80 GB HBM3), 81920 MiB as above.
    {NodeKind::HgxH800, 8, 81920 * kMiB},
    // DGX B200 user guide: 8x B200 "180GB" of HBM3e (1,440 GB in all); the driver reports 183359 MiB (nvidia-smi).
    {NodeKind::DgxB200, 8, 183359 * kMiB},
    // GB200 NVL72: 72 Blackwell GPUs in one NVLink domain (the rack is the node), "186GB" of HBM3e each (GB200 NVL72
    // specifications); the driver reports 189471 MiB (nvidia-smi on a GB200).
    {NodeKind::Gb200Nvl72, 72, 189471 * kMiB},
    // A CPU host: one worker unless cluster.gpus_per_node says otherwise, with a nominal 16 GiB budget (the CPU
    // backend checks its real allocations).
    {NodeKind::CpuHost, 1, 16384 * kMiB},
};

const NodeFacts& facts(NodeKind node) {
  for (const NodeFacts& row : kNodeFacts) {
    if (row.kind == node) return row;
  }
  throw InternalError("model/scenario/scenario.cpp: no row of kNodeFacts for node kind " + std::string(to_string(node)));
}

}  // namespace

int default_gpus_per_node(NodeKind node) {
  return facts(node).gpus_per_node;
}

double gpu_memory_bytes(NodeKind node) {
  return facts(node).gpu_memory_bytes;
}

std::int64_t Scenario::padded_vocab() const {
  const std::int64_t multiple =
      std::max<std::int64_t>(1, parallel.vocab_pad_multiple) * std::max<std::int64_t>(1, parallel.tp);
  return (model.vocab + multiple - 1) / multiple * multiple;
}

std::int64_t Scenario::layers_in_virtual_stage(std::int64_t virtual_stage) const {
  // Megatron-Core's get_num_layers_to_build (megatron/core/transformer/transformer_block.py): a stage's layers split
  // evenly over its chunks; the embedding and the loss, when counted, take one layer's place at the two ends.
  // DualPipe's two directions each split the model as one chunk per stage does.
  const auto& p = parallel;
  const std::int64_t v = p.bidirectional() ? 1 : std::max<std::int64_t>(1, p.virtual_stages);
  virtual_stage %= std::max<std::int64_t>(1, p.route_length());  // validation may ask before checking pp
  if (p.account_for_embedding || p.account_for_loss) {
    const std::int64_t counted = model.layers + (p.account_for_embedding ? 1 : 0) + (p.account_for_loss ? 1 : 0);
    std::int64_t layers = counted / (p.pp * v);
    if (p.account_for_embedding && virtual_stage == 0) --layers;
    if (p.account_for_loss && virtual_stage == p.pp * v - 1) --layers;
    return layers;
  }
  if (p.first_stage_layers <= 0 && p.last_stage_layers <= 0) return layers_per_chunk();
  const std::int64_t stage = virtual_stage % p.pp;
  if (stage == 0 && p.first_stage_layers > 0) return p.first_stage_layers / v;
  if (stage == p.pp - 1 && p.last_stage_layers > 0) return p.last_stage_layers / v;
  const std::int64_t middle = p.pp - (p.first_stage_layers > 0) - (p.last_stage_layers > 0);
  return middle > 0 ? (model.layers - p.first_stage_layers - p.last_stage_layers) / middle / v : 0;
}

std::int64_t Scenario::first_layer_of_virtual_stage(std::int64_t virtual_stage) const {
  std::int64_t first = 0;
  const std::int64_t route_start = virtual_stage - virtual_stage % std::max<std::int64_t>(1, parallel.route_length());
  for (std::int64_t earlier = route_start; earlier < virtual_stage; ++earlier) {
    first += layers_in_virtual_stage(earlier);
  }
  return first;
}

Recompute Scenario::recompute_of_layer(std::int64_t layer) const {
  const auto& p = parallel;
  if (p.recompute != Recompute::Full || p.recompute_num_layers <= 0) return p.recompute;
  // The layer's place in its chunk: chunks run in virtual-stage order over the model's layers.
  std::int64_t first = 0;
  for (std::int64_t vs = 0; vs < p.pp * p.virtual_stages; ++vs) {
    const std::int64_t layers = layers_in_virtual_stage(vs);
    if (layer < first + layers) return layer - first < p.recompute_num_layers ? Recompute::Full : Recompute::None;
    first += layers;
  }
  return Recompute::None;
}

std::int64_t Scenario::recomputed_layers_on_stage(std::int64_t stage) const {
  if (parallel.recompute != Recompute::Full) return 0;
  if (parallel.recompute_num_layers <= 0) return layers_on_stage(stage);
  std::int64_t layers = 0;
  for (std::int64_t chunk = 0; chunk < parallel.virtual_stages; ++chunk) {
    layers += std::min(parallel.recompute_num_layers, layers_in_virtual_stage(parallel.virtual_stage(stage, chunk)));
  }
  return layers;
}

std::int64_t Scenario::layers_on_stage(std::int64_t stage) const {
  std::int64_t layers = 0;
  for (std::int64_t chunk = 0; chunk < parallel.virtual_stages; ++chunk) {
    layers += layers_in_virtual_stage(parallel.virtual_stage(stage, chunk));
  }
  return layers;
}

std::string version_text(const std::array<int, 3>& version) {
  return fmt::format("{}.{}.{}", version[0], version[1], version[2]);
}

std::array<int, 3> deepspeed_release(const FrameworkSpec& framework) {
  if (framework.deepspeed_version != std::array<int, 3>{0, 0, 0}) return framework.deepspeed_version;
  return framework.bf16_optimizer ? std::array<int, 3>{0, 6, 2} : std::array<int, 3>{0, 5, 0};
}

bool transformer_engine_by_default(const Scenario& s) {
  return s.framework.name == Framework::Megatron && s.model.fp8 != Fp8Format::None;
}

bool deepspeed_at_least(const FrameworkSpec& framework, int major, int minor, int patch) {
  return deepspeed_release(framework) >= std::array<int, 3>{major, minor, patch};
}

bool deepspeed_partitions_gradients(const FrameworkSpec& framework) {
  return framework.name == Framework::DeepSpeed && deepspeed_at_least(framework, 0, 5, 4);
}

bool deepspeed_gradient_first_in_step(const FrameworkSpec& framework) {
  return framework.name == Framework::DeepSpeed && deepspeed_at_least(framework, 0, 8, 3);
}

std::string precision_label(const Scenario& scenario) {
  if (scenario.model.fp8 == Fp8Format::None) return std::string(to_string(scenario.model.dtype));
  return fmt::format("fp8 {}, {}", to_string(scenario.model.fp8), to_string(scenario.framework.fp8_recipe));
}

}  // namespace twin::model
