// Scenario loading: TOML -> overrides -> typed fields (every unknown key and wrong type reported) -> defaults ->
// validation (every violated rule reported, naming field and values).
#include "model/scenario.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include <fmt/core.h>
#include <fmt/format.h>
#include <toml++/toml.h>

namespace twin::model {
namespace {

std::string lowercase(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// "0.9.5" or "0.9" (patch 0) into {0, 9, 5}; false for anything else (a missing part, a sign, a suffix).
bool parse_version(std::string_view text, std::array<int, 3>& out) {
  std::array<int, 3> parts{0, 0, 0};
  std::size_t part = 0, digits = 0;
  for (const char c : text) {
    if (c == '.') {
      if (digits == 0 || ++part > 2) return false;
      digits = 0;
    } else if (c >= '0' && c <= '9') {
      if (++digits > 4) return false;  // no release numbers this long
      parts[part] = parts[part] * 10 + (c - '0');
    } else {
      return false;
    }
  }
  if (digits == 0 || part < 1) return false;
  out = parts;
  return true;
}

template <typename Enum>
struct EnumName {
  Enum value;
  const char* name;
};

constexpr EnumName<DType> kDTypes[] = {{DType::BF16, "bf16"}, {DType::FP16, "fp16"}, {DType::FP32, "fp32"}};
constexpr EnumName<ScheduleKind> kSchedules[] = {
    {ScheduleKind::GPipe, "gpipe"}, {ScheduleKind::OneFOneB, "1f1b"}, {ScheduleKind::Interleaved, "interleaved"}};
constexpr EnumName<Recompute> kRecomputes[] = {
    {Recompute::None, "none"}, {Recompute::Selective, "selective"}, {Recompute::Full, "full"}};
constexpr EnumName<NodeKind> kNodes[] = {{NodeKind::DgxA100, "dgx-a100"},
                                         {NodeKind::DgxA100_40GB, "dgx-a100-40gb"},
                                         {NodeKind::DgxH100, "dgx-h100"},
                                         {NodeKind::DgxH200, "dgx-h200"},
                                         {NodeKind::CpuHost, "cpu-host"}};
constexpr EnumName<PositionEmbedding> kPositionEmbeddings[] = {
    {PositionEmbedding::Learned, "learned"}, {PositionEmbedding::Alibi, "alibi"}, {PositionEmbedding::Rope, "rope"}};
constexpr EnumName<Norm> kNorms[] = {{Norm::LayerNorm, "layernorm"}, {Norm::RmsNorm, "rmsnorm"}};
constexpr EnumName<Activation> kActivations[] = {{Activation::Gelu, "gelu"}, {Activation::Swiglu, "swiglu"}};
constexpr EnumName<Framework> kFrameworks[] = {
    {Framework::Megatron, "megatron"}, {Framework::DeepSpeed, "deepspeed"}, {Framework::Composer, "composer"}};
constexpr EnumName<AttentionKind> kAttentionKinds[] = {
    {AttentionKind::Unfused, "unfused"}, {AttentionKind::Flash1, "flash1"}, {AttentionKind::Flash2, "flash2"}};

template <typename Enum, std::size_t N>
std::string_view name_of(const EnumName<Enum> (&table)[N], Enum value) {
  for (const auto& entry : table)
    if (entry.value == value) return entry.name;
  return "?";
}

template <typename Enum, std::size_t N>
std::string allowed_names(const EnumName<Enum> (&table)[N]) {
  std::string out;
  for (const auto& entry : table) out += (out.empty() ? "" : ", ") + std::string(entry.name);
  return out;
}

// Reads one [section] of the document into typed fields, collecting problems instead of stopping at the first.
class SectionReader {
 public:
  SectionReader(const toml::table* table, std::string section, std::string source, std::vector<std::string>& problems)
      : table_(table), section_(std::move(section)), source_(std::move(source)), problems_(problems) {}

  bool has(std::string_view key) const { return table_ && table_->contains(key); }

  void integer(std::string_view key, std::int64_t& out) {
    const toml::node* node = take(key);
    if (!node) return;
    if (auto value = node->value_exact<std::int64_t>()) {
      // Every size fits in 31 bits; beyond, products of sizes (tp * pp * dp, nodes * GPUs) could overflow.
      constexpr std::int64_t kLargest = std::numeric_limits<std::int32_t>::max();
      if (*value > kLargest || *value < -kLargest) {
        problem(*node, key, fmt::format("{} is too large (at most {})", *value, kLargest));
        return;
      }
      out = *value;
    } else {
      problem(*node, key, fmt::format("expected an integer, got {}", describe(*node)));
    }
  }

  void number(std::string_view key, double& out) {
    const toml::node* node = take(key);
    if (!node) return;
    if (node->is_floating_point() || node->is_integer()) {
      const double value = node->value<double>().value_or(0.0);
      // TOML spells nan and inf; no quantity of a scenario is either.
      if (!std::isfinite(value)) {
        problem(*node, key, fmt::format("expected a finite number, got {}", describe(*node)));
        return;
      }
      out = value;
    } else {
      problem(*node, key, fmt::format("expected a number, got {}", describe(*node)));
    }
  }

  // An array of exactly N integers, each in 1..2^31-1 (a shape).
  template <std::size_t N>
  void positive_integers(std::string_view key, std::array<std::int64_t, N>& out) {
    const toml::node* node = take(key);
    if (!node) return;
    const toml::array* array = node->as_array();
    std::array<std::int64_t, N> values{};
    bool ok = array && array->size() == N;
    for (std::size_t i = 0; ok && i < N; ++i) {
      const auto value = (*array)[i].value_exact<std::int64_t>();
      ok = value && *value > 0 && *value <= std::numeric_limits<std::int32_t>::max();
      if (ok) values[i] = *value;
    }
    if (!ok) {
      problem(*node, key, fmt::format("expected an array of {} positive integers, got {}", N, describe(*node)));
      return;
    }
    out = values;
  }

  void boolean(std::string_view key, bool& out) {
    const toml::node* node = take(key);
    if (!node) return;
    if (auto value = node->value_exact<bool>()) {
      out = *value;
    } else {
      problem(*node, key, fmt::format("expected true or false, got {}", describe(*node)));
    }
  }

  void text(std::string_view key, std::string& out) {
    const toml::node* node = take(key);
    if (!node) return;
    if (auto value = node->value_exact<std::string>()) {
      out = *value;
    } else {
      problem(*node, key, fmt::format("expected a string, got {}", describe(*node)));
    }
  }

  // A software release, "0.9.5" or "0.9" (a string: as a TOML number 0.10 would read as 0.1).
  void version(std::string_view key, std::array<int, 3>& out) {
    const toml::node* node = take(key);
    if (!node) return;
    const auto value = node->value_exact<std::string>();
    if (!value || !parse_version(*value, out)) {
      problem(*node, key, fmt::format("expected a release such as \"0.9.5\" (MAJOR.MINOR or MAJOR.MINOR.PATCH, "
                                      "quoted), got {}",
                                      describe(*node)));
    }
  }

  void unsigned_integer(std::string_view key, std::uint64_t& out) {
    std::int64_t value = static_cast<std::int64_t>(out);
    const bool present = has(key);
    integer(key, value);
    if (present && value < 0) {
      problems_.push_back(fmt::format("{}: {}.{} must be >= 0, got {}", source_, section_, key, value));
    }
    out = static_cast<std::uint64_t>(value);
  }

  template <typename Enum, std::size_t N>
  void choice(std::string_view key, Enum& out, const EnumName<Enum> (&table)[N]) {
    const toml::node* node = take(key);
    if (!node) return;
    auto value = node->value_exact<std::string>();
    if (!value) {
      problem(*node, key, fmt::format("expected one of {} (a string), got {}", allowed_names(table), describe(*node)));
      return;
    }
    for (const auto& entry : table) {
      if (lowercase(*value) == entry.name) {
        out = entry.value;
        return;
      }
    }
    problem(*node, key, fmt::format("unknown value \"{}\" (expected one of {})", *value, allowed_names(table)));
  }

  // Call after every known key was read: whatever is left is unknown.
  void reject_unknown_keys() {
    if (!table_) return;
    for (auto&& [key, node] : *table_) {
      if (read_.count(std::string(key.str()))) continue;
      problem(node, key.str(), "unknown key");
    }
  }

  // Marks keys that are valid but read elsewhere.
  void expect(std::string_view key) { read_.insert(std::string(key)); }

 private:
  const toml::node* take(std::string_view key) {
    read_.insert(std::string(key));
    if (!table_) return nullptr;
    return table_->get(key);
  }

  static std::string describe(const toml::node& node) {
    std::ostringstream out;
    if (node.is_string()) {
      out << "the string \"" << *node.value<std::string>() << "\"";
    } else if (node.is_table()) {
      out << "a table";
    } else if (node.is_array()) {
      out << "the array " << *node.as_array();
    } else if (node.is_boolean()) {
      out << (*node.value<bool>() ? "true" : "false");
    } else if (node.is_floating_point()) {
      // 8.0, not 8; 1e+30, not 1.e+30
      std::string shortest = fmt::format("{}", *node.value<double>());
      if (shortest.find_first_of(".einaEINA") == std::string::npos) shortest += ".0";
      out << "the float " << shortest;
    } else {
      node.visit([&out](auto&& value) {
        if constexpr (toml::is_value<decltype(value)>) out << *value;
      });
    }
    return out.str();
  }

  void problem(const toml::node& node, std::string_view key, const std::string& what) {
    const auto& begin = node.source().begin;
    if (begin.line > 0) {
      problems_.push_back(fmt::format("{}:{}:{}: {}.{}: {}", source_, begin.line, begin.column, section_, key, what));
    } else {
      problems_.push_back(fmt::format("{} (--set {}.{}): {}.{}: {}", source_, section_, key, section_, key, what));
    }
  }

  const toml::table* table_;
  std::string section_;
  std::string source_;
  std::vector<std::string>& problems_;
  std::set<std::string> read_;
};

const toml::table* section_table(const toml::table& root, std::string_view name, const std::string& source,
                                 std::vector<std::string>& problems) {
  const toml::node* node = root.get(name);
  if (!node) return nullptr;
  if (!node->is_table()) {
    problems.push_back(fmt::format("{}: [{}] must be a table", source, name));
    return nullptr;
  }
  return node->as_table();
}

void apply_override(toml::table& root, const Override& item, const std::string& source,
                    std::vector<std::string>& problems) {
  const auto dot = item.key.find('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 == item.key.size()) {
    problems.push_back(fmt::format("--set {}: expected SECTION.KEY=VALUE (e.g. parallel.pp=35)", item.key));
    return;
  }
  if (item.value.find_first_of("\r\n") != std::string::npos) {
    problems.push_back(fmt::format("--set {}: the value holds a line break (one KEY=VALUE per --set)", item.key));
    return;
  }
  const std::string section = item.key.substr(0, dot);
  const std::string key = item.key.substr(dot + 1);
  // A value that parses as TOML keeps its type (35, true, "x"); anything else is taken as a bare string (1f1b).
  toml::table holder;
  try {
    holder = toml::parse("value = " + item.value);
  } catch (const toml::parse_error&) {
    holder = toml::table{{"value", item.value}};
  }
  if (holder.size() != 1) holder = toml::table{{"value", item.value}};  // "4 # x" parses, "4 x=1" does not
  toml::table* target = root[section].as_table();
  if (!target) {
    if (root.contains(section)) {
      problems.push_back(fmt::format("{}: --set {}: [{}] is not a table", source, item.key, section));
      return;
    }
    root.insert(section, toml::table{});
    target = root[section].as_table();
  }
  target->insert_or_assign(key, *holder.get("value"));
}

std::vector<std::string> rule_violations(const Scenario& scenario, bool check_world_size);

}  // namespace

int dtype_bytes(DType dtype) {
  return dtype == DType::FP32 ? 4 : 2;
}
std::string_view to_string(DType value) {
  return name_of(kDTypes, value);
}
std::string_view to_string(ScheduleKind value) {
  return name_of(kSchedules, value);
}
std::string_view to_string(Recompute value) {
  return name_of(kRecomputes, value);
}
std::string_view to_string(PositionEmbedding value) {
  return name_of(kPositionEmbeddings, value);
}
std::string_view to_string(Norm value) {
  return name_of(kNorms, value);
}
std::string_view to_string(Activation value) {
  return name_of(kActivations, value);
}
std::string_view to_string(NodeKind value) {
  return name_of(kNodes, value);
}
std::string_view to_string(AttentionKind value) {
  return name_of(kAttentionKinds, value);
}

std::string_view to_string(Framework value) {
  return name_of(kFrameworks, value);
}

int default_gpus_per_node(NodeKind node) {
  switch (node) {
    case NodeKind::DgxA100:
      return 8;  // DGX A100 user guide: 8x A100-SXM4
    case NodeKind::DgxA100_40GB:
      return 8;  // the same chassis (DGX A100 320GB)
    case NodeKind::DgxH100:
      return 8;  // DGX H100 user guide: 8x H100-SXM5
    case NodeKind::DgxH200:
      return 8;  // DGX H200 datasheet: 8x H200-SXM
    case NodeKind::CpuHost:
      return 1;  // one worker per host unless gpus_per_node says otherwise
  }
  return 1;
}

double gpu_memory_bytes(NodeKind node) {
  constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
  switch (node) {
    case NodeKind::DgxA100:
      return 80 * GiB;  // A100-SXM4-80GB: 81920 MiB (NVIDIA A100 datasheet)
    case NodeKind::DgxA100_40GB:
      return 40 * GiB;  // A100-SXM4-40GB: 40960 MiB (NVIDIA A100 datasheet)
    case NodeKind::DgxH100:
      return 80 * GiB;  // H100-SXM5 80GB (NVIDIA H100 datasheet)
    case NodeKind::DgxH200:
      return 141e9;  // H200-SXM: 141 GB (NVIDIA H200 datasheet)
    case NodeKind::CpuHost:
      return 16 * GiB;  // nominal worker budget; the CPU backend checks real allocations
  }
  return 0;
}

std::int64_t Scenario::padded_vocab() const {
  const std::int64_t multiple =
      std::max<std::int64_t>(1, parallel.vocab_pad_multiple) * std::max<std::int64_t>(1, parallel.tp);
  return (model.vocab + multiple - 1) / multiple * multiple;
}

std::int64_t Scenario::layers_in_virtual_stage(std::int64_t virtual_stage) const {
  const auto& p = parallel;
  if (p.first_stage_layers <= 0 && p.last_stage_layers <= 0) return layers_per_chunk();
  if (virtual_stage == 0 && p.first_stage_layers > 0) return p.first_stage_layers;
  if (virtual_stage == p.pp - 1 && p.last_stage_layers > 0) return p.last_stage_layers;
  const std::int64_t middle = p.pp - (p.first_stage_layers > 0) - (p.last_stage_layers > 0);
  return middle > 0 ? (model.layers - p.first_stage_layers - p.last_stage_layers) / middle : 0;
}

std::int64_t Scenario::first_layer_of_virtual_stage(std::int64_t virtual_stage) const {
  std::int64_t first = 0;
  for (std::int64_t earlier = 0; earlier < virtual_stage; ++earlier) first += layers_in_virtual_stage(earlier);
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
    layers += std::min(parallel.recompute_num_layers, layers_in_virtual_stage(chunk * parallel.pp + stage));
  }
  return layers;
}

std::int64_t Scenario::layers_on_stage(std::int64_t stage) const {
  std::int64_t layers = 0;
  for (std::int64_t chunk = 0; chunk < parallel.virtual_stages; ++chunk) {
    layers += layers_in_virtual_stage(chunk * parallel.pp + stage);
  }
  return layers;
}

ScenarioError::ScenarioError(std::vector<std::string> problems)
    : std::runtime_error(problems.empty() ? std::string("invalid scenario") : problems.front()),
      problems_(std::move(problems)) {}

Override parse_override(std::string_view text) {
  const auto equals = text.find('=');
  if (equals == std::string_view::npos || equals == 0) {
    throw ScenarioError({fmt::format("--set '{}': expected SECTION.KEY=VALUE (e.g. parallel.pp=35)", text)});
  }
  return Override{std::string(text.substr(0, equals)), std::string(text.substr(equals + 1))};
}

Scenario load_scenario(const std::filesystem::path& path, const std::vector<Override>& overrides) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ScenarioError({fmt::format("{}: cannot open scenario file", path.string())});
  std::stringstream buffer;
  buffer << in.rdbuf();
  return parse_scenario(buffer.str(), path.string(), overrides);
}

