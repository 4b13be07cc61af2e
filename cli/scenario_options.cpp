// Scenario selection shared by every subcommand: positional SCENARIO, --set overrides, Megatron-style aliases.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <system_error>
#include <utility>

#include <unistd.h>

#include <fmt/core.h>

#include "api/hf_config.hpp"
#include "cli/commands.hpp"

namespace twin::cli {
namespace {

namespace fs = std::filesystem;

// Megatron-LM's flag names for the keys a scenario shares with its arguments.
struct Alias {
  const char* flag;
  const char* key;
  const char* help;
};
constexpr Alias kAliases[] = {
    {"--tensor-model-parallel-size", "parallel.tp", "alias of --set parallel.tp=N"},
    {"--pipeline-model-parallel-size", "parallel.pp", "alias of --set parallel.pp=N"},
    {"--data-parallel-size", "parallel.dp", "alias of --set parallel.dp=N"},
    {"--micro-batch-size", "parallel.micro_batch", "alias of --set parallel.micro_batch=N"},
    {"--global-batch-size", "parallel.global_batch", "alias of --set parallel.global_batch=N"},
    {"--num-layers", "model.layers", "alias of --set model.layers=N"},
    {"--hidden-size", "model.hidden", "alias of --set model.hidden=N"},
    {"--num-attention-heads", "model.heads", "alias of --set model.heads=N"},
    {"--num-query-groups", "model.kv_heads", "alias of --set model.kv_heads=N (grouped-query attention)"},
    {"--kv-channels", "model.head_dim", "alias of --set model.head_dim=N (each attention head's dimensions)"},
    {"--ffn-hidden-size", "model.ffn_hidden", "alias of --set model.ffn_hidden=N"},
    {"--seq-length", "model.seq_len", "alias of --set model.seq_len=N"},
    {"--nodes", "cluster.nodes", "alias of --set cluster.nodes=N"},
    {"--decoder-first-pipeline-num-layers", "parallel.first_stage_layers",
     "alias of --set parallel.first_stage_layers=N"},
    {"--decoder-last-pipeline-num-layers", "parallel.last_stage_layers", "alias of --set parallel.last_stage_layers=N"},
    {"--context-parallel-size", "parallel.cp", "alias of --set parallel.cp=N (context parallelism)"},
    {"--microbatch-group-size-per-virtual-pipeline-stage", "parallel.microbatch_group",
     "alias of --set parallel.microbatch_group=N (the interleaved schedule's micro-batches per group)"},
    {"--recompute-num-layers", "parallel.recompute_num_layers",
     "alias of --set parallel.recompute_num_layers=N (Megatron's block method: full recompute of N layers per chunk)"},
    {"--num-experts", "model.experts", "alias of --set model.experts=N (routed experts per MoE layer)"},
    {"--moe-router-topk", "model.top_k", "alias of --set model.top_k=N"},
    {"--moe-ffn-hidden-size", "model.moe_ffn_hidden", "alias of --set model.moe_ffn_hidden=N"},
    {"--expert-model-parallel-size", "parallel.ep", "alias of --set parallel.ep=N"},
    {"--expert-tensor-parallel-size", "parallel.etp", "alias of --set parallel.etp=N"},
};

// Megatron-LM's switches (megatron/training/arguments.py) that set one scenario key to one value.
struct SwitchAlias {
  const char* flag;
  const char* key;
  const char* value;
  const char* help;
};
constexpr SwitchAlias kSwitches[] = {
    {"--sequence-parallel", "parallel.sequence_parallel", "true", "alias of --set parallel.sequence_parallel=true"},
    {"--use-distributed-optimizer", "parallel.zero_stage", "1", "alias of --set parallel.zero_stage=1"},
    {"--overlap-grad-reduce", "parallel.dp_overlap", "true", "alias of --set parallel.dp_overlap=true"},
    {"--overlap-param-gather", "parallel.overlap_param_gather", "true",
     "alias of --set parallel.overlap_param_gather=true"},
    {"--tp-comm-overlap", "framework.tp_comm_overlap", "true", "alias of --set framework.tp_comm_overlap=true"},
    {"--overlap-moe-expert-parallel-comm", "framework.moe_a2a_overlap", "true",
     "alias of --set framework.moe_a2a_overlap=true"},
    {"--fp8-param-gather", "framework.fp8_param_gather", "true", "alias of --set framework.fp8_param_gather=true"},
    {"--moe-pad-expert-input-to-capacity", "model.pad_to_capacity", "true",
     "alias of --set model.pad_to_capacity=true"},
    {"--enable-cuda-graph", "framework.cuda_graphs", "true", "alias of --set framework.cuda_graphs=true"},
    {"--external-cuda-graph", "framework.cuda_graphs", "true", "alias of --set framework.cuda_graphs=true"},
    {"--accumulate-allreduce-grads-in-fp32", "framework.grad_reduce_in_fp32", "true",
     "alias of --set framework.grad_reduce_in_fp32=true"},
    {"--recompute-activations", "parallel.recompute", "selective",
     "alias of --set parallel.recompute=selective (Megatron's shorthand for --recompute-granularity selective)"},
    {"--swiglu", "model.activation", "swiglu", "alias of --set model.activation=swiglu"},
    {"--untie-embeddings-and-output-weights", "framework.tied_embeddings", "false",
     "alias of --set framework.tied_embeddings=false"},
    {"--disable-bias-linear", "model.linear_bias", "false", "alias of --set model.linear_bias=false"},
    {"--use-flash-attn", "framework.attention", "flash2", "alias of --set framework.attention=flash2"},
    {"--bf16", "model.dtype", "bf16", "alias of --set model.dtype=bf16"},
    {"--fp16", "model.dtype", "fp16", "alias of --set model.dtype=fp16"},
    {"--account-for-embedding-in-pipeline-split", "parallel.account_for_embedding", "true",
     "alias of --set parallel.account_for_embedding=true"},
    {"--account-for-loss-in-pipeline-split", "parallel.account_for_loss", "true",
     "alias of --set parallel.account_for_loss=true"},
};

// Megatron-LM's options whose values are named otherwise in a scenario.
struct ChoiceAlias {
  const char* flag;
  const char* key;
  std::vector<std::pair<std::string, std::string>> values;  // Megatron's spelling -> the scenario's
};
const std::vector<ChoiceAlias>& choice_aliases() {
  static const std::vector<ChoiceAlias> aliases = {
      {"--recompute-granularity", "parallel.recompute", {{"full", "full"}, {"selective", "selective"}}},
      {"--normalization", "model.norm", {{"LayerNorm", "layernorm"}, {"RMSNorm", "rmsnorm"}}},
      {"--position-embedding-type", "model.position_embedding", {{"learned_absolute", "learned"}, {"rope", "rope"}}},
      {"--cp-comm-type", "framework.cp_comm", {{"p2p", "p2p"}, {"all_gather", "all_gather"}, {"a2a", "a2a"}}},
      {"--moe-token-dispatcher-type", "framework.moe_dispatcher", {{"alltoall", "alltoall"}, {"flex", "flex"}}},
      {"--fp8-format", "model.fp8", {{"e4m3", "e4m3"}, {"hybrid", "hybrid"}}},
      {"--transformer-impl", "framework.transformer_engine", {{"transformer_engine", "true"}, {"local", "false"}}},
      {"--fp8-recipe",
       "framework.fp8_recipe",
       {{"delayed", "delayed"}, {"tensorwise", "tensorwise"}, {"blockwise", "blockwise"}, {"mxfp8", "mxfp8"}}},
  };
  return aliases;
}

// Megatron-LM's --moe-layer-freq: an integer N (every N-th layer is MoE: twin models N = 1) or a list of 0 (dense)
// and 1 (MoE) per layer, as Python ("([0]*3+[1]*58)") or spelled out ("[0,0,1,1]"); twin models "the first N dense".
// Returns {dense layers, layers the list covers or -1 for the integer form}.
std::pair<long long, long long> parse_moe_layer_freq(std::string text) {
  std::erase_if(text, [](char c) { return std::isspace(static_cast<unsigned char>(c)) || c == '\'' || c == '"'; });
  const auto refuse = [&text](const char* why) { return UserError(fmt::format("--moe-layer-freq {}: {}", text, why)); };
  if (!text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return std::isdigit(c); })) {
    if (text != "1") throw refuse("every N-th layer MoE is not modelled: give 1, or the list of a first N dense");
    return {0, -1};
  }
  while (text.size() >= 2 && text.front() == '(' && text.back() == ')') text = text.substr(1, text.size() - 2);
  std::vector<int> per_layer;
  std::size_t at = 0;
  while (at < text.size()) {  // terms joined by '+': [a,b,...] or [a]*N
    const std::size_t close = text.find(']', at);
    if (text[at] != '[' || close == std::string::npos) throw refuse("expected a list such as ([0]*3+[1]*58)");
    std::vector<int> items;
    for (std::size_t i = at + 1; i < close; ++i) {
      if (text[i] == ',') continue;
      if (text[i] != '0' && text[i] != '1') throw refuse("each layer is 0 (dense) or 1 (MoE)");
      items.push_back(text[i] - '0');
    }
    long long repeat = 1;
    at = close + 1;
    if (at < text.size() && text[at] == '*') {
      const std::size_t end = text.find('+', at);
      const std::string count = text.substr(at + 1, end == std::string::npos ? std::string::npos : end - at - 1);
      if (count.empty() || count.size() > 6 || !std::all_of(count.begin(), count.end(), ::isdigit)) {
        throw refuse("a repeat count must be a number");
      }
      repeat = std::stoll(count);
      at = end == std::string::npos ? text.size() : end;
    }
    for (long long r = 0; r < repeat; ++r) per_layer.insert(per_layer.end(), items.begin(), items.end());
    if (at < text.size() && text[at] == '+') ++at;
  }
  const auto first_moe = std::find(per_layer.begin(), per_layer.end(), 1);
  if (first_moe == per_layer.end()) throw refuse("no MoE layer: leave --num-experts out for a dense model");
  if (std::find(first_moe, per_layer.end(), 0) != per_layer.end()) {
    throw refuse("a dense layer after an MoE one is not modelled: twin models the first N layers dense");
  }
  return {first_moe - per_layer.begin(), static_cast<long long>(per_layer.size())};
}

