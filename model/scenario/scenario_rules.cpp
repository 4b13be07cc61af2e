// The rules a valid scenario obeys, one function per part of it; every problem is kept, each naming its fields and
// their values. parse_scenario reports them after the fields were read; build_program checks them again.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "model/scenario/scenario_rules.hpp"
#include "model/scenario/scenario.hpp"

namespace twin::model {
namespace {

class RuleCheck {
 public:
  explicit RuleCheck(const Scenario& s)
      : scenario(s), m(s.model), p(s.parallel), c(s.cluster), t(s.training), src(s.source) {}

  std::vector<std::string> run(bool world_size) {
    check_world_size = world_size;
    positive_sizes();
    model_shape();
    pipeline_split();
    batch_and_world();
    schedule();
    cluster_measurements();
    measured_profile();
    sharding();
    attention();
    composer_limits();
    block_recompute();
    deepspeed();
    param_gather_overlap();
    check_fp8_param_gather(scenario, problems);
    check_cuda_graphs(scenario, problems);
    check_transformer_engine(scenario, problems);
    partitioned_activations();
    mixture_of_experts();
    check_failure_model(scenario, problems);
    context_parallelism();
    fp8();
    training();
    return std::move(problems);
  }

 private:
  bool require_positive(std::string_view field, std::int64_t value) {
    if (value <= 0) problems.push_back(fmt::format("{}: {} must be a positive integer, got {}", src, field, value));
    return value > 0;
  }

  // Every size that must be positive; the rules below divide by a size only once it is.
  void positive_sizes() {
    if (m.name.empty())
      problems.push_back(fmt::format("{}: model.name must not be empty (it names every report)", src));
    layers_ok = require_positive("model.layers", m.layers);
    hidden_ok = require_positive("model.hidden", m.hidden);
    heads_ok = require_positive("model.heads", m.heads);
    seq_ok = require_positive("model.seq_len", m.seq_len);
    require_positive("model.vocab", m.vocab);
    if (m.ffn_hidden < 0)
      problems.push_back(fmt::format("{}: model.ffn_hidden must be positive, got {}", src, m.ffn_hidden));
    tp_ok = require_positive("parallel.tp", p.tp);
    pp_ok = require_positive("parallel.pp", p.pp);
    dp_ok = require_positive("parallel.dp", p.dp);
    mb_ok = require_positive("parallel.micro_batch", p.micro_batch);
    gb_ok = require_positive("parallel.global_batch", p.global_batch);
    v_ok = require_positive("parallel.virtual_stages", p.virtual_stages);
    cp_ok = require_positive("parallel.cp", p.cp);
    require_positive("parallel.vocab_pad_multiple", p.vocab_pad_multiple);
    nodes_ok = require_positive("cluster.nodes", c.nodes);
    gpn_ok = require_positive("cluster.gpus_per_node", c.gpus_per_node);
  }