Scenario parse_scenario(std::string_view toml_text, std::string_view source_name,
                        const std::vector<Override>& overrides) {
  const std::string source(source_name);
  toml::table root;
  try {
    root = toml::parse(toml_text, source_name);
  } catch (const toml::parse_error& error) {
    const auto& begin = error.source().begin;
    throw ScenarioError(
        {fmt::format("{}:{}:{}: malformed TOML: {}", source, begin.line, begin.column, error.description())});
  }

  std::vector<std::string> problems;
  for (const auto& item : overrides) apply_override(root, item, source, problems);
  if (!problems.empty()) throw ScenarioError(problems);

  for (auto&& [key, node] : root) {
    static const std::set<std::string> kSections = {"model", "parallel", "cluster", "framework", "training"};
    if (!kSections.count(std::string(key.str()))) {
      const auto& begin = node.source().begin;
      const std::string where = begin.line > 0 ? fmt::format("{}:{}:{}", source, begin.line, begin.column)
                                               : fmt::format("{} (--set {}.*)", source, key.str());
      problems.push_back(
          fmt::format("{}: unknown section [{}] (expected model, parallel, cluster, framework, "
                      "training)",
                      where, key.str()));
    }
  }

  Scenario scenario;
  scenario.source = source;

  SectionReader model(section_table(root, "model", source, problems), "model", source, problems);
  if (!root.contains("model")) problems.push_back(fmt::format("{}: the [model] section is required", source));
  model.text("name", scenario.model.name);
  model.integer("layers", scenario.model.layers);
  model.integer("hidden", scenario.model.hidden);
  model.integer("heads", scenario.model.heads);
  const std::size_t problems_before_ffn = problems.size();  // a value out of range is one problem, not two
  model.integer("ffn_hidden", scenario.model.ffn_hidden);
  if (model.has("ffn_hidden") && problems.size() == problems_before_ffn && scenario.model.ffn_hidden == 0) {
    problems.push_back(
        fmt::format("{}: model.ffn_hidden must be positive (leave it out for 4 x model.hidden), got 0", source));
  }
  model.integer("seq_len", scenario.model.seq_len);
  model.integer("vocab", scenario.model.vocab);
  model.choice("dtype", scenario.model.dtype, kDTypes);
  model.choice("position_embedding", scenario.model.position_embedding, kPositionEmbeddings);
  model.choice("norm", scenario.model.norm, kNorms);
  model.choice("activation", scenario.model.activation, kActivations);
  model.integer("kv_heads", scenario.model.kv_heads);
  if (model.has("kv_heads") && scenario.model.kv_heads == 0) {
    problems.push_back(
        fmt::format("{}: model.kv_heads must be positive (leave it out for as many as model.heads), got 0", source));
  }
  model.boolean("linear_bias", scenario.model.linear_bias);
  model.boolean("parallel_residual", scenario.model.parallel_residual);
  model.boolean("shared_norm", scenario.model.shared_norm);
  model.number("rotary_fraction", scenario.model.rotary_fraction);
  model.reject_unknown_keys();

  SectionReader cluster(section_table(root, "cluster", source, problems), "cluster", source, problems);
  const bool cluster_size_given = cluster.has("nodes") || cluster.has("gpus_per_node");
  cluster.integer("nodes", scenario.cluster.nodes);
  cluster.choice("node", scenario.cluster.node, kNodes);
  scenario.cluster.gpus_per_node = default_gpus_per_node(scenario.cluster.node);
  cluster.integer("gpus_per_node", scenario.cluster.gpus_per_node);
  cluster.number("gemm_tflops", scenario.cluster.gemm_tflops);
  if (cluster.has("gemm_shape") && !cluster.has("gemm_tflops")) {
    problems.push_back(
        fmt::format("{}: cluster.gemm_shape is the shape of a measurement: give its rate too "
                    "(cluster.gemm_tflops)",
                    source));
  }
  cluster.positive_integers("gemm_shape", scenario.cluster.gemm_shape);
  cluster.number("hbm_gb_per_s", scenario.cluster.hbm_gb_per_s);
  cluster.number("attention_gemm_hbm_fraction", scenario.cluster.attention_gemm_hbm_fraction);
  cluster.integer("nics_per_node", scenario.cluster.nics_per_node);
  cluster.number("nic_gbps", scenario.cluster.nic_gbps);
  cluster.number("host_us_per_kernel", scenario.cluster.host_us_per_kernel);
  cluster.reject_unknown_keys();

  SectionReader parallel(section_table(root, "parallel", source, problems), "parallel", source, problems);
  parallel.integer("tp", scenario.parallel.tp);
  parallel.integer("pp", scenario.parallel.pp);
  const bool dp_given = parallel.has("dp");
  parallel.integer("dp", scenario.parallel.dp);
  parallel.integer("micro_batch", scenario.parallel.micro_batch);
  const bool global_batch_given = parallel.has("global_batch");
  parallel.integer("global_batch", scenario.parallel.global_batch);
  parallel.choice("schedule", scenario.parallel.schedule, kSchedules);
  parallel.integer("virtual_stages", scenario.parallel.virtual_stages);
  parallel.choice("recompute", scenario.parallel.recompute, kRecomputes);
  parallel.boolean("sequence_parallel", scenario.parallel.sequence_parallel);
  parallel.integer("zero_stage", scenario.parallel.zero_stage);
  parallel.boolean("dp_overlap", scenario.parallel.dp_overlap);
  parallel.boolean("overlap_param_gather", scenario.parallel.overlap_param_gather);
  parallel.integer("vocab_pad_multiple", scenario.parallel.vocab_pad_multiple);
  parallel.integer("first_stage_layers", scenario.parallel.first_stage_layers);
  parallel.integer("last_stage_layers", scenario.parallel.last_stage_layers);
  parallel.integer("recompute_num_layers", scenario.parallel.recompute_num_layers);
  parallel.reject_unknown_keys();

  SectionReader framework(section_table(root, "framework", source, problems), "framework", source, problems);
  framework.choice("name", scenario.framework.name, kFrameworks);
  framework.boolean("tied_embeddings", scenario.framework.tied_embeddings);
  framework.boolean("dropout", scenario.framework.dropout);
  const bool fused_kernels_given = framework.has("fused_kernels");
  framework.boolean("fused_kernels", scenario.framework.fused_kernels);
  framework.choice("attention", scenario.framework.attention, kAttentionKinds);
  // Unset, both follow sequence parallelism: the Megatron-LM versions that have it (2022 on) overlap its backward
  // all-gather and reduce-scatter inside LinearWithGradAccumulationAndAsyncCommunication whatever the flags say, and
  // fuse gradient accumulation by default (--no-gradient-accumulation-fusion turns it off); 2021's had neither.
  scenario.framework.tp_comm_overlap = scenario.parallel.sequence_parallel;
  scenario.framework.gradient_accumulation_fusion = scenario.parallel.sequence_parallel;
  framework.boolean("tp_comm_overlap", scenario.framework.tp_comm_overlap);
  framework.boolean("gradient_accumulation_fusion", scenario.framework.gradient_accumulation_fusion);
  framework.boolean("pipeline_gather_copies", scenario.framework.pipeline_gather_copies);
  framework.boolean("bf16_optimizer", scenario.framework.bf16_optimizer);
  framework.boolean("partition_activations", scenario.framework.partition_activations);
  framework.version("deepspeed_version", scenario.framework.deepspeed_version);
  framework.reject_unknown_keys();
  if (scenario.framework.name == Framework::Composer) {
    // Composer runs PyTorch's own elementwise kernels (sim/cost_model.cpp); Megatron's fused ones are not there.
    if (fused_kernels_given) {
      problems.push_back(
          fmt::format("{}: framework.fused_kernels selects Megatron-LM's fused kernels; "
                      "framework.name = \"composer\" runs PyTorch's own: leave it out",
                      source));
    }
    scenario.framework.fused_kernels = false;
  }

  SectionReader training(section_table(root, "training", source, problems), "training", source, problems);
  training.unsigned_integer("seed", scenario.training.seed);
  training.number("learning_rate", scenario.training.learning_rate);
  scenario.training.min_learning_rate = scenario.training.learning_rate;
  training.number("min_learning_rate", scenario.training.min_learning_rate);
  training.integer("warmup_steps", scenario.training.warmup_steps);
  training.integer("decay_steps", scenario.training.decay_steps);
  training.number("weight_decay", scenario.training.weight_decay);
  training.number("grad_clip", scenario.training.grad_clip);
  training.number("adam_beta1", scenario.training.adam_beta1);
  training.number("adam_beta2", scenario.training.adam_beta2);
  training.number("adam_eps", scenario.training.adam_eps);
  training.number("init_std", scenario.training.init_std);
  training.reject_unknown_keys();
  // A field that could not be read keeps its default, and rules about it would only mislead ("layers must be
  // positive, got 0" after "layers: expected an integer"): what could not be read is reported alone.
  if (!problems.empty()) throw ScenarioError(problems);

  // Defaults that depend on other fields.
  auto& p = scenario.parallel;
  bool dp_underivable = false;
  if (scenario.cluster.node == NodeKind::CpuHost && !cluster_size_given) {
    // A CPU run has as many workers as the plan needs: one host, tp * pp * dp workers (dp defaults to 1).
    scenario.cluster.nodes = 1;
    scenario.cluster.gpus_per_node = std::max<std::int64_t>(1, p.tp * p.pp * p.dp);
  } else if (!dp_given && p.tp > 0 && p.pp > 0) {
    const std::int64_t gpus = scenario.cluster.total_gpus();
    if (gpus > 0 && gpus % (p.tp * p.pp) != 0) {
      dp_underivable = true;
      problems.push_back(fmt::format(
          "{}: parallel.dp: cannot derive dp: the cluster's {} GPUs ({} nodes x {}) are not a multiple of tp*pp = {}",
          source, gpus, scenario.cluster.nodes, scenario.cluster.gpus_per_node, p.tp * p.pp));
    } else {
      p.dp = std::max<std::int64_t>(1, gpus / (p.tp * p.pp));
    }
  }
  if (!global_batch_given) p.global_batch = p.dp * p.micro_batch;

  // Every rule the fields break, together (but the world size, when dp could not be derived, was reported already).
  for (auto& problem : rule_violations(scenario, /*check_world_size=*/!dp_underivable)) {
    problems.push_back(std::move(problem));
  }
  if (!problems.empty()) throw ScenarioError(problems);
  return scenario;
}