void add_moe_derived(const ScenarioOptions& options, const model::Scenario& plan, long long moe_listed_layers,
                     std::vector<model::Override>& overrides) {
  if (moe_listed_layers >= 0 && moe_listed_layers != plan.model.layers) {
    throw UserError(
        fmt::format("--moe-layer-freq lists {} layers; model.layers is {}", moe_listed_layers, plan.model.layers));
  }
  if (options.shared_expert_width <= 0) return;
  for (const model::Override& given : overrides) {
    if (given.key == "model.shared_experts") {
      throw UserError(
          fmt::format("model.shared_experts is given twice, as {} and by "
                      "--moe-shared-expert-intermediate-size {}",
                      given.value, options.shared_expert_width));
    }
  }
  // Megatron-Core's shared expert is one MLP of that width; twin counts experts of model.moe_ffn_hidden each, whose
  // FLOPs and bytes are the same when the width is a whole number of them.
  const std::int64_t width = plan.moe_ffn_hidden();
  if (options.shared_expert_width % width != 0) {
    throw UserError(
        fmt::format("--moe-shared-expert-intermediate-size {}: not a multiple of the expert width "
                    "model.moe_ffn_hidden = {}",
                    options.shared_expert_width, width));
  }
  overrides.push_back({"model.shared_experts", std::to_string(options.shared_expert_width / width)});
}

}  // namespace

