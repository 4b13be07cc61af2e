// Mixture-of-Experts' rules: the router's choice, the expert split and what Megatron-Core checks
// (megatron/training/arguments.py, megatron/core/transformer/transformer_config.py, megatron/core/parallel_state.py).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "model/scenario/scenario.hpp"
#include "model/scenario/scenario_rules.hpp"

namespace twin::model {
namespace {

// The expert grid against the dense one and the framework.
void expert_grid(const Scenario& scenario, SizesKnown known, bool sizes_ok, std::vector<std::string>& problems) {
  const ModelSpec& m = scenario.model;
  const ParallelSpec& p = scenario.parallel;
  const std::string& src = scenario.source;
  if (sizes_ok && known.tp && known.dp && (p.tp * p.cp * p.dp) % (p.ep * p.etp) != 0) {
    problems.push_back(fmt::format(
        "{}: parallel.ep x parallel.etp ({} x {}) must divide parallel.tp x parallel.cp x parallel.dp ({} x {} x {}): "
        "Megatron-Core's expert grid (etp-ep-edp-pp) numbers the same ranks of a stage as the dense one (tp-cp-dp-pp)",
        src, p.ep, p.etp, p.tp, p.cp, p.dp));
  }
  if (p.ep > 1 && p.tp > 1 && !p.sequence_parallel) {
    problems.push_back(
        fmt::format("{}: parallel.ep = {} with parallel.tp = {} needs parallel.sequence_parallel = "
                    "true (Megatron-Core: expert and tensor parallelism need sequence parallelism)",
                    src, p.ep, p.tp));
  }
  if (p.ep > 1 && m.dtype == DType::FP16) {
    problems.push_back(fmt::format(
        "{}: parallel.ep = {} with model.dtype = \"fp16\": Megatron-LM refuses expert parallelism in fp16", src, p.ep));
  }
  if (scenario.framework.name != Framework::Megatron) {
    problems.push_back(
        fmt::format("{}: model.experts = {}: Mixture-of-Experts is modelled as Megatron-Core runs "
                    "it: framework.name must be \"megatron\" (got \"{}\")",
                    src, m.experts, to_string(scenario.framework.name)));
  }
  if (m.parallel_residual) {
    problems.push_back(
        fmt::format("{}: model.experts = {} with model.parallel_residual: a parallel block's MLP is "
                    "dense here",
                    src, m.experts));
  }
  if (p.zero_stage >= 2) {
    problems.push_back(fmt::format(
        "{}: model.experts = {} with parallel.zero_stage = {}: Megatron-Core shards MoE models with ZeRO-1 at most",
        src, m.experts, p.zero_stage));
  }
}

// framework.moe_a2a_overlap: what Megatron-Core's TransformerConfig.__post_init__ asserts for
// overlap_moe_expert_parallel_comm (megatron/core/transformer/transformer_config.py lines 1852-1906 at b0cc2706, the
// pin of Megatron-Bridge v0.3.0; the same checks at lines 1665-1700 of 0d8e0714, v0.2.0's). The alltoall or flex
// dispatcher it also needs are both framework.moe_dispatcher's; its MTP, shared-expert-overlap and CUDA-graph scope
// rules have no key here.
void a2a_overlap(const Scenario& scenario, std::vector<std::string>& problems) {
  const ModelSpec& m = scenario.model;
  const ParallelSpec& p = scenario.parallel;
  const std::string& src = scenario.source;
  if (!scenario.framework.moe_a2a_overlap) return;
  const std::string flag = "framework.moe_a2a_overlap (Megatron-Core's --overlap-moe-expert-parallel-comm)";
  if (m.experts <= 0 || p.ep <= 1) {
    problems.push_back(
        fmt::format("{}: {} needs expert parallelism: model.experts > 0 and parallel.ep > 1 (got {} and "
                    "{}; \"overlap_moe_expert_parallel_comm is only supported with expert model "
                    "parallelism\")",
                    src, flag, m.experts, p.ep));
  }
  if (p.pp > 1 && p.schedule != ScheduleKind::Interleaved) {
    problems.push_back(
        fmt::format("{}: {} with parallel.pp = {} needs parallel.schedule = \"interleaved\" (\"If "
                    "enabling EP A2A overlap, virtual_pipeline_model_parallel_size must be specified "
                    "when pipeline_model_parallel_size > 1\")",
                    src, flag, p.pp));
  }
  if (p.pp == 1 && p.schedule == ScheduleKind::GPipe) {
    problems.push_back(
        fmt::format("{}: {} with parallel.pp = 1 runs Megatron-Core's forward/backward alternation "
                    "(combined_1f1b_schedule_for_no_pipelining): set parallel.schedule = \"1f1b\"",
                    src, flag));
  }
  if (p.recompute == Recompute::Full || p.recompute_num_layers != 0) {
    problems.push_back(
        fmt::format("{}: {} refuses full recompute (parallel.recompute = \"full\", "
                    "parallel.recompute_num_layers): \"disable full recomputation when enabling "
                    "overlap_moe_expert_parallel_comm\"",
                    src, flag));
  }
  if (m.dtype != DType::BF16 && m.dtype != DType::FP16) {
    problems.push_back(
        fmt::format("{}: {} needs model.dtype = \"bf16\" or \"fp16\": \"overlap_moe_expert_parallel_"
                    "comm is only supported with bf16 or fp16 model\"",
                    src, flag));
  }
}

// framework.moe_dispatcher = "flex": Megatron-Core's flex token dispatcher (DeepEP or HybridEP) over the
// expert-parallel group. What twin costs of it is the deduplicated exchange across EP ranks (model/ops/moe_ops.cpp): an
// MoE key; at ep = 1 it exchanges nothing, which twin sim notes rather than refuses (so that twin search keeps those
// plans). Its expert-tensor-parallel group (ETP x EP) and HybridEP's padding are not modelled, and Megatron-Core
// refuses DeepEP with --moe-pad-expert-input-to-capacity (transformer_config.py lines 1074-1081 at b0cc2706).
void flex_dispatcher(const Scenario& scenario, std::vector<std::string>& problems) {
  if (scenario.framework.moe_dispatcher != MoeDispatcher::Flex) return;
  const ModelSpec& m = scenario.model;
  const ParallelSpec& p = scenario.parallel;
  const std::string& src = scenario.source;
  const std::string flag = "framework.moe_dispatcher = \"flex\" (Megatron-Core's --moe-token-dispatcher-type flex)";
  if (scenario.framework.name != Framework::Megatron) {
    problems.push_back(fmt::format("{}: {} needs framework.name = \"megatron\", got \"{}\"", src, flag,
                                   to_string(scenario.framework.name)));
  }
  if (m.experts <= 0) {
    problems.push_back(fmt::format("{}: {} deduplicates the tokens sent across expert-parallel ranks: it is a "
                                   "Mixture-of-Experts key, it needs model.experts > 0 (got {})",
                                   src, flag, m.experts));
  }
  if (p.etp > 1) {
    problems.push_back(
        fmt::format("{}: {} with parallel.etp = {}: twin costs the flex dispatcher over the "
                    "expert-parallel group only, not Megatron-Core's ETP x EP group (use etp = 1)",
                    src, flag, p.etp));
  }
  if (m.pad_to_capacity) {
    problems.push_back(
        fmt::format("{}: {} with model.pad_to_capacity: \"Flex token dispatcher with deepep backend "
                    "does not support moe_pad_expert_input_to_capacity\"",
                    src, flag));
  }
}

}  // namespace

// Mixture-of-Experts: the router's choice, the expert split and the rules Megatron-Core checks
// (megatron/training/arguments.py, megatron/core/transformer/transformer_config.py, megatron/core/parallel_state.py).
void check_mixture_of_experts(const Scenario& scenario, SizesKnown known, std::vector<std::string>& problems) {
  const ModelSpec& m = scenario.model;
  const ParallelSpec& p = scenario.parallel;
  const std::string& src = scenario.source;
  auto require_positive = [&](std::string_view field, std::int64_t value) {
    if (value <= 0) problems.push_back(fmt::format("{}: {} must be a positive integer, got {}", src, field, value));
    return value > 0;
  };
  a2a_overlap(scenario, problems);
  flex_dispatcher(scenario, problems);
  const bool ep_ok = require_positive("parallel.ep", p.ep), etp_ok = require_positive("parallel.etp", p.etp);
  if (m.experts < 0)
    problems.push_back(fmt::format("{}: model.experts must be >= 0 (0: dense), got {}", src, m.experts));
  // A bound far above every published MoE (384 routed experts: Kimi K2; 256: DeepSeek-V3), under which every table
  // kept per expert (routing shares, a rank's local experts) stays small: past it the Program would grow without limit.
  constexpr std::int64_t kMaxExperts = 16384;
  if (m.experts > kMaxExperts) {
    problems.push_back(fmt::format("{}: model.experts = {} is past twin's bound of {} experts (the largest published "
                                   "MoE models have a few hundred)",
                                   src, m.experts, kMaxExperts));
    return;
  }
  if (m.experts <= 0) {
    if (p.ep > 1 || p.etp > 1) {
      problems.push_back(
          fmt::format("{}: parallel.ep = {} and parallel.etp = {} split the experts of MoE layers: "
                      "they need model.experts > 0",
                      src, p.ep, p.etp));
    }
    return;
  }
  if (m.top_k < 1 || m.top_k > m.experts) {
    problems.push_back(
        fmt::format("{}: model.top_k must be in [1, model.experts = {}], got {}", src, m.experts, m.top_k));
  }
  if (ep_ok && m.experts % p.ep != 0) {
    problems.push_back(
        fmt::format("{}: model.experts ({}) must be divisible by parallel.ep ({}): each EP rank "
                    "holds whole experts",
                    src, m.experts, p.ep));
  }
  if (m.moe_ffn_hidden < 0) {
    problems.push_back(fmt::format("{}: model.moe_ffn_hidden must be positive, got {}", src, m.moe_ffn_hidden));
  } else if (etp_ok && known.hidden && scenario.moe_ffn_hidden() % p.etp != 0) {
    problems.push_back(fmt::format("{}: model.moe_ffn_hidden ({}) must be divisible by parallel.etp ({})", src,
                                   scenario.moe_ffn_hidden(), p.etp));
  }
  if (m.shared_experts < 0) {
    problems.push_back(fmt::format("{}: model.shared_experts must be >= 0, got {}", src, m.shared_experts));
  }
  if (known.layers && (m.dense_layers < 0 || m.dense_layers >= m.layers)) {
    problems.push_back(
        fmt::format("{}: model.dense_layers must be in [0, model.layers = {}) (at least one MoE "
                    "layer), got {}",
                    src, m.layers, m.dense_layers));
  }
  if (!(m.capacity_factor >= 0)) {
    problems.push_back(
        fmt::format("{}: model.capacity_factor must be >= 0 (0: dropless), got {}", src, m.capacity_factor));
  }
  if (m.pad_to_capacity && !(m.capacity_factor > 0)) {
    problems.push_back(fmt::format(
        "{}: model.pad_to_capacity pads every expert to its capacity: it needs model.capacity_factor > 0 "
        "(Megatron-Core asserts the same of --moe-pad-expert-input-to-capacity)",
        src));
  }
  if (!(m.expert_load_skew >= 0 && m.expert_load_skew <= 10)) {
    problems.push_back(
        fmt::format("{}: model.expert_load_skew must be in [0, 10] (0: balanced), got {}", src, m.expert_load_skew));
  }
  if (!(m.moe_aux_loss_coeff >= 0 && m.moe_aux_loss_coeff <= 1e3)) {
    problems.push_back(
        fmt::format("{}: model.moe_aux_loss_coeff must be in [0, 1000] (0: no load-balancing loss), got {}", src,
                    m.moe_aux_loss_coeff));
  }
  expert_grid(scenario, known, ep_ok && etp_ok, problems);
}

}  // namespace twin::model