std::vector<std::string> validation_problems(const Scenario& scenario) {
  return rule_violations(scenario, true);
}

namespace {

std::vector<std::string> rule_violations(const Scenario& scenario, bool check_world_size) {
  std::vector<std::string> problems;
  const std::string& src = scenario.source;
  auto require_positive = [&](std::string_view field, std::int64_t value) {
    if (value <= 0) problems.push_back(fmt::format("{}: {} must be a positive integer, got {}", src, field, value));
    return value > 0;
  };
  const auto& m = scenario.model;
  const auto& p = scenario.parallel;
  const auto& c = scenario.cluster;
  const auto& t = scenario.training;

  if (m.name.empty()) problems.push_back(fmt::format("{}: model.name must not be empty (it names every report)", src));
  const bool layers_ok = require_positive("model.layers", m.layers);
  const bool hidden_ok = require_positive("model.hidden", m.hidden);
  const bool heads_ok = require_positive("model.heads", m.heads);
  const bool seq_ok = require_positive("model.seq_len", m.seq_len);
  require_positive("model.vocab", m.vocab);
  if (m.ffn_hidden < 0)
    problems.push_back(fmt::format("{}: model.ffn_hidden must be positive, got {}", src, m.ffn_hidden));
  const bool tp_ok = require_positive("parallel.tp", p.tp);
  const bool pp_ok = require_positive("parallel.pp", p.pp);
  const bool dp_ok = require_positive("parallel.dp", p.dp);
  const bool mb_ok = require_positive("parallel.micro_batch", p.micro_batch);
  const bool gb_ok = require_positive("parallel.global_batch", p.global_batch);
  const bool v_ok = require_positive("parallel.virtual_stages", p.virtual_stages);
  require_positive("parallel.vocab_pad_multiple", p.vocab_pad_multiple);
  const bool nodes_ok = require_positive("cluster.nodes", c.nodes);
  const bool gpn_ok = require_positive("cluster.gpus_per_node", c.gpus_per_node);

  if (hidden_ok && heads_ok && m.hidden % m.heads != 0) {
    problems.push_back(
        fmt::format("{}: model.hidden ({}) must be divisible by model.heads ({})", src, m.hidden, m.heads));
  }
  if (heads_ok && tp_ok && m.heads % p.tp != 0) {
    problems.push_back(
        fmt::format("{}: model.heads ({}) must be divisible by parallel.tp ({}): each TP rank holds "
                    "whole attention heads",
                    src, m.heads, p.tp));
  }
  if (m.kv_heads < 0) {
    problems.push_back(fmt::format("{}: model.kv_heads must be positive, got {}", src, m.kv_heads));
  } else if (heads_ok && m.heads % m.key_value_heads() != 0) {
    problems.push_back(
        fmt::format("{}: model.heads ({}) must be divisible by model.kv_heads ({}): each key/value head serves a "
                    "whole group of query heads",
                    src, m.heads, m.key_value_heads()));
  } else if (heads_ok && tp_ok && m.key_value_heads() % p.tp != 0) {
    problems.push_back(
        fmt::format("{}: model.kv_heads ({}) must be divisible by parallel.tp ({}): each TP rank holds whole "
                    "key/value heads (Megatron-Core's num_query_groups % tensor_model_parallel_size == 0)",
                    src, m.key_value_heads(), p.tp));
  }
  if (m.shared_norm && !m.parallel_residual) {
    problems.push_back(
        fmt::format("{}: model.shared_norm lets one layer norm feed both branches of a parallel block: it needs "
                    "model.parallel_residual = true",
                    src));
  }
  const bool rope = m.position_embedding == PositionEmbedding::Rope;
  if (!(m.rotary_fraction > 0 && m.rotary_fraction <= 1)) {
    problems.push_back(fmt::format("{}: model.rotary_fraction must be in (0, 1], got {}", src, m.rotary_fraction));
  } else if (m.rotary_fraction != 1 && !rope) {
    problems.push_back(
        fmt::format("{}: model.rotary_fraction = {} needs model.position_embedding = \"rope\" (got \"{}\")", src,
                    m.rotary_fraction, to_string(m.position_embedding)));
  } else if (hidden_ok && heads_ok && m.hidden % m.heads == 0 && rope && m.rotary_fraction == 1 &&
             m.head_dim() % 2 != 0) {
    problems.push_back(
        fmt::format("{}: model.position_embedding = \"rope\" rotates pairs of a head's dimensions: model.hidden / "
                    "model.heads = {} must be even",
                    src, m.head_dim()));
  } else if (hidden_ok && heads_ok && m.hidden % m.heads == 0 && rope &&
             (m.rotary_dim() < 2 || m.rotary_dim() % 2 != 0)) {
    problems.push_back(fmt::format(
        "{}: model.rotary_fraction = {} rotates int({} x {}) = {} dimensions of each head: it must be a positive "
        "even number (whole pairs)",
        src, m.rotary_fraction, m.head_dim(), m.rotary_fraction, m.rotary_dim()));
  }
  if (hidden_ok && tp_ok && m.ffn_hidden >= 0 && scenario.ffn_hidden() % p.tp != 0) {
    problems.push_back(fmt::format("{}: model.ffn_hidden ({}) must be divisible by parallel.tp ({})", src,
                                   scenario.ffn_hidden(), p.tp));
  }
  const bool uneven = p.first_stage_layers != 0 || p.last_stage_layers != 0;
  if (uneven) {
    const std::int64_t given = (p.first_stage_layers > 0) + (p.last_stage_layers > 0);
    if (p.first_stage_layers < 0 || p.last_stage_layers < 0) {
      problems.push_back(
          fmt::format("{}: parallel.first_stage_layers and parallel.last_stage_layers must be >= 0 (0: "
                      "an even split), got {} and {}",
                      src, p.first_stage_layers, p.last_stage_layers));
    } else if (v_ok && p.virtual_stages != 1) {
      problems.push_back(
          fmt::format("{}: parallel.first_stage_layers / last_stage_layers need parallel.virtual_stages "
                      "= 1 (an interleaved split is even), got {}",
                      src, p.virtual_stages));
    } else if (pp_ok && layers_ok && p.pp < 2) {
      problems.push_back(
          fmt::format("{}: parallel.first_stage_layers / last_stage_layers need a pipeline "
                      "(parallel.pp >= 2), got parallel.pp = {}",
                      src, p.pp));
    } else if (pp_ok && layers_ok) {
      const std::int64_t middle = p.pp - given, rest = m.layers - p.first_stage_layers - p.last_stage_layers;
      const bool fits = middle == 0 ? rest == 0 : rest >= middle && rest % middle == 0;
      if (!fits) {
        problems.push_back(
            fmt::format("{}: model.layers ({}) minus parallel.first_stage_layers ({}) and "
                        "parallel.last_stage_layers ({}) leaves {} for the other {} stage(s): it must "
                        "split evenly, at least one layer each",
                        src, m.layers, p.first_stage_layers, p.last_stage_layers, rest, middle));
      }
    }
  }
  if (!uneven && layers_ok && pp_ok && v_ok && m.layers % (p.pp * p.virtual_stages) != 0) {
    problems.push_back(
        fmt::format("{}: model.layers ({}) must be divisible by parallel.pp * parallel.virtual_stages "
                    "({} * {} = {})",
                    src, m.layers, p.pp, p.virtual_stages, p.pp * p.virtual_stages));
  }
  if (dp_ok && mb_ok && gb_ok && p.global_batch % (p.dp * p.micro_batch) != 0) {
    problems.push_back(
        fmt::format("{}: parallel.global_batch ({}) must be divisible by parallel.dp * "
                    "parallel.micro_batch ({} * {} = {})",
                    src, p.global_batch, p.dp, p.micro_batch, p.dp * p.micro_batch));
  }
  if (check_world_size && tp_ok && pp_ok && dp_ok && nodes_ok && gpn_ok && p.world_size() != c.total_gpus()) {
    problems.push_back(
        fmt::format("{}: parallel.tp * parallel.pp * parallel.dp = {} * {} * {} = {} does not match the "
                    "cluster's {} GPUs (cluster.nodes {} x cluster.gpus_per_node {})",
                    src, p.tp, p.pp, p.dp, p.world_size(), c.total_gpus(), c.nodes, c.gpus_per_node));
  }
  if (v_ok && p.virtual_stages > 1 && p.schedule != ScheduleKind::Interleaved) {
    problems.push_back(
        fmt::format("{}: parallel.virtual_stages = {} needs parallel.schedule = \"interleaved\" (got "
                    "\"{}\")",
                    src, p.virtual_stages, to_string(p.schedule)));
  }
  if (p.schedule == ScheduleKind::Interleaved) {
    if (v_ok && p.virtual_stages < 2) {
      problems.push_back(
          fmt::format("{}: parallel.schedule = \"interleaved\" needs parallel.virtual_stages >= 2, "
                      "got {}",
                      src, p.virtual_stages));
    }
    if (pp_ok && p.pp < 2) {
      problems.push_back(
          fmt::format("{}: parallel.schedule = \"interleaved\" needs parallel.pp >= 2, got {}", src, p.pp));
    }
    if (dp_ok && mb_ok && gb_ok && pp_ok && p.global_batch % (p.dp * p.micro_batch) == 0 &&
        p.micro_batches() % p.pp != 0) {
      problems.push_back(
          fmt::format("{}: the interleaved schedule runs micro-batches in groups of parallel.pp: "
                      "micro-batches per pipeline (global_batch / (dp * micro_batch) = {}) must be "
                      "divisible by parallel.pp ({})",
                      src, p.micro_batches(), p.pp));
    }
  }
  // 0 means "not measured"; anything else must be a real rate (the GPU's own ceiling is checked by the simulator,
  // which knows the GPU).
  if (!(c.gemm_tflops >= 0 && std::isfinite(c.gemm_tflops))) {
    problems.push_back(
        fmt::format("{}: cluster.gemm_tflops must be a measured rate in TFLOP/s (> 0), or 0 for the "
                    "cited value; got {}",
                    src, c.gemm_tflops));
  }
  if (!(c.hbm_gb_per_s >= 0 && std::isfinite(c.hbm_gb_per_s))) {
    problems.push_back(
        fmt::format("{}: cluster.hbm_gb_per_s must be a measured bandwidth in GB/s (> 0), or 0 for "
                    "the cited value; got {}",
                    src, c.hbm_gb_per_s));
  }
  if (!(c.attention_gemm_hbm_fraction >= 0 && c.attention_gemm_hbm_fraction <= 1 &&
        std::isfinite(c.attention_gemm_hbm_fraction))) {
    problems.push_back(
        fmt::format("{}: cluster.attention_gemm_hbm_fraction must be a measured fraction of the "
                    "streaming rate (0 < f <= 1), or 0 for the cited value; got {}",
                    src, c.attention_gemm_hbm_fraction));
  }
  // 0 means "the node's"; anything else must describe a real network (up to 32 NICs of 1.6 Tb/s: beyond any node).
  if (c.nics_per_node < 0 || c.nics_per_node > 32) {
    problems.push_back(
        fmt::format("{}: cluster.nics_per_node must be 1..32 compute NICs per node, or 0 for the "
                    "node's own; got {}",
                    src, c.nics_per_node));
  }
  if (!(c.nic_gbps >= 0 && c.nic_gbps <= 1600 && std::isfinite(c.nic_gbps)) || (c.nic_gbps > 0 && c.nic_gbps < 1)) {
    problems.push_back(
        fmt::format("{}: cluster.nic_gbps must be a NIC line rate in Gb/s (1..1600), or 0 for the "
                    "node's own; got {}",
                    src, c.nic_gbps));
  }
  // A host takes microseconds to issue a kernel, not nanoseconds (a value in seconds?) nor tens of milliseconds.
  if (!(c.host_us_per_kernel == 0 || (c.host_us_per_kernel >= 0.1 && c.host_us_per_kernel <= 10000))) {
    problems.push_back(
        fmt::format("{}: cluster.host_us_per_kernel must be the host's microseconds to issue one kernel "
                    "(0.1..10000), or 0 for a host that is never behind; got {}",
                    src, c.host_us_per_kernel));
  }
  const bool composer = scenario.framework.name == Framework::Composer;
  if (p.zero_stage != 0 && p.zero_stage != 1 && p.zero_stage != 3) {
    problems.push_back(fmt::format("{}: parallel.zero_stage must be 0, 1 or 3, got {}", src, p.zero_stage));
  } else if (p.zero_stage == 3 && !composer) {
    problems.push_back(
        fmt::format("{}: parallel.zero_stage = 3 is PyTorch FSDP's FULL_SHARD, which twin models as Composer runs "
                    "it: it needs framework.name = \"composer\", got \"{}\"",
                    src, to_string(scenario.framework.name)));
  } else if (p.zero_stage == 1 && composer) {
    problems.push_back(
        fmt::format("{}: framework.name = \"composer\" shards with FSDP: parallel.zero_stage must be 3 "
                    "(FULL_SHARD) or 0 (DDP), got 1",
                    src));
  }
  // FlashAttention's kernels take heads of at most 128 (v1) or 256 (v2) (flash-attention's README, "head dimensions
  // up to 128" for v1 and "all head dimensions up to 256" for v2).
  if (heads_ok && hidden_ok && m.heads > 0) {
    const std::int64_t head_dim = m.hidden / m.heads;
    const std::int64_t most = scenario.framework.attention == AttentionKind::Flash1   ? 128
                              : scenario.framework.attention == AttentionKind::Flash2 ? 256
                                                                                      : 0;
    if (most > 0 && head_dim > most) {
      problems.push_back(
          fmt::format("{}: framework.attention = \"{}\" takes heads of at most {} dimensions; "
                      "model.hidden / model.heads = {} / {} = {}",
                      src, to_string(scenario.framework.attention), most, m.hidden, m.heads, head_dim));
    }
  }
  // Composer (llm-foundry's MPT) has neither tensor nor pipeline parallelism, nor Megatron's selective or block
  // recompute: its activation checkpointing wraps whole blocks.
  if (composer) {
    if (tp_ok && p.tp != 1) {
      problems.push_back(
          fmt::format("{}: framework.name = \"composer\" has no tensor parallelism: "
                      "parallel.tp must be 1, got {}",
                      src, p.tp));
    }
    if (pp_ok && p.pp != 1) {
      problems.push_back(
          fmt::format("{}: framework.name = \"composer\" has no pipeline parallelism: "
                      "parallel.pp must be 1, got {}",
                      src, p.pp));
    }
    if (p.zero_stage == 0 && p.dp > 1 && !p.dp_overlap) {
      problems.push_back(
          fmt::format("{}: framework.name = \"composer\" with parallel.zero_stage = 0 is PyTorch "
                      "DDP, which reduces its gradient buckets under the backward: "
                      "parallel.dp_overlap must be true",
                      src));
    }
    if (p.recompute == Recompute::Selective) {
      problems.push_back(
          fmt::format("{}: framework.name = \"composer\" checkpoints whole blocks: "
                      "parallel.recompute must be \"none\" or \"full\", got \"selective\"",
                      src));
    }
    // Composer's blocks are MPT's (LayerNorm, GELU, multi-head attention, biases); Llama-style blocks are
    // Megatron-Core's here.
    const bool mpt_block = m.norm == Norm::LayerNorm && m.activation == Activation::Gelu &&
                           m.position_embedding != PositionEmbedding::Rope && m.key_value_heads() == m.heads &&
                           m.linear_bias && !m.parallel_residual;
    if (!mpt_block) {
      problems.push_back(
          fmt::format("{}: framework.name = \"composer\" runs MPT's blocks (LayerNorm, GELU, no rotary embedding, "
                      "multi-head attention, biases, attention then MLP): model.norm, activation, "
                      "position_embedding, kv_heads, linear_bias and parallel_residual must keep their defaults "
                      "(Llama-style and parallel blocks: framework.name = \"megatron\")",
                      src));
    }
  }
  // Megatron-LM's block recompute: a number of layers per chunk, of full recompute, in Megatron's own layers
  // (DeepSpeed's pipeline engine checkpoints every activation_checkpoint_interval layers instead).
  if (p.recompute_num_layers < 0) {
    problems.push_back(fmt::format("{}: parallel.recompute_num_layers must be >= 0 (0: every layer), got {}", src,
                                   p.recompute_num_layers));
  } else if (p.recompute_num_layers > 0 && p.recompute != Recompute::Full) {
    problems.push_back(
        fmt::format("{}: parallel.recompute_num_layers ({}) needs parallel.recompute = \"full\" "
                    "(Megatron-LM's --recompute-method block), got \"{}\"",
                    src, p.recompute_num_layers, to_string(p.recompute)));
  } else if (p.recompute_num_layers > 0 && scenario.framework.name != Framework::Megatron) {
    problems.push_back(
        fmt::format("{}: parallel.recompute_num_layers is Megatron-LM's block recompute; "
                    "framework.name = \"{}\" checkpoints every layer",
                    src, to_string(scenario.framework.name)));
  } else if (p.recompute_num_layers > 0 && layers_ok && pp_ok && v_ok) {
    // Megatron recomputes the first N layers of each chunk: more than the largest chunk holds is a typo.
    const std::int64_t middle_stages = p.pp - (p.first_stage_layers > 0) - (p.last_stage_layers > 0);
    const std::int64_t middle_layers = m.layers - p.first_stage_layers - p.last_stage_layers;
    const std::int64_t largest_chunk = uneven ? std::max({p.first_stage_layers, p.last_stage_layers,
                                                          middle_stages > 0 ? middle_layers / middle_stages : 0})
                                              : m.layers / (p.pp * p.virtual_stages);
    if (p.recompute_num_layers > largest_chunk) {
      problems.push_back(
          fmt::format("{}: parallel.recompute_num_layers ({}) is more than a chunk's layers ({}): "
                      "it counts layers per chunk (0: every layer)",
                      src, p.recompute_num_layers, largest_chunk));
    }
  }
  // BF16_Optimizer is DeepSpeed's, for bf16 only, and always shards the fp32 weights and Adam's moments across DP
  // (ZeRO-1 in twin's terms, though DeepSpeed's config says stage 0: its pipeline engine refuses bf16 with ZeRO).
  if (scenario.framework.bf16_optimizer) {
    if (scenario.framework.name != Framework::DeepSpeed) {
      problems.push_back(
          fmt::format("{}: framework.bf16_optimizer is DeepSpeed's (framework.name = \"deepspeed\"), "
                      "got framework.name = \"{}\"",
                      src, to_string(scenario.framework.name)));
    }
    if (m.dtype != DType::BF16) {
      problems.push_back(
          fmt::format("{}: framework.bf16_optimizer trains in bf16: model.dtype must be \"bf16\", got "
                      "\"{}\"",
                      src, to_string(m.dtype)));
    }
    if (p.zero_stage != 1) {
      problems.push_back(
          fmt::format("{}: framework.bf16_optimizer shards the optimizer state across DP as ZeRO-1 does: "
                      "parallel.zero_stage must be 1, got {}",
                      src, p.zero_stage));
    }
  }
  // framework.deepspeed_version names the DeepSpeed release whose engine ran; twin's model of that engine starts with
  // its pipeline engine (0.3.0, September 2020), and BF16_Optimizer with 0.6.2 (April 2022).
  const std::array<int, 3> version = scenario.framework.deepspeed_version;
  if (version != std::array<int, 3>{0, 0, 0}) {
    if (scenario.framework.name != Framework::DeepSpeed) {
      problems.push_back(fmt::format("{}: framework.deepspeed_version is DeepSpeed's release: it needs "
                                     "framework.name = \"deepspeed\", got \"{}\"",
                                     src, to_string(scenario.framework.name)));
    }
    if (version < std::array<int, 3>{0, 3, 0}) {
      problems.push_back(fmt::format("{}: framework.deepspeed_version = \"{}\" predates DeepSpeed's pipeline engine "
                                     "(0.3.0), where twin's model of DeepSpeed starts",
                                     src, version_text(version)));
    } else if (scenario.framework.bf16_optimizer && version < std::array<int, 3>{0, 6, 2}) {
      problems.push_back(fmt::format("{}: framework.bf16_optimizer is DeepSpeed's BF16_Optimizer, first released in "
                                     "0.6.2; framework.deepspeed_version = \"{}\" has none",
                                     src, version_text(version)));
    }
  }
  // Megatron-Core's --overlap-param-gather: "only supported with distributed optimizer" and "Must use
  // --overlap-param-gather with --overlap-grad-reduce" (megatron/training/arguments.py).
  if (p.overlap_param_gather) {
    const std::string needs = "parallel.overlap_param_gather is Megatron-Core's --overlap-param-gather: it needs";
    if (scenario.framework.name != Framework::Megatron) {
      problems.push_back(fmt::format("{}: {} framework.name = \"megatron\", got \"{}\"", src, needs,
                                     to_string(scenario.framework.name)));
    }
    if (p.zero_stage != 1) {
      problems.push_back(
          fmt::format("{}: {} the distributed optimizer, parallel.zero_stage = 1, got {}", src, needs, p.zero_stage));
    }
    if (!p.dp_overlap) {
      problems.push_back(fmt::format("{}: {} --overlap-grad-reduce, parallel.dp_overlap = true", src, needs));
    }
  }
  // DeepSpeed partitions a checkpointed layer's input across its model-parallel group before keeping it: it needs
  // DeepSpeed's checkpointing of every layer, ranks to partition across, and a whole input to partition.
  if (scenario.framework.partition_activations) {
    const std::string needs =
        "framework.partition_activations is DeepSpeed's activation checkpointing option: it needs";
    if (scenario.framework.name != Framework::DeepSpeed) {
      problems.push_back(fmt::format("{}: {} framework.name = \"deepspeed\", got \"{}\"", src, needs,
                                     to_string(scenario.framework.name)));
    }
    if (p.recompute != Recompute::Full) {
      problems.push_back(
          fmt::format("{}: {} parallel.recompute = \"full\", got \"{}\"", src, needs, to_string(p.recompute)));
    }
    if (tp_ok && p.tp < 2) {
      problems.push_back(fmt::format("{}: {} parallel.tp > 1 to partition across, got {}", src, needs, p.tp));
    }
    if (p.sequence_parallel) {
      problems.push_back(
          fmt::format("{}: {} parallel.sequence_parallel = false (the input is already split)", src, needs));
    }
  }
  if (p.sequence_parallel && seq_ok && tp_ok && m.seq_len % p.tp != 0) {
    problems.push_back(
        fmt::format("{}: parallel.sequence_parallel needs model.seq_len ({}) divisible by parallel.tp "
                    "({})",
                    src, m.seq_len, p.tp));
  }
  if (!(t.learning_rate > 0)) {
    problems.push_back(fmt::format("{}: training.learning_rate must be > 0, got {}", src, t.learning_rate));
  }
  if (t.min_learning_rate < 0 || t.min_learning_rate > t.learning_rate) {
    problems.push_back(fmt::format("{}: training.min_learning_rate must be in [0, learning_rate = {}], got {}", src,
                                   t.learning_rate, t.min_learning_rate));
  }
  if (t.warmup_steps < 0)
    problems.push_back(fmt::format("{}: training.warmup_steps must be >= 0, got {}", src, t.warmup_steps));
  if (t.decay_steps < 0)
    problems.push_back(fmt::format("{}: training.decay_steps must be >= 0, got {}", src, t.decay_steps));
  if (t.weight_decay < 0)
    problems.push_back(fmt::format("{}: training.weight_decay must be >= 0, got {}", src, t.weight_decay));
  if (t.grad_clip < 0)
    problems.push_back(fmt::format("{}: training.grad_clip must be >= 0 (0 disables), got {}", src, t.grad_clip));
  if (!(t.adam_beta1 >= 0 && t.adam_beta1 < 1)) {
    problems.push_back(fmt::format("{}: training.adam_beta1 must be in [0, 1), got {}", src, t.adam_beta1));
  }
  if (!(t.adam_beta2 >= 0 && t.adam_beta2 < 1)) {
    problems.push_back(fmt::format("{}: training.adam_beta2 must be in [0, 1), got {}", src, t.adam_beta2));
  }
  if (!(t.adam_eps > 0)) problems.push_back(fmt::format("{}: training.adam_eps must be > 0, got {}", src, t.adam_eps));
  if (!(t.init_std > 0)) problems.push_back(fmt::format("{}: training.init_std must be > 0, got {}", src, t.init_std));
  return problems;
}

}  // namespace