namespace {

// The aliases whose values feed options.aliases or options' own fields: dropout, GQA, MoE, vocabulary padding,
// recompute method, chunks.
void add_megatron_value_flags(CLI::App& command, ScenarioOptions& options) {
  for (auto [flag, rate] : {std::pair{"--attention-dropout", &options.attention_dropout},
                            std::pair{"--hidden-dropout", &options.hidden_dropout}}) {
    command
        .add_option(flag, *rate,
                    "a dropout probability (Megatron's default 0.1): framework.dropout is off when both are 0")
        ->type_name("P")
        ->check(CLI::Range(0.0, 1.0))
        ->group("Megatron-style aliases");
  }
  command
      .add_flag("--group-query-attention", options.group_query_attention,
                "grouped-query attention: without --num-query-groups, one key/value head (Megatron's default of 1)")
      ->group("Megatron-style aliases");
  command
      .add_option_function<double>(
          "--moe-expert-capacity-factor",
          [&options](const double& value) {
            options.aliases.push_back({"model.capacity_factor", fmt::format("{}", value)});
          },
          "alias of --set model.capacity_factor=F")
      ->type_name("F")
      ->group("Megatron-style aliases");
  command
      .add_option_function<double>(
          "--moe-aux-loss-coeff",
          [&options](const double& value) {
            options.aliases.push_back({"model.moe_aux_loss_coeff", fmt::format("{}", value)});
          },
          "alias of --set model.moe_aux_loss_coeff=F")
      ->type_name("F")
      ->group("Megatron-style aliases");
  command
      .add_option("--moe-shared-expert-intermediate-size", options.shared_expert_width,
                  "the shared experts' total width: model.shared_experts = N / the expert width (model.moe_ffn_hidden)")
      ->type_name("N")
      ->check(CLI::PositiveNumber)
      ->group("Megatron-style aliases");
  command
      .add_option("--moe-layer-freq", options.moe_layer_freq,
                  "1 (every layer MoE) or a per-layer list whose leading 0s are dense, e.g. ([0]*3+[1]*58): "
                  "model.dense_layers")
      ->type_name("FREQ")
      ->group("Megatron-style aliases");
  command
      .add_option_function<long long>(
          "--make-vocab-size-divisible-by",
          [&options](const long long& value) {
            options.aliases.push_back({"parallel.vocab_pad_multiple", std::to_string(value)});
          },
          "alias of --set parallel.vocab_pad_multiple=N")
      ->type_name("N")
      ->group("Megatron-style aliases");
  command
      .add_option("--recompute-method", options.recompute_method,
                  "block: --recompute-num-layers N recomputes the first N layers of each chunk (the default here); "
                  "uniform: every layer is recomputed (N layers per checkpoint: the same FLOPs)")
      ->check(CLI::IsMember({"uniform", "block"}))
      ->group("Megatron-style aliases");
  command
      .add_option("--num-layers-per-virtual-pipeline-stage", options.layers_per_virtual_stage,
                  "layers per model chunk: parallel.virtual_stages = layers / (pp x N), the interleaved schedule")
      ->type_name("N")
      ->check(CLI::PositiveNumber)
      ->group("Megatron-style aliases");
  for (auto [flag, help] :
       {std::pair{"--num-virtual-stages-per-pipeline-rank", "alias of --virtual-stages N"},
        std::pair{"--virtual-stages", "model chunks per stage; selects the interleaved schedule"}}) {
    command
        .add_option_function<long long>(
            flag,
            [&options](const long long& value) {
              options.aliases.push_back({"parallel.virtual_stages", std::to_string(value)});
              options.aliases.push_back({"parallel.schedule", "interleaved"});
            },
            help)
        ->type_name("N")
        ->group("Megatron-style aliases");
  }
}

}  // namespace