  // The model's shapes against each other and against TP: whole heads, key/value groups, rotary pairs.
  void model_shape() {
    if (hidden_ok && heads_ok && m.head_dim_given == 0 && m.hidden % m.heads != 0) {
      problems.push_back(fmt::format(
          "{}: model.hidden ({}) must be divisible by model.heads ({}) (or give each head's width, model.head_dim)",
          src, m.hidden, m.heads));
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
    const bool whole_heads = m.head_dim_given > 0 || (heads_ok && m.hidden % m.heads == 0);
    if (!(m.rotary_fraction > 0 && m.rotary_fraction <= 1)) {
      problems.push_back(fmt::format("{}: model.rotary_fraction must be in (0, 1], got {}", src, m.rotary_fraction));
    } else if (m.rotary_fraction != 1 && !rope) {
      problems.push_back(
          fmt::format("{}: model.rotary_fraction = {} needs model.position_embedding = \"rope\" (got \"{}\")", src,
                      m.rotary_fraction, to_string(m.position_embedding)));
    } else if (hidden_ok && heads_ok && whole_heads && rope && m.rotary_fraction == 1 && m.head_dim() % 2 != 0) {
      problems.push_back(
          fmt::format("{}: model.position_embedding = \"rope\" rotates pairs of a head's dimensions: {} = {} must "
                      "be even",
                      src, m.head_dim_given > 0 ? "model.head_dim" : "model.hidden / model.heads", m.head_dim()));
    } else if (hidden_ok && heads_ok && whole_heads && rope && (m.rotary_dim() < 2 || m.rotary_dim() % 2 != 0)) {
      problems.push_back(fmt::format(
          "{}: model.rotary_fraction = {} rotates int({} x {}) = {} dimensions of each head: it must be a positive "
          "even number (whole pairs)",
          src, m.rotary_fraction, m.head_dim(), m.rotary_fraction, m.rotary_dim()));
    }
    if (hidden_ok && tp_ok && m.ffn_hidden >= 0 && scenario.ffn_hidden() % p.tp != 0) {
      problems.push_back(fmt::format("{}: model.ffn_hidden ({}) must be divisible by parallel.tp ({})", src,
                                     scenario.ffn_hidden(), p.tp));
    }
  }

  // How the layers split into stages and chunks: evenly, or with lighter first and last stages.
  void pipeline_split() {
    if (uneven) {
      const std::int64_t given = (p.first_stage_layers > 0) + (p.last_stage_layers > 0);
      if (p.first_stage_layers < 0 || p.last_stage_layers < 0) {
        problems.push_back(
            fmt::format("{}: parallel.first_stage_layers and parallel.last_stage_layers must be >= 0 (0: "
                        "an even split), got {} and {}",
                        src, p.first_stage_layers, p.last_stage_layers));
      } else if (p.account_for_embedding || p.account_for_loss) {
        problems.push_back(fmt::format(
            "{}: parallel.first_stage_layers / last_stage_layers and parallel.account_for_embedding / "
            "account_for_loss are two ways to lighten the end stages: give one (Megatron-Core refuses both)",
            src));
      } else if (pp_ok && layers_ok && p.pp < 2) {
        problems.push_back(
            fmt::format("{}: parallel.first_stage_layers / last_stage_layers need a pipeline "
                        "(parallel.pp >= 2), got parallel.pp = {}",
                        src, p.pp));
      } else if (pp_ok && layers_ok) {
        const std::int64_t middle = p.pp - given, rest = m.layers - p.first_stage_layers - p.last_stage_layers;
        const bool fits = middle == 0 ? rest == 0 : rest >= middle && rest % middle == 0;
        const std::int64_t v = v_ok && !p.bidirectional() ? p.virtual_stages : 1;  // DualPipe: a block, a chunk
        if (fits &&
            (p.first_stage_layers % v != 0 || p.last_stage_layers % v != 0 || (middle > 0 && rest / middle % v != 0))) {
          problems.push_back(
              fmt::format("{}: with parallel.virtual_stages = {} every stage's layers split evenly over its chunks: "
                          "parallel.first_stage_layers ({}), parallel.last_stage_layers ({}) and the other stages' "
                          "{} each must be multiples of {}",
                          src, v, p.first_stage_layers, p.last_stage_layers, middle > 0 ? rest / middle : 0, v));
        }
        if (!fits) {
          problems.push_back(
              fmt::format("{}: model.layers ({}) minus parallel.first_stage_layers ({}) and "
                          "parallel.last_stage_layers ({}) leaves {} for the other {} stage(s): it must "
                          "split evenly, at least one layer each",
                          src, m.layers, p.first_stage_layers, p.last_stage_layers, rest, middle));
        }
      }
    }
    const std::int64_t counted = m.layers + (p.account_for_embedding ? 1 : 0) + (p.account_for_loss ? 1 : 0);
    if (!uneven && counted != m.layers && layers_ok && pp_ok && v_ok && counted % (p.pp * p.virtual_stages) != 0) {
      problems.push_back(
          fmt::format("{}: model.layers ({}) with the embedding and / or loss counted as layers "
                      "(parallel.account_for_embedding / account_for_loss) makes {}: it must be divisible by "
                      "parallel.pp * parallel.virtual_stages ({} * {} = {})",
                      src, m.layers, counted, p.pp, p.virtual_stages, p.pp * p.virtual_stages));
    }
    if (!uneven && counted == m.layers && layers_ok && pp_ok && v_ok && p.bidirectional() && m.layers % p.pp != 0) {
      problems.push_back(fmt::format("{}: model.layers ({}) must be divisible by parallel.pp ({}): each direction of "
                                     "dualpipe holds the model in pp blocks (or give first_stage_layers / last_stage_layers)",
                                     src, m.layers, p.pp));
    }
    if (!uneven && counted == m.layers && layers_ok && pp_ok && v_ok && !p.bidirectional() &&
        m.layers % (p.pp * p.virtual_stages) != 0) {
      problems.push_back(
          fmt::format("{}: model.layers ({}) must be divisible by parallel.pp * parallel.virtual_stages "
                      "({} * {} = {})",
                      src, m.layers, p.pp, p.virtual_stages, p.pp * p.virtual_stages));
    }
  }

  // The batch splits into micro-batches on every replica, and the plan fills the cluster.
  void batch_and_world() {
    if (dp_ok && mb_ok && gb_ok && p.global_batch % (p.dp * p.micro_batch) != 0) {
      problems.push_back(
          fmt::format("{}: parallel.global_batch ({}) must be divisible by parallel.dp * "
                      "parallel.micro_batch ({} * {} = {})",
                      src, p.global_batch, p.dp, p.micro_batch, p.dp * p.micro_batch));
    }
    // Ranks are ints throughout (model/plan/ranks.hpp), as in NCCL and MPI: a cluster past that is refused by name.
    if (nodes_ok && gpn_ok && c.nodes > std::numeric_limits<int>::max() / c.gpus_per_node) {
      problems.push_back(fmt::format("{}: cluster.nodes = {} x cluster.gpus_per_node = {} is past {} GPUs, the most "
                                     "ranks a job can number (ranks are 32-bit ints, as in NCCL and MPI)",
                                     src, c.nodes, c.gpus_per_node, std::numeric_limits<int>::max()));
      nodes_ok = false;
    }
    if (check_world_size && tp_ok && pp_ok && dp_ok && cp_ok && nodes_ok && gpn_ok &&
        p.world_size() != c.total_gpus()) {
      const std::string plan =
          p.cp > 1 ? fmt::format(
                         "parallel.tp * parallel.cp * parallel.pp * parallel.dp = {} * "
                         "{} * {} * {}",
                         p.tp, p.cp, p.pp, p.dp)
                   : fmt::format("parallel.tp * parallel.pp * parallel.dp = {} * {} * {}", p.tp, p.pp, p.dp);
      problems.push_back(
          fmt::format("{}: {} = {} does not match the cluster's {} GPUs (cluster.nodes {} x "
                      "cluster.gpus_per_node {})",
                      src, plan, p.world_size(), c.total_gpus(), c.nodes, c.gpus_per_node));
    }
  }

  // The interleaved schedule's chunks and its groups of micro-batches.
  void schedule() {
    if (v_ok && p.virtual_stages > 1 && p.schedule != ScheduleKind::Interleaved && !p.v_shape() &&
        !p.bidirectional()) {
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
      if (p.microbatch_group < 0 || (dp_ok && mb_ok && gb_ok && p.global_batch % (p.dp * p.micro_batch) == 0 &&
                                     p.microbatch_group > p.micro_batches())) {
        problems.push_back(
            fmt::format("{}: parallel.microbatch_group ({}) must be 1 to the micro-batches per pipeline (0: groups of "
                        "parallel.pp)",
                        src, p.microbatch_group));
      }
      if (p.microbatch_group == 0 && dp_ok && mb_ok && gb_ok && pp_ok && p.global_batch % (p.dp * p.micro_batch) == 0 &&
          p.micro_batches() % p.pp != 0) {
        problems.push_back(
            fmt::format("{}: the interleaved schedule runs micro-batches in groups of parallel.pp: "
                        "micro-batches per pipeline (global_batch / (dp * micro_batch) = {}) must be "
                        "divisible by parallel.pp ({}), or give parallel.microbatch_group (any number of "
                        "micro-batches runs in groups of that many)",
                        src, p.micro_batches(), p.pp));
      }
    } else if (p.microbatch_group != 0) {
      problems.push_back(
          fmt::format("{}: parallel.microbatch_group ({}) groups the interleaved schedule's "
                      "micro-batches: it needs parallel.schedule = \"interleaved\"",
                      src, p.microbatch_group));
    }
  }

  // The cluster's own measurements and network, when given, are real rates.
  // A profile is the cluster's measurements in one file: the same rates given as keys too would be two measurements
  // of one thing, and which one twin used would be a guess.
  void measured_profile() {
    if (c.gpu_profile.empty()) return;
    std::error_code error;
    if (!std::filesystem::is_regular_file(c.gpu_profile, error)) {
      problems.push_back(fmt::format("{}: cluster.gpu_profile: no such file '{}' (twin calibrate writes one)", src,
                                     c.gpu_profile));
    }
    for (const auto& [key, given] : {std::pair{"gemm_tflops", c.gemm_tflops > 0}, {"hbm_gb_per_s", c.hbm_gb_per_s > 0},
                                     {"attention_gemm_hbm_fraction", c.attention_gemm_hbm_fraction > 0}}) {
      if (given) {
        problems.push_back(fmt::format("{}: cluster.{} and cluster.gpu_profile both measure the GPU: give one (the "
                                       "profile's [gemm], [memory] and [attention] hold these rates)",
                                       src, key));
      }
    }
  }

  void cluster_measurements() {
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
    const double host_us = c.host_us_per_kernel.value_or(0);
    if (!(host_us == 0 || (host_us >= 0.1 && host_us <= 10000))) {
      problems.push_back(
          fmt::format("{}: cluster.host_us_per_kernel must be the host's microseconds to issue one kernel "
                      "(0.1..10000), or 0 for a host that is never behind; got {}",
                      src, host_us));
    }
  }

  // ZeRO stages, as each framework has them.
  void sharding() {
    if (p.zero_stage < 0 || p.zero_stage > 3) {
      problems.push_back(fmt::format("{}: parallel.zero_stage must be 0, 1, 2 or 3, got {}", src, p.zero_stage));
    } else if (p.zero_stage == 2 && scenario.framework.name != Framework::Megatron) {
      // DeepSpeed's pipeline engine refuses ZeRO-2 (runtime/pipe/engine.py asserts zero stage < 2); Composer's FSDP
      // is modelled as FULL_SHARD (3) or DDP (0).
      problems.push_back(
          fmt::format("{}: parallel.zero_stage = 2 (gradients sharded every micro-batch) is modelled on Megatron's "
                      "plan layout: it needs framework.name = \"megatron\", got \"{}\"",
                      src, to_string(scenario.framework.name)));
    } else if (p.zero_stage == 2 && !p.dp_overlap) {
      problems.push_back(fmt::format(
          "{}: parallel.zero_stage = 2 reduce-scatters each micro-batch's gradients under the backward pass: it "
          "needs parallel.dp_overlap = true",
          src));
    } else if (p.zero_stage == 3 && !is_composer) {
      problems.push_back(
          fmt::format("{}: parallel.zero_stage = 3 is PyTorch FSDP's FULL_SHARD, which twin models as Composer runs "
                      "it: it needs framework.name = \"composer\", got \"{}\"",
                      src, to_string(scenario.framework.name)));
    } else if (p.zero_stage == 1 && is_composer) {
      problems.push_back(
          fmt::format("{}: framework.name = \"composer\" shards with FSDP: parallel.zero_stage must be 3 "
                      "(FULL_SHARD) or 0 (DDP), got 1",
                      src));
    }
  }

  // FlashAttention's head sizes.
  void attention() {
    // FlashAttention's kernels take heads of at most 128 (v1) or 256 (v2) (flash-attention's README, "head dimensions
    // up to 128" for v1 and "all head dimensions up to 256" for v2).
    if (heads_ok && hidden_ok && m.heads > 0) {
      const std::int64_t head_dim = m.head_dim();
      const std::int64_t most = scenario.framework.attention == AttentionKind::Flash1   ? 128
                                : scenario.framework.attention == AttentionKind::Flash2 ? 256
                                                                                        : 0;
      if (most > 0 && head_dim > most) {
        problems.push_back(fmt::format("{}: framework.attention = \"{}\" takes heads of at most {} dimensions; {} = {}",
                                       src, to_string(scenario.framework.attention), most,
                                       m.head_dim_given > 0
                                           ? "model.head_dim"
                                           : fmt::format("model.hidden / model.heads = {} / {}", m.hidden, m.heads),
                                       head_dim));
      }
    }
  }

  // What Composer (llm-foundry's MPT) can run.
  void composer_limits() {
    // Composer (llm-foundry's MPT) has neither tensor nor pipeline parallelism, nor Megatron's selective or block
    // recompute: its activation checkpointing wraps whole blocks.
    if (is_composer) {
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
  }

  // Megatron-LM's block recompute.
  void block_recompute() {
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
      std::int64_t largest_chunk = 0;
      for (std::int64_t vs = 0; vs < p.pp * p.virtual_stages; ++vs) {
        largest_chunk = std::max(largest_chunk, scenario.layers_in_virtual_stage(vs));
      }
      if (p.recompute_num_layers > largest_chunk) {
        problems.push_back(
            fmt::format("{}: parallel.recompute_num_layers ({}) is more than a chunk's layers ({}): "
                        "it counts layers per chunk (0: every layer)",
                        src, p.recompute_num_layers, largest_chunk));
      }
    }
  }

  // DeepSpeed's BF16_Optimizer and release.
  void deepspeed() {
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
        problems.push_back(
            fmt::format("{}: framework.deepspeed_version is DeepSpeed's release: it needs "
                        "framework.name = \"deepspeed\", got \"{}\"",
                        src, to_string(scenario.framework.name)));
      }
      if (version < std::array<int, 3>{0, 3, 0}) {
        problems.push_back(
            fmt::format("{}: framework.deepspeed_version = \"{}\" predates DeepSpeed's pipeline engine "
                        "(0.3.0), where twin's model of DeepSpeed starts",
                        src, version_text(version)));
      } else if (scenario.framework.bf16_optimizer && version < std::array<int, 3>{0, 6, 2}) {
        problems.push_back(
            fmt::format("{}: framework.bf16_optimizer is DeepSpeed's BF16_Optimizer, first released in "
                        "0.6.2; framework.deepspeed_version = \"{}\" has none",
                        src, version_text(version)));
      }
    }
  }