std::string version_text(const std::array<int, 3>& version) {
  return fmt::format("{}.{}.{}", version[0], version[1], version[2]);
}

std::array<int, 3> deepspeed_release(const FrameworkSpec& framework) {
  if (framework.deepspeed_version != std::array<int, 3>{0, 0, 0}) return framework.deepspeed_version;
  return framework.bf16_optimizer ? std::array<int, 3>{0, 6, 2} : std::array<int, 3>{0, 5, 0};
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

std::string to_toml(const Scenario& s) {
  std::string out;
  auto line = [&out](std::string text) { out += text + "\n"; };
  line("[model]");
  line(fmt::format("name = \"{}\"", s.model.name));
  line(fmt::format("layers = {}", s.model.layers));
  line(fmt::format("hidden = {}", s.model.hidden));
  line(fmt::format("heads = {}", s.model.heads));
  line(fmt::format("ffn_hidden = {}", s.ffn_hidden()));
  line(fmt::format("seq_len = {}", s.model.seq_len));
  line(fmt::format("vocab = {}", s.model.vocab));
  line(fmt::format("dtype = \"{}\"", to_string(s.model.dtype)));
  line(fmt::format("position_embedding = \"{}\"", to_string(s.model.position_embedding)));
  line(fmt::format("norm = \"{}\"", to_string(s.model.norm)));
  line(fmt::format("activation = \"{}\"", to_string(s.model.activation)));
  line(fmt::format("kv_heads = {}", s.model.key_value_heads()));
  line(fmt::format("linear_bias = {}", s.model.linear_bias));
  line(fmt::format("parallel_residual = {}", s.model.parallel_residual));
  line(fmt::format("shared_norm = {}", s.model.shared_norm));
  line(fmt::format("rotary_fraction = {}", s.model.rotary_fraction));
  line("\n[parallel]");
  line(fmt::format("tp = {}", s.parallel.tp));
  line(fmt::format("pp = {}", s.parallel.pp));
  line(fmt::format("dp = {}", s.parallel.dp));
  line(fmt::format("micro_batch = {}", s.parallel.micro_batch));
  line(fmt::format("global_batch = {}", s.parallel.global_batch));
  line(fmt::format("schedule = \"{}\"", to_string(s.parallel.schedule)));
  line(fmt::format("virtual_stages = {}", s.parallel.virtual_stages));
  line(fmt::format("recompute = \"{}\"", to_string(s.parallel.recompute)));
  line(fmt::format("sequence_parallel = {}", s.parallel.sequence_parallel));
  line(fmt::format("zero_stage = {}", s.parallel.zero_stage));
  if (s.parallel.first_stage_layers > 0) line(fmt::format("first_stage_layers = {}", s.parallel.first_stage_layers));
  if (s.parallel.last_stage_layers > 0) line(fmt::format("last_stage_layers = {}", s.parallel.last_stage_layers));
  if (s.parallel.recompute_num_layers > 0) {
    line(fmt::format("recompute_num_layers = {}", s.parallel.recompute_num_layers));
  }
  line(fmt::format("dp_overlap = {}", s.parallel.dp_overlap));
  if (s.parallel.overlap_param_gather) line("overlap_param_gather = true");
  line(fmt::format("vocab_pad_multiple = {}", s.parallel.vocab_pad_multiple));
  line("\n[cluster]");
  line(fmt::format("nodes = {}", s.cluster.nodes));
  line(fmt::format("node = \"{}\"", to_string(s.cluster.node)));
  line(fmt::format("gpus_per_node = {}", s.cluster.gpus_per_node));
  if (s.cluster.gemm_tflops > 0) {
    line(fmt::format("gemm_tflops = {:.17g}", s.cluster.gemm_tflops));
    line(fmt::format("gemm_shape = [{}, {}, {}]", s.cluster.gemm_shape[0], s.cluster.gemm_shape[1],
                     s.cluster.gemm_shape[2]));
  }
  if (s.cluster.hbm_gb_per_s > 0) line(fmt::format("hbm_gb_per_s = {:.17g}", s.cluster.hbm_gb_per_s));
  if (s.cluster.attention_gemm_hbm_fraction > 0) {
    line(fmt::format("attention_gemm_hbm_fraction = {:.17g}", s.cluster.attention_gemm_hbm_fraction));
  }
  if (s.cluster.nics_per_node > 0) line(fmt::format("nics_per_node = {}", s.cluster.nics_per_node));
  if (s.cluster.nic_gbps > 0) line(fmt::format("nic_gbps = {:.17g}", s.cluster.nic_gbps));
  if (s.cluster.host_us_per_kernel > 0) {
    line(fmt::format("host_us_per_kernel = {:.17g}", s.cluster.host_us_per_kernel));
  }
  line("\n[framework]");
  line(fmt::format("name = \"{}\"", to_string(s.framework.name)));
  line(fmt::format("tied_embeddings = {}", s.framework.tied_embeddings));
  line(fmt::format("dropout = {}", s.framework.dropout));
  if (s.framework.name != Framework::Composer) line(fmt::format("fused_kernels = {}", s.framework.fused_kernels));
  line(fmt::format("attention = \"{}\"", to_string(s.framework.attention)));
  line(fmt::format("tp_comm_overlap = {}", s.framework.tp_comm_overlap));
  line(fmt::format("gradient_accumulation_fusion = {}", s.framework.gradient_accumulation_fusion));
  line(fmt::format("pipeline_gather_copies = {}", s.framework.pipeline_gather_copies));
  line(fmt::format("bf16_optimizer = {}", s.framework.bf16_optimizer));
  line(fmt::format("partition_activations = {}", s.framework.partition_activations));
  if (s.framework.deepspeed_version != std::array<int, 3>{0, 0, 0}) {
    line(fmt::format("deepspeed_version = \"{}\"", version_text(s.framework.deepspeed_version)));
  }
  line("\n[training]");
  line(fmt::format("seed = {}", s.training.seed));
  line(fmt::format("learning_rate = {:.17g}", s.training.learning_rate));
  line(fmt::format("min_learning_rate = {:.17g}", s.training.min_learning_rate));
  line(fmt::format("warmup_steps = {}", s.training.warmup_steps));
  line(fmt::format("decay_steps = {}", s.training.decay_steps));
  line(fmt::format("weight_decay = {:.17g}", s.training.weight_decay));
  line(fmt::format("grad_clip = {:.17g}", s.training.grad_clip));
  line(fmt::format("adam_beta1 = {:.17g}", s.training.adam_beta1));
  line(fmt::format("adam_beta2 = {:.17g}", s.training.adam_beta2));
  line(fmt::format("adam_eps = {:.17g}", s.training.adam_eps));
  line(fmt::format("init_std = {:.17g}", s.training.init_std));
  return out;
}

}  // namespace twin::model
