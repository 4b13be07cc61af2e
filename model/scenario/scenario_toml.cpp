// A Scenario from TOML and back: the file's sections read into typed fields (every unknown key and wrong type
// reported with its line), `--set` overrides applied on the document first, defaults that depend on other fields
// derived, then every rule checked (scenario_rules.cpp); and to_toml, the documented schema that reads back the same.
#include <algorithm>
#include <filesystem>
#include <set>
#include <utility>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "model/scenario/files.hpp"
#include "model/scenario/scenario.hpp"
#include "model/scenario/scenario_names.hpp"
#include "model/scenario/scenario_rules.hpp"
#include "model/scenario/toml_section.hpp"

namespace twin::model {
namespace {

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

}  // namespace

Override parse_override(std::string_view text) {
  const auto equals = text.find('=');
  if (equals == std::string_view::npos || equals == 0) {
    throw ScenarioError({fmt::format("--set '{}': expected SECTION.KEY=VALUE (e.g. parallel.pp=35)", text)});
  }
  return Override{std::string(text.substr(0, equals)), std::string(text.substr(equals + 1))};
}

Scenario load_scenario(const std::filesystem::path& path, const std::vector<Override>& overrides) {
  std::string text;
  try {
    text = read_input_file(path.string(), "scenario", kMaxScenarioBytes);
  } catch (const UserError& error) {  // a ScenarioError, as every problem of the scenario is
    throw ScenarioError(std::string(error.what()));
  }
  return parse_scenario(text, path.string(), overrides);
}

namespace {

void check_sections(const toml::table& root, const std::string& source, std::vector<std::string>& problems) {
  static const std::set<std::string> kSections = {"model", "parallel", "cluster", "framework", "training"};
  for (auto&& [key, node] : root) {
    if (kSections.count(std::string(key.str()))) continue;
    const auto& begin = node.source().begin;
    const std::string where = begin.line > 0 ? fmt::format("{}:{}:{}", source, begin.line, begin.column)
                                             : fmt::format("{} (--set {}.*)", source, key.str());
    problems.push_back(fmt::format("{}: unknown section [{}] (expected model, parallel, cluster, framework, training)",
                                   where, key.str()));
  }
}

// The Mixture-of-Experts keys of [model]; each one refused by name when model.experts leaves the model dense.
void read_moe_keys(SectionReader& model, const std::string& source, ModelSpec& m, std::vector<std::string>& problems) {
  model.integer("experts", m.experts);
  model.integer("top_k", m.top_k);
  model.integer("moe_ffn_hidden", m.moe_ffn_hidden);
  if (model.has("moe_ffn_hidden") && m.moe_ffn_hidden == 0) {
    problems.push_back(
        fmt::format("{}: model.moe_ffn_hidden must be positive (leave it out for model.ffn_hidden), got 0", source));
  }
  model.integer("shared_experts", m.shared_experts);
  model.integer("dense_layers", m.dense_layers);
  model.number("capacity_factor", m.capacity_factor);
  model.boolean("pad_to_capacity", m.pad_to_capacity);
  model.number("expert_load_skew", m.expert_load_skew);
  model.number("moe_aux_loss_coeff", m.moe_aux_loss_coeff);
  if (m.experts != 0) return;
  for (const char* key : {"top_k", "moe_ffn_hidden", "shared_experts", "dense_layers", "capacity_factor",
                          "pad_to_capacity", "expert_load_skew", "moe_aux_loss_coeff"}) {
    if (model.has(key)) {
      problems.push_back(fmt::format(
          "{}: model.{} is a Mixture-of-Experts key: it needs model.experts > 0 (the model is dense without it)",
          source, key));
    }
  }
}

void read_model(const toml::table& root, const std::string& source, ModelSpec& m, std::vector<std::string>& problems) {
  SectionReader model(section_table(root, "model", source, problems), "model", source, problems);
  if (!root.contains("model")) problems.push_back(fmt::format("{}: the [model] section is required", source));
  model.text("name", m.name);
  model.integer("layers", m.layers);
  model.integer("hidden", m.hidden);
  model.integer("heads", m.heads);
  const std::size_t problems_before_ffn = problems.size();  // a value out of range is one problem, not two
  model.integer("ffn_hidden", m.ffn_hidden);
  if (model.has("ffn_hidden") && problems.size() == problems_before_ffn && m.ffn_hidden == 0) {
    problems.push_back(
        fmt::format("{}: model.ffn_hidden must be positive (leave it out for 4 x model.hidden), got 0", source));
  }
  model.integer("seq_len", m.seq_len);
  model.integer("vocab", m.vocab);
  model.choice("dtype", m.dtype, names::kDTypes);
  model.choice("position_embedding", m.position_embedding, names::kPositionEmbeddings);
  model.choice("norm", m.norm, names::kNorms);
  model.choice("activation", m.activation, names::kActivations);
  model.integer("kv_heads", m.kv_heads);
  if (model.has("kv_heads") && m.kv_heads == 0) {
    problems.push_back(
        fmt::format("{}: model.kv_heads must be positive (leave it out for as many as model.heads), got 0", source));
  }
  model.integer("head_dim", m.head_dim_given);
  if (model.has("head_dim") && m.head_dim_given <= 0) {
    problems.push_back(fmt::format(
        "{}: model.head_dim must be positive (leave it out for model.hidden / model.heads), got {}", source,
        m.head_dim_given));
  }
  model.boolean("linear_bias", m.linear_bias);
  model.boolean("parallel_residual", m.parallel_residual);
  model.boolean("shared_norm", m.shared_norm);
  model.number("rotary_fraction", m.rotary_fraction);
  read_moe_keys(model, source, m, problems);
  model.choice("fp8", m.fp8, names::kFp8Formats);
  model.reject_unknown_keys();
}

// Returns whether the cluster's size (nodes or GPUs per node) was given.
bool read_cluster(const toml::table& root, const std::string& source, ClusterSpec& c,
                  std::vector<std::string>& problems) {
  SectionReader cluster(section_table(root, "cluster", source, problems), "cluster", source, problems);
  const bool size_given = cluster.has("nodes") || cluster.has("gpus_per_node");
  cluster.integer("nodes", c.nodes);
  cluster.choice("node", c.node, names::kNodes);
  c.gpus_per_node = default_gpus_per_node(c.node);
  cluster.integer("gpus_per_node", c.gpus_per_node);
  cluster.number("gemm_tflops", c.gemm_tflops);
  if (cluster.has("gemm_shape") && !cluster.has("gemm_tflops")) {
    problems.push_back(fmt::format(
        "{}: cluster.gemm_shape is the shape of a measurement: give its rate too (cluster.gemm_tflops)", source));
  }
  cluster.positive_integers("gemm_shape", c.gemm_shape);
  cluster.number("hbm_gb_per_s", c.hbm_gb_per_s);
  cluster.number("attention_gemm_hbm_fraction", c.attention_gemm_hbm_fraction);
  cluster.integer("nics_per_node", c.nics_per_node);
  cluster.number("nic_gbps", c.nic_gbps);
  cluster.number("host_us_per_kernel", c.host_us_per_kernel);
  cluster.text("gpu_profile", c.gpu_profile);
  // A profile named in the file sits beside it (from --set: as given, from where twin runs).
  const toml::node* profile_node = cluster.has("gpu_profile") ? root["cluster"]["gpu_profile"].node() : nullptr;
  if (profile_node && profile_node->source().begin.line > 0 && !c.gpu_profile.empty() &&
      std::filesystem::path(c.gpu_profile).is_relative()) {
    c.gpu_profile = (std::filesystem::path(source).parent_path() / c.gpu_profile).lexically_normal().string();
  }
  cluster.choice("fabric", c.fabric, names::kFabrics);
  cluster.boolean("rail_optimized", c.rail_optimized);
  cluster.number("gpu_failures_per_gpu_hour", c.gpu_failures_per_gpu_hour);
  cluster.number("host_failures_per_gpu_hour", c.host_failures_per_gpu_hour);
  cluster.number("nic_failures_per_gpu_hour", c.nic_failures_per_gpu_hour);
  cluster.number("switch_failures_per_gpu_hour", c.switch_failures_per_gpu_hour);
  cluster.number("software_failures_per_gpu_hour", c.software_failures_per_gpu_hour);
  cluster.number("storage_gb_per_s", c.storage_gb_per_s);
  cluster.number("restart_s", c.restart_s);
  cluster.number("usd_per_gpu_hour", c.usd_per_gpu_hour);
  cluster.reject_unknown_keys();
  return size_given;
}

// Which of the keys whose defaults depend on others the file gave.
struct ParallelGiven {
  bool dp = false;
  bool global_batch = false;
};

ParallelGiven read_parallel(const toml::table& root, const std::string& source, ParallelSpec& p,
                            std::vector<std::string>& problems) {
  SectionReader parallel(section_table(root, "parallel", source, problems), "parallel", source, problems);
  ParallelGiven given{parallel.has("dp"), parallel.has("global_batch")};
  parallel.integer("tp", p.tp);
  parallel.integer("pp", p.pp);
  parallel.integer("dp", p.dp);
  parallel.integer("cp", p.cp);
  parallel.integer("micro_batch", p.micro_batch);
  parallel.integer("global_batch", p.global_batch);
  parallel.choice("schedule", p.schedule, names::kSchedules);
  parallel.integer("virtual_stages", p.virtual_stages);
  parallel.integer("microbatch_group", p.microbatch_group);
  parallel.choice("recompute", p.recompute, names::kRecomputes);
  parallel.boolean("sequence_parallel", p.sequence_parallel);
  parallel.integer("zero_stage", p.zero_stage);
  parallel.boolean("dp_overlap", p.dp_overlap);
  parallel.boolean("overlap_param_gather", p.overlap_param_gather);
  parallel.integer("vocab_pad_multiple", p.vocab_pad_multiple);
  parallel.integer("first_stage_layers", p.first_stage_layers);
  parallel.integer("last_stage_layers", p.last_stage_layers);
  parallel.boolean("account_for_embedding", p.account_for_embedding);
  parallel.boolean("account_for_loss", p.account_for_loss);
  parallel.integer("recompute_num_layers", p.recompute_num_layers);
  parallel.integer("ep", p.ep);
  parallel.integer("etp", p.etp);
  parallel.reject_unknown_keys();
  return given;
}

// After [parallel]: two of its defaults follow parallel.sequence_parallel.
void read_framework(const toml::table& root, const std::string& source, Scenario& scenario,
                    std::vector<std::string>& problems) {
  FrameworkSpec& f = scenario.framework;
  SectionReader framework(section_table(root, "framework", source, problems), "framework", source, problems);
  framework.choice("name", f.name, names::kFrameworks);
  framework.boolean("tied_embeddings", f.tied_embeddings);
  framework.boolean("dropout", f.dropout);
  const bool fused_kernels_given = framework.has("fused_kernels");
  framework.boolean("fused_kernels", f.fused_kernels);
  framework.choice("attention", f.attention, names::kAttentionKinds);
  // Unset, both follow sequence parallelism: the Megatron-LM versions that have it (2022 on) overlap its backward
  // all-gather and reduce-scatter inside LinearWithGradAccumulationAndAsyncCommunication whatever the flags say, and
  // fuse gradient accumulation by default (--no-gradient-accumulation-fusion turns it off); 2021's had neither.
  f.tp_comm_overlap = scenario.parallel.sequence_parallel;
  f.gradient_accumulation_fusion = scenario.parallel.sequence_parallel;
  framework.boolean("tp_comm_overlap", f.tp_comm_overlap);
  framework.boolean("gradient_accumulation_fusion", f.gradient_accumulation_fusion);
  framework.boolean("pipeline_gather_copies", f.pipeline_gather_copies);
  framework.boolean("bf16_optimizer", f.bf16_optimizer);
  framework.boolean("partition_activations", f.partition_activations);
  framework.version("deepspeed_version", f.deepspeed_version);
  framework.choice("cp_comm", f.cp_comm, names::kCpComms);
  framework.choice("fp8_recipe", f.fp8_recipe, names::kFp8Recipes);
  framework.boolean("moe_a2a_overlap", f.moe_a2a_overlap);
  framework.choice("moe_dispatcher", f.moe_dispatcher, names::kMoeDispatchers);
  framework.boolean("async_checkpoint", f.async_checkpoint);
  const bool grad_reduce_given = framework.has("grad_reduce_in_fp32");
  framework.boolean("grad_reduce_in_fp32", f.grad_reduce_in_fp32);
  framework.boolean("fp8_param_gather", f.fp8_param_gather);
  framework.boolean("cuda_graphs", f.cuda_graphs);
  f.transformer_engine = transformer_engine_by_default(scenario);
  framework.boolean("transformer_engine", f.transformer_engine);
  framework.reject_unknown_keys();
  // Only Megatron chooses its bf16 gradients' dtype; DeepSpeed's and Composer's follow from their own keys.
  if (grad_reduce_given && (f.name != Framework::Megatron || scenario.model.dtype != DType::BF16)) {
    problems.push_back(fmt::format(
        "{}: framework.grad_reduce_in_fp32 is Megatron's choice for bf16 training: it needs framework.name = "
        "\"megatron\" and model.dtype = \"bf16\", got \"{}\" and \"{}\"",
        source, to_string(f.name), to_string(scenario.model.dtype)));
  }
  if (f.name == Framework::Composer) {
    // Composer runs PyTorch's own elementwise kernels (sim/cost_model.cpp); Megatron's fused ones are not there.
    if (fused_kernels_given) {
      problems.push_back(fmt::format(
          "{}: framework.fused_kernels selects Megatron-LM's fused kernels; framework.name = \"composer\" runs "
          "PyTorch's own: leave it out",
          source));
    }
    f.fused_kernels = false;
  }
}

void read_training(const toml::table& root, const std::string& source, TrainingSpec& t,
                   std::vector<std::string>& problems) {
  SectionReader training(section_table(root, "training", source, problems), "training", source, problems);
  training.unsigned_integer("seed", t.seed);
  training.number("learning_rate", t.learning_rate);
  t.min_learning_rate = t.learning_rate;
  training.number("min_learning_rate", t.min_learning_rate);
  training.integer("warmup_steps", t.warmup_steps);
  training.integer("decay_steps", t.decay_steps);
  training.number("weight_decay", t.weight_decay);
  training.number("grad_clip", t.grad_clip);
  training.number("adam_beta1", t.adam_beta1);
  training.number("adam_beta2", t.adam_beta2);
  training.number("adam_eps", t.adam_eps);
  training.number("init_std", t.init_std);
  training.reject_unknown_keys();
}

// Defaults that depend on other fields: a CPU host's size, dp from the cluster, the global batch from dp. Returns
// false when dp cannot be derived (a problem says why).
bool derive_defaults(Scenario& scenario, bool cluster_size_given, ParallelGiven given,
                     std::vector<std::string>& problems) {
  auto& p = scenario.parallel;
  bool derivable = true;
  if (scenario.cluster.node == NodeKind::CpuHost && !cluster_size_given) {
    // A CPU run has as many workers as the plan needs: one host, tp * cp * pp * dp workers (dp defaults to 1).
    scenario.cluster.nodes = 1;
    scenario.cluster.gpus_per_node = std::max<std::int64_t>(1, p.world_size());
  } else if (!given.dp && p.tp > 0 && p.pp > 0 && p.cp > 0) {
    const std::int64_t gpus = scenario.cluster.total_gpus(), model_parallel = p.tp * p.cp * p.pp;
    if (gpus > 0 && gpus % model_parallel != 0) {
      derivable = false;
      const std::string product = p.cp > 1 ? "tp*cp*pp" : "tp*pp";
      problems.push_back(fmt::format(
          "{}: parallel.dp: cannot derive dp: the cluster's {} GPUs ({} nodes x {}) are not a multiple of {} = {}",
          scenario.source, gpus, scenario.cluster.nodes, scenario.cluster.gpus_per_node, product, model_parallel));
    } else {
      p.dp = std::max<std::int64_t>(1, gpus / model_parallel);
    }
  }
  if (!given.global_batch) p.global_batch = p.dp * p.micro_batch;
  return derivable;
}

}  // namespace

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