  // Megatron-Core's --overlap-param-gather.
  void param_gather_overlap() {
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
  }

  // DeepSpeed's partition_activations, and sequence parallelism's split of the sequence.
  void partitioned_activations() {
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
  }

  // Mixture-of-Experts (model/scenario/scenario_rules_moe.cpp).
  void mixture_of_experts() {
    check_mixture_of_experts(scenario, SizesKnown{layers_ok, hidden_ok, tp_ok, dp_ok}, problems);
    check_zero_bubble(scenario, problems);
  }

  // The optimizer's and the schedule's hyper-parameters.
  void training() {
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
    if (!(t.adam_eps > 0))
      problems.push_back(fmt::format("{}: training.adam_eps must be > 0, got {}", src, t.adam_eps));
    if (!(t.init_std > 0))
      problems.push_back(fmt::format("{}: training.init_std must be > 0, got {}", src, t.init_std));
  }

  // Context parallelism as Megatron-Core and Transformer Engine run it (model/ops/context_parallel.hpp).
  void context_parallelism() {
    if (!cp_ok || p.cp == 1) return;
    if (seq_ok && m.seq_len % (2 * p.cp) != 0) {
      problems.push_back(
          fmt::format("{}: model.seq_len ({}) must be divisible by 2 * parallel.cp ({}): each CP rank "
                      "holds two chunks of every sequence (the causal load balance)",
                      src, m.seq_len, 2 * p.cp));
    }
    if (scenario.framework.name != Framework::Megatron) {
      problems.push_back(
          fmt::format("{}: parallel.cp = {} is Megatron-Core's context parallelism: it needs "
                      "framework.name = \"megatron\", got \"{}\"",
                      src, p.cp, to_string(scenario.framework.name)));
    }
    if (scenario.framework.attention == AttentionKind::Unfused) {
      problems.push_back(
          fmt::format("{}: parallel.cp = {} runs the attention core as fused blocks (Transformer "
                      "Engine's flash or cuDNN attention): framework.attention must be \"flash2\" "
                      "(or \"flash1\"), got \"unfused\"",
                      src, p.cp));
    }
    if (m.position_embedding == PositionEmbedding::Alibi) {
      problems.push_back(
          fmt::format("{}: parallel.cp = {} with ALiBi: Transformer Engine's context parallelism "
                      "takes no attention bias (model.position_embedding = \"rope\" or \"learned\")",
                      src, p.cp));
    }
    const std::int64_t split = p.tp * p.cp;
    if (scenario.framework.cp_comm == CpComm::AllToAll && tp_ok && heads_ok &&
        (m.heads % split != 0 || m.key_value_heads() % split != 0)) {
      problems.push_back(
          fmt::format("{}: framework.cp_comm = \"a2a\" gives each of the tp * cp = {} ranks whole "
                      "heads: model.heads ({}) and the key/value heads ({}) must be divisible by {}",
                      src, split, m.heads, m.key_value_heads(), split));
    }
  }