void add_scenario_options(CLI::App& command, ScenarioOptions& options) {
  command.add_option("scenario", options.scenario,
                     fmt::format("scenario TOML file, or a name under scenarios/ (default: {})", options.scenario));
  command.add_option("--set", options.sets, "override a scenario key, e.g. --set parallel.pp=35 (repeatable)")
      ->type_name("KEY=VALUE");
  command
      .add_option("--hf-config", options.hf_config,
                  "a Hugging Face config.json as the scenario's model (its sizes, attention, MLP, experts, embeddings; "
                  "--set and the aliases win over it)")
      ->type_name("FILE");
  for (const Alias& alias : kAliases) {
    command
        .add_option_function<long long>(
            alias.flag,
            [&options, key = std::string(alias.key)](const long long& value) {
              options.aliases.push_back({key, std::to_string(value)});
            },
            alias.help)
        ->type_name("N")
        ->group("Megatron-style aliases");
  }
  command
      .add_option_function<std::string>(
          "--recompute",
          [&options](const std::string& value) {
            options.aliases.push_back({"parallel.recompute", value});
          },
          "alias of --set parallel.recompute=none|selective|full")
      ->group("Megatron-style aliases");
  command
      .add_option_function<double>(
          "--rotary-percent",
          [&options](const double& value) {
            options.aliases.push_back({"model.rotary_fraction", fmt::format("{}", value)});
          },
          "alias of --set model.rotary_fraction=F (despite its name, Megatron's flag is a fraction: 0.25 rotates a "
          "quarter of each head)")
      ->type_name("F")
      ->group("Megatron-style aliases");
  for (const SwitchAlias& alias : kSwitches) {
    command
        .add_flag_function(
            alias.flag,
            [&options, key = std::string(alias.key), value = std::string(alias.value)](std::int64_t) {
              options.aliases.push_back({key, value});
            },
            alias.help)
        ->group("Megatron-style aliases");
  }
  for (const ChoiceAlias& alias : choice_aliases()) {
    std::vector<std::string> names;
    for (const auto& [megatron, ours] : alias.values) names.push_back(megatron);
    std::string help = "alias of --set " + std::string(alias.key) + " (";
    for (const auto& [megatron, ours] : alias.values) {
      help += (help.back() == '(' ? "" : ", ") + megatron + ": " + ours;
    }
    help += ")";
    command
        .add_option_function<std::string>(
            alias.flag,
            [&options, &alias](const std::string& value) {
              for (const auto& [megatron, ours] : alias.values) {
                if (value == megatron) options.aliases.push_back({alias.key, ours});
              }
            },
            help)
        ->check(CLI::IsMember(names))
        ->group("Megatron-style aliases");
  }
  add_megatron_value_flags(command, options);
}