  check_sections(root, source, problems);
  Scenario scenario;
  scenario.source = source;
  read_model(root, source, scenario.model, problems);
  const bool cluster_size_given = read_cluster(root, source, scenario.cluster, problems);
  const ParallelGiven given = read_parallel(root, source, scenario.parallel, problems);
  read_framework(root, source, scenario, problems);
  read_training(root, source, scenario.training, problems);
  // A field that could not be read keeps its default, and rules about it would only mislead ("layers must be
  // positive, got 0" after "layers: expected an integer"): what could not be read is reported alone.
  if (!problems.empty()) throw ScenarioError(problems);

  const bool dp_derived = derive_defaults(scenario, cluster_size_given, given, problems);
  // Every rule the fields break, together (but the world size, when dp could not be derived, was reported already).
  for (auto& problem : scenario_rule_violations(scenario, /*check_world_size=*/dp_derived)) {
    problems.push_back(std::move(problem));
  }
  if (!problems.empty()) throw ScenarioError(problems);
  return scenario;
}

namespace {

// `text` as a TOML basic string: quoted, with the characters TOML escapes escaped (a model name or a path may hold
// quotes, backslashes or control characters; written raw, the file would not read back as the same scenario).
std::string toml_quoted(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (byte < 0x20 || byte == 0x7f) {
      out += fmt::format("\\u{:04X}", byte);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// The [framework] section of to_toml.
std::string framework_toml(const Scenario& s) {
  const FrameworkSpec& f = s.framework;
  std::string out;
  auto line = [&out](std::string text) { out += text + "\n"; };
  line("\n[framework]");
  line(fmt::format("name = \"{}\"", to_string(f.name)));
  line(fmt::format("tied_embeddings = {}", f.tied_embeddings));
  line(fmt::format("dropout = {}", f.dropout));
  if (f.name != Framework::Composer) line(fmt::format("fused_kernels = {}", f.fused_kernels));
  line(fmt::format("attention = \"{}\"", to_string(f.attention)));
  line(fmt::format("tp_comm_overlap = {}", f.tp_comm_overlap));
  line(fmt::format("gradient_accumulation_fusion = {}", f.gradient_accumulation_fusion));
  line(fmt::format("pipeline_gather_copies = {}", f.pipeline_gather_copies));
  line(fmt::format("bf16_optimizer = {}", f.bf16_optimizer));
  line(fmt::format("partition_activations = {}", f.partition_activations));
  if (f.deepspeed_version != std::array<int, 3>{0, 0, 0}) {
    line(fmt::format("deepspeed_version = \"{}\"", version_text(f.deepspeed_version)));
  }
  if (f.cp_comm != CpComm::P2P) line(fmt::format("cp_comm = \"{}\"", to_string(f.cp_comm)));
  if (f.fp8_recipe != Fp8Recipe::Delayed)
    line(fmt::format("fp8_recipe = \"{}\"", to_string(f.fp8_recipe)));
  if (f.moe_a2a_overlap) line("moe_a2a_overlap = true");
  if (f.moe_dispatcher != MoeDispatcher::AllToAll)
    line(fmt::format("moe_dispatcher = \"{}\"", to_string(f.moe_dispatcher)));
  if (f.async_checkpoint) line("async_checkpoint = true");
  if (!f.grad_reduce_in_fp32) line("grad_reduce_in_fp32 = false");
  if (f.fp8_param_gather) line("fp8_param_gather = true");
  if (f.cuda_graphs) line("cuda_graphs = true");
  if (f.transformer_engine != transformer_engine_by_default(s)) {
    line(fmt::format("transformer_engine = {}", f.transformer_engine));
  }
  return out;
}

}  // namespace

std::string to_toml(const Scenario& s) {
  std::string out;
  auto line = [&out](std::string text) { out += text + "\n"; };
  line("[model]");
  line(fmt::format("name = {}", toml_quoted(s.model.name)));
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
  if (s.model.head_dim_given > 0) line(fmt::format("head_dim = {}", s.model.head_dim_given));
  line(fmt::format("linear_bias = {}", s.model.linear_bias));
  line(fmt::format("parallel_residual = {}", s.model.parallel_residual));
  line(fmt::format("shared_norm = {}", s.model.shared_norm));
  line(fmt::format("rotary_fraction = {}", s.model.rotary_fraction));
  if (s.model.is_moe()) {
    line(fmt::format("experts = {}", s.model.experts));
    line(fmt::format("top_k = {}", s.model.top_k));
    line(fmt::format("moe_ffn_hidden = {}", s.moe_ffn_hidden()));
    line(fmt::format("shared_experts = {}", s.model.shared_experts));
    line(fmt::format("dense_layers = {}", s.model.dense_layers));
    line(fmt::format("capacity_factor = {:.17g}", s.model.capacity_factor));
    if (s.model.pad_to_capacity) line("pad_to_capacity = true");
    line(fmt::format("expert_load_skew = {:.17g}", s.model.expert_load_skew));
    line(fmt::format("moe_aux_loss_coeff = {:.17g}", s.model.moe_aux_loss_coeff));
  }
  if (s.model.fp8 != Fp8Format::None) line(fmt::format("fp8 = \"{}\"", to_string(s.model.fp8)));
  line("\n[parallel]");
  line(fmt::format("tp = {}", s.parallel.tp));
  line(fmt::format("pp = {}", s.parallel.pp));
  line(fmt::format("dp = {}", s.parallel.dp));
  if (s.parallel.cp != 1) line(fmt::format("cp = {}", s.parallel.cp));
  line(fmt::format("micro_batch = {}", s.parallel.micro_batch));
  line(fmt::format("global_batch = {}", s.parallel.global_batch));
  line(fmt::format("schedule = \"{}\"", to_string(s.parallel.schedule)));
  line(fmt::format("virtual_stages = {}", s.parallel.virtual_stages));
  if (s.parallel.microbatch_group > 0) line(fmt::format("microbatch_group = {}", s.parallel.microbatch_group));
  line(fmt::format("recompute = \"{}\"", to_string(s.parallel.recompute)));
  line(fmt::format("sequence_parallel = {}", s.parallel.sequence_parallel));
  line(fmt::format("zero_stage = {}", s.parallel.zero_stage));
  if (s.parallel.first_stage_layers > 0) line(fmt::format("first_stage_layers = {}", s.parallel.first_stage_layers));
  if (s.parallel.last_stage_layers > 0) line(fmt::format("last_stage_layers = {}", s.parallel.last_stage_layers));
  if (s.parallel.account_for_embedding) line("account_for_embedding = true");
  if (s.parallel.account_for_loss) line("account_for_loss = true");
  if (s.parallel.recompute_num_layers > 0) {
    line(fmt::format("recompute_num_layers = {}", s.parallel.recompute_num_layers));
  }
  if (s.model.is_moe() || s.parallel.ep != 1 || s.parallel.etp != 1) {
    line(fmt::format("ep = {}", s.parallel.ep));
    line(fmt::format("etp = {}", s.parallel.etp));
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
  if (s.cluster.host_us_per_kernel) {
    line(fmt::format("host_us_per_kernel = {:.17g}", *s.cluster.host_us_per_kernel));
  }
  if (!s.cluster.gpu_profile.empty()) {
    // Absolute, so that the written scenario names the same file wherever it is saved.
    line(fmt::format("gpu_profile = {}", toml_quoted(std::filesystem::absolute(s.cluster.gpu_profile).string())));
  }
  if (s.cluster.fabric != Fabric::NodeDefault) line(fmt::format("fabric = \"{}\"", to_string(s.cluster.fabric)));
  if (s.cluster.rail_optimized) line("rail_optimized = true");
  for (auto [key, field] : failure_model_fields(s.cluster)) {
    if (field->has_value()) line(fmt::format("{} = {:.17g}", key, **field));
  }
  if (s.cluster.usd_per_gpu_hour > 0) line(fmt::format("usd_per_gpu_hour = {:.17g}", s.cluster.usd_per_gpu_hour));
  out += framework_toml(s);
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