  // FP8 GEMMs (model/scenario/precision.hpp): Megatron-Core through Transformer Engine, on parts with FP8 tensor cores.
  void fp8() {
    const auto& f = scenario.framework;
    if (m.fp8 == Fp8Format::None) {
      if (f.fp8_recipe != Fp8Recipe::Delayed) {
        problems.push_back(
            fmt::format("{}: framework.fp8_recipe = \"{}\" scales FP8 tensors: it needs model.fp8 "
                        "(\"hybrid\" or \"e4m3\"), got \"none\"",
                        src, to_string(f.fp8_recipe)));
      }
      return;
    }
    if (f.name != Framework::Megatron) {
      problems.push_back(
          fmt::format("{}: model.fp8 is Transformer Engine's FP8 under Megatron-Core: it needs "
                      "framework.name = \"megatron\", got \"{}\"",
                      src, to_string(f.name)));
    }
    if (m.dtype == DType::FP32) {
      problems.push_back(
          fmt::format("{}: model.fp8 runs the GEMMs in FP8 and the rest in 16 bits: model.dtype must "
                      "be \"bf16\" or \"fp16\", got \"fp32\"",
                      src));
    }
    const bool ampere = c.node == NodeKind::DgxA100 || c.node == NodeKind::DgxA100_40GB;
    const bool blackwell = c.node == NodeKind::DgxB200 || c.node == NodeKind::Gb200Nvl72;
    if (ampere) {
      problems.push_back(
          fmt::format("{}: model.fp8 needs FP8 tensor cores (Hopper or Blackwell); cluster.node = "
                      "\"{}\" has none",
                      src, to_string(c.node)));
    } else if (f.fp8_recipe == Fp8Recipe::Mxfp8 && !blackwell && c.node != NodeKind::CpuHost) {
      problems.push_back(
          fmt::format("{}: framework.fp8_recipe = \"mxfp8\" needs Blackwell's block-scaled tensor "
                      "cores (cluster.node = \"dgx-b200\" or \"gb200-nvl72\"), got \"{}\"",
                      src, to_string(c.node)));
    }
  }

  const Scenario& scenario;
  const ModelSpec& m;
  const ParallelSpec& p;
  const ClusterSpec& c;
  const TrainingSpec& t;
  const std::string& src;
  std::vector<std::string> problems;
  bool layers_ok = false, hidden_ok = false, heads_ok = false, seq_ok = false, tp_ok = false, pp_ok = false,
       dp_ok = false, mb_ok = false, gb_ok = false, v_ok = false, nodes_ok = false, gpn_ok = false, cp_ok = false;
  bool check_world_size = true;  // false when dp could not be derived (that problem names the world size)
  const bool uneven = p.first_stage_layers != 0 || p.last_stage_layers != 0;
  const bool is_composer = scenario.framework.name == Framework::Composer;
};

}  // namespace

std::vector<std::string> scenario_rule_violations(const Scenario& scenario, bool check_world_size) {
  return RuleCheck(scenario).run(check_world_size);
}

std::vector<std::string> validation_problems(const Scenario& scenario) {
  return scenario_rule_violations(scenario, true);
}

}  // namespace twin::model