std::pair<std::string, std::string> scenario_input(const ScenarioOptions& options) {
  return {"the scenario", resolve_scenario_path(options.scenario)};
}

std::vector<model::Override> scenario_overrides(const ScenarioOptions& options) {
  // --hf-config's model first: what the command line sets after it wins (applied later), and is checked alone below.
  std::vector<model::Override> overrides;
  if (!options.hf_config.empty()) overrides = api::hf_config_overrides(options.hf_config);
  const auto from_command_line = static_cast<std::ptrdiff_t>(overrides.size());
  for (const auto& text : options.sets) overrides.push_back(model::parse_override(text));
  // An alias and a --set of the same key that disagree: which one was meant is not for twin to guess.
  for (const model::Override& alias : options.aliases) {
    for (const model::Override& set : std::vector(overrides.begin() + from_command_line, overrides.end())) {
      if (set.key == alias.key && set.value != alias.value) {
        throw UserError(fmt::format("{} is given twice, as {} by a Megatron-style flag and as {} by --set {}={}",
                                    alias.key, alias.value, set.value, set.key, set.value));
      }
    }
  }
  for (const model::Override& alias : options.aliases) {
    // Megatron's uniform method checkpoints every N-th layer's input and recomputes them all: twin's full recompute.
    if (alias.key == "parallel.recompute_num_layers" && options.recompute_method == "uniform") {
      overrides.push_back({alias.key, "0"});
    } else {
      overrides.push_back(alias);
    }
  }
  if (options.attention_dropout >= 0 || options.hidden_dropout >= 0) {
    // Megatron's dropout probabilities, 0.1 each unless given; twin's dropout passes run when either is above 0.
    const double attention = options.attention_dropout >= 0 ? options.attention_dropout : 0.1;
    const double hidden = options.hidden_dropout >= 0 ? options.hidden_dropout : 0.1;
    const std::string dropout = attention > 0 || hidden > 0 ? "true" : "false";
    for (const model::Override& set : overrides) {
      if (set.key == "framework.dropout" && set.value != dropout) {
        throw UserError(
            fmt::format("framework.dropout is given twice, as {} by --attention-dropout / --hidden-dropout "
                        "and as {} by --set",
                        dropout, set.value));
      }
    }
    overrides.push_back({"framework.dropout", dropout});
  }
  if (options.group_query_attention) {
    // Megatron's --num-query-groups defaults to 1: --group-query-attention alone is multi-query attention.
    const bool groups_given = std::any_of(overrides.begin(), overrides.end(),
                                          [](const model::Override& given) { return given.key == "model.kv_heads"; });
    if (!groups_given) overrides.push_back({"model.kv_heads", "1"});
  }
  long long moe_listed_layers = -1;  // the layers --moe-layer-freq's list covers
  if (!options.moe_layer_freq.empty()) {
    const auto [dense, listed] = parse_moe_layer_freq(options.moe_layer_freq);
    for (const model::Override& given : std::vector(overrides.begin() + from_command_line, overrides.end())) {
      if (given.key == "model.dense_layers") {
        throw UserError(fmt::format("model.dense_layers is given twice, as {} and by --moe-layer-freq", given.value));
      }
    }
    overrides.push_back({"model.dense_layers", std::to_string(dense)});
    moe_listed_layers = listed;
  }
  bool swiglu_switch = false;
  for (const model::Override& alias : options.aliases)
    swiglu_switch |= alias.key == "model.activation" && alias.value == "swiglu";
  if (options.layers_per_virtual_stage <= 0 && !swiglu_switch && options.shared_expert_width <= 0 &&
      moe_listed_layers < 0) {
    return overrides;
  }
  const std::string path = resolve_scenario_path(options.scenario);

  // Keys Megatron derives from the others: read the scenario once with one chunk per stage (so that an interleaved
  // scenario's own chunks do not stand in the way), then add them.
  std::vector<model::Override> one_chunk = overrides;
  one_chunk.push_back({"parallel.virtual_stages", "1"});
  one_chunk.push_back({"parallel.schedule", "1f1b"});
  const model::Scenario plan = model::load_scenario(path, one_chunk);
  if (swiglu_switch && plan.model.ffn_hidden == 0) {
    // --swiglu without --ffn-hidden-size: 4h x 2/3 rounded down to a multiple of 64, "to keep the number of
    // parameters in the same ballpark" (megatron/training/arguments.py).
    overrides.push_back({"model.ffn_hidden", std::to_string(4 * plan.model.hidden * 2 / 3 / 64 * 64)});
  }
  add_moe_derived(options, plan, moe_listed_layers, overrides);
  if (options.layers_per_virtual_stage > 0) {
    // --num-layers-per-virtual-pipeline-stage: the chunks follow from the layers and the stages.
    for (const model::Override& given : overrides) {
      if (given.key == "parallel.virtual_stages") {
        throw UserError(
            fmt::format("--num-layers-per-virtual-pipeline-stage and parallel.virtual_stages = {} both "
                        "say how many chunks a stage holds: give one",
                        given.value));
      }
    }
    const std::int64_t per_stage_chunk = plan.parallel.pp * options.layers_per_virtual_stage;
    if (plan.model.layers % per_stage_chunk != 0) {
      throw UserError(fmt::format(
          "--num-layers-per-virtual-pipeline-stage {}: model.layers ({}) is not a multiple of "
          "parallel.pp x {} = {}",
          options.layers_per_virtual_stage, plan.model.layers, options.layers_per_virtual_stage, per_stage_chunk));
    }
    overrides.push_back({"parallel.virtual_stages", std::to_string(plan.model.layers / per_stage_chunk)});
    overrides.push_back({"parallel.schedule", "interleaved"});
  }
  return overrides;
}

model::Scenario load_scenario(const ScenarioOptions& options) {
  return model::load_scenario(resolve_scenario_path(options.scenario), scenario_overrides(options));
}

std::vector<std::string> as_sets(const std::vector<model::Override>& overrides) {
  std::vector<std::string> sets;
  for (const model::Override& override : overrides) sets.push_back(override.key + "=" + override.value);
  return sets;
}

}  // namespace twin::cli
