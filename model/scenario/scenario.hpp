// Scenario: what to train (ModelSpec), how to split it (ParallelSpec), on what (ClusterSpec), with which framework's
// habits (FrameworkSpec) and training hyper-parameters (TrainingSpec). Loaded from TOML (scenario_toml.cpp), validated
// (scenario_rules.cpp), immutable after; its names and derived quantities are in scenario.cpp.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "model/scenario/cp_comm.hpp"
#include "model/scenario/errors.hpp"
#include "model/scenario/precision.hpp"

namespace twin::model {

enum class DType : std::uint8_t { BF16, FP16, FP32 };
// ZeroBubbleH1: Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024), the handcrafted ZB-H1: 1F1B with each
// backward split into B (input gradient) and W (weight gradient), W deferred into the cooldown's bubble.
// ZeroBubbleV: the same paper's ZB-V, two chunks per stage placed in a V (ParallelSpec::virtual_stage).
// DualPipeV: DeepSeek's DualPipeV (deepseek-ai/DualPipe, dualpipev.py), DualPipe cut in half onto the same V.
// DualPipe: DeepSeek-V3's bidirectional DualPipe (deepseek-ai/DualPipe, dualpipe.py): two pipelines in opposite
// directions over the same stages, each stage holding a block of each (ParallelSpec::bidirectional).
enum class ScheduleKind : std::uint8_t {
  GPipe,
  OneFOneB,
  Interleaved,
  ZeroBubbleH1,
  ZeroBubbleV,
  DualPipeV,
  DualPipe
};
enum class Recompute : std::uint8_t { None, Selective, Full };
enum class NodeKind : std::uint8_t { DgxA100, DgxA100_40GB, DgxH100, DgxH200, HgxH800, DgxB200, Gb200Nvl72, CpuHost };
// The inter-node fabric (cluster.fabric): the node's own (HDR InfiniBand for DGX A100, NDR for the Hopper and
// Blackwell nodes), or one named: InfiniBand HDR / NDR / XDR fat-trees, or RoCE over 400 GbE as Llama 3 ran on.
enum class Fabric : std::uint8_t { NodeDefault, InfinibandHdr, InfinibandNdr, InfinibandXdr, Roce };
// Megatron-LM; DeepSpeed's pipeline engine on Megatron-DeepSpeed's layers; MosaicML Composer (llm-foundry's trainer,
// 2023) on PyTorch 1.13: eager PyTorch modules under autocast, data parallelism by PyTorch FSDP (or DDP), no TP or PP.
enum class Framework : std::uint8_t { Megatron, DeepSpeed, Composer };
// How the attention core runs: Megatron-LM's (Q K^T and P V as batched GEMMs through HBM, a softmax kernel between)
// or FlashAttention (Dao et al. 2022; FlashAttention-2, Dao 2023): one fused kernel per pass that never writes the
// scores, recomputing them in its backward.
enum class AttentionKind : std::uint8_t { Unfused, Flash1, Flash2 };
// Megatron-Core's MoE token dispatcher (--moe-token-dispatcher-type): "alltoall" sends one row per (token, expert) to
// the expert's rank and back; "flex" (DeepEP or HybridEP, --moe-flex-dispatcher-backend) sends a token once to each
// rank in its node that holds any of its experts, and once to each other node that does, which forwards it over
// NVLink (model/ops/moe_ops.hpp, dispatch_peer_bytes).
enum class MoeDispatcher : std::uint8_t { AllToAll, Flex };
// How a token's position enters the model: a learned embedding added to the token's (GPT-2, Megatron-LM), ALiBi's
// per-head linear bias on the attention scores and no position embedding at all (Press et al., ICLR 2022; BLOOM), or
// rotary embeddings that rotate each query and key by its position (Su et al. 2021, RoFormer; Llama; Megatron-Core's
// --position-embedding-type rope, non-interleaved).
enum class PositionEmbedding : std::uint8_t { Learned, Alibi, Rope };
// The layer norms of a block: LayerNorm (GPT-2) or RMSNorm (Zhang and Sennrich 2019; Llama): no mean, no bias.
enum class Norm : std::uint8_t { LayerNorm, RmsNorm };
// The MLP's activation: GELU on one up-projection (GPT-2), or SwiGLU, silu(gate) * up on an up-projection twice as
// wide (Shazeer 2020, "GLU Variants Improve Transformer"; Llama; Megatron-Core's --swiglu).
enum class Activation : std::uint8_t { Gelu, Swiglu };

int dtype_bytes(DType dtype);
std::string_view to_string(DType dtype);
std::string_view to_string(ScheduleKind schedule);
std::string_view to_string(Recompute recompute);
std::string_view to_string(NodeKind node);
std::string_view to_string(Fabric fabric);
std::string_view to_string(Framework framework);
std::string_view to_string(PositionEmbedding position);
std::string_view to_string(Norm norm);
std::string_view to_string(Activation activation);
std::string_view to_string(AttentionKind attention);
std::string_view to_string(MoeDispatcher dispatcher);

// GPUs per node and memory per GPU (bytes) of the node kinds a scenario may name: the one table of them. The full
// performance specs (FLOP/s, HBM and link bandwidths) live in topology/, which takes its GPU memory from here.
int default_gpus_per_node(NodeKind node);
double gpu_memory_bytes(NodeKind node);

struct ModelSpec {
  std::string name = "gpt";
  std::int64_t layers = 0;
  std::int64_t hidden = 0;
  std::int64_t heads = 0;
  std::int64_t ffn_hidden = 0;  // 4 * hidden unless given
  std::int64_t seq_len = 0;
  std::int64_t vocab = 0;       // as given; see Scenario::padded_vocab()
  DType dtype = DType::BF16;
  PositionEmbedding position_embedding = PositionEmbedding::Learned;
  Norm norm = Norm::LayerNorm;
  Activation activation = Activation::Gelu;
  // Key/value heads (grouped-query attention, Ainslie et al. 2023: each group of heads / kv_heads query heads shares
  // one key and value head; Megatron-Core's --num-query-groups); 0: as many as heads (multi-head attention).
  std::int64_t kv_heads = 0;
  // Each attention head's dimensions (Megatron-Core's --kv-channels); 0: hidden / heads. Qwen3 sets it apart from
  // hidden: 32 heads of 128 over hidden 2048, so the queries are 4096 wide and the output projection maps 4096 to 2048.
  std::int64_t head_dim_given = 0;
  bool linear_bias = true;  // biases on the linear layers (GPT-2); false: none (Llama; --disable-bias-linear)
  // Parallel attention and MLP (GPT-J, GPT-NeoX's gpt_j_residual): y = x + attn(ln1(x)) + mlp(ln2(x)), the two
  // branches' row-parallel partial sums added before one TP all-reduce; false: GPT-2's sequential block.
  bool parallel_residual = false;
  // With parallel_residual: one layer norm feeds both branches (GPT-J, PaLM, Falcon-7B; GPT-NeoX's gpt_j_tied), so a
  // layer has one norm and its backward one TP all-reduce; false: one norm per branch (GPT-NeoX-20B, Falcon-40B).
  bool shared_norm = false;
  // FP8 GEMMs through Transformer Engine (Megatron-Core's --fp8-format; model/scenario/precision.hpp): none, hybrid or e4m3.
  Fp8Format fp8 = Fp8Format::None;

  // Rotary embeddings on the leading fraction of each head's dimensions (GPT-NeoX's rotary_pct, Megatron-Core's
  // --rotary-percent); 1: all of them. With position_embedding = "rope" only.
  double rotary_fraction = 1.0;

  // Mixture-of-Experts, as Megatron-Core's MoE layer runs it (megatron/core/transformer/moe/: a router GEMM, top-k of
  // a softmax, tokens exchanged all-to-all over the expert-parallel group, each rank's experts as a grouped GEMM).
  std::int64_t experts = 0;         // routed experts per MoE layer (--num-experts); 0: a dense model
  std::int64_t top_k = 2;           // experts each token is routed to (--moe-router-topk, Megatron's default 2)
  std::int64_t moe_ffn_hidden = 0;  // each expert's MLP width (--moe-ffn-hidden-size); 0: ffn_hidden, as Megatron
  std::int64_t shared_experts = 0;  // always-on experts of width moe_ffn_hidden beside the routed ones
  std::int64_t dense_layers = 0;    // the first N transformer layers keep a dense MLP (DeepSeek-V3: 3)
  double capacity_factor = 0;       // tokens an expert takes, over its even share (--moe-expert-capacity-factor);
                                    // 0: dropless (Megatron's default)
  // Every expert's rows padded to its capacity (--moe-pad-expert-input-to-capacity; needs capacity_factor > 0):
  // Megatron-Core's drop-and-pad dispatch, whose sizes the host knows, so it neither gathers the token counts nor
  // waits for them (token_dispatcher.py, MoEAlltoAllTokenDispatcher.preprocess), and every expert computes its whole
  // capacity, padding rows included.
  bool pad_to_capacity = false;
  // How unevenly the router spreads tokens: 0 balanced; s > 0 gives expert i (0-based) a share proportional to
  // 1 / (i + 1)^s (Zipf), experts in EP-rank order, so EP rank 0 holds the hottest and sets the pace.
  double expert_load_skew = 0;
  // The auxiliary load-balancing loss's weight (Switch Transformer, arXiv:2101.03961; Megatron-Core's
  // --moe-aux-loss-coeff): each MoE layer adds coeff x its balance loss to the training loss (`twin run`).
  // Megatron-Core's default is 0; 1e-2 here, the value of the Switch Transformer paper and Megatron-Core's examples.
  double moe_aux_loss_coeff = 1e-2;

  bool is_moe() const { return experts > 0; }

  std::int64_t head_dim() const { return head_dim_given > 0 ? head_dim_given : hidden / heads; }
  // Width of the attention's queries and of its output projection's input: heads x head_dim (hidden unless
  // model.head_dim says otherwise).
  std::int64_t attention_width() const { return heads * head_dim(); }
  // Dimensions of a head the rotary embedding rotates: int(head_dim * rotary_fraction), as both frameworks truncate.
  std::int64_t rotary_dim() const {
    return static_cast<std::int64_t>(static_cast<double>(head_dim()) * rotary_fraction);
  }
  std::int64_t key_value_heads() const { return kv_heads > 0 ? kv_heads : heads; }
  // Width of the fused QKV projection's output: the queries, then the keys and values of every key/value head.
  std::int64_t qkv_width() const { return attention_width() + 2 * key_value_heads() * head_dim(); }
};

struct ParallelSpec {
  std::int64_t tp = 1;
  std::int64_t pp = 1;
  std::int64_t dp = 1;                // defaults to the cluster's GPUs / (tp * cp * pp)
  // Context parallelism (Megatron-Core's --context-parallel-size; model/ops/context_parallel.hpp): ranks that share each
  // sequence, each with seq_len / cp of its tokens.
  std::int64_t cp = 1;
  std::int64_t micro_batch = 1;       // sequences per micro-batch
  std::int64_t global_batch = 1;      // sequences per iteration
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  std::int64_t virtual_stages = 1;    // model chunks per stage (interleaved schedule)
  // The interleaved schedule's micro-batches per group (Megatron-Core's --microbatch-group-size-per-virtual-pipeline-
  // stage; the Llama 3 paper's N): 0, groups of pp. Any other N lets micro-batches be any number (schedule.hpp).
  std::int64_t microbatch_group = 0;
  Recompute recompute = Recompute::None;
  bool sequence_parallel = false;
  std::int64_t zero_stage = 0;        // 0; 1 (optimizer state sharded across DP); 2 (the gradients too, each
                                      // micro-batch's reduce-scattered into the rank's shard: FSDP sharding
                                      // optimizer state and gradients without resharding the parameters after the
                                      // forward, as Llama 3 trained, arXiv:2407.21783 section 3.3.2); 3 (parameters,
                                      // gradients and optimizer state sharded, parameters gathered per layer:
                                      // PyTorch FSDP's FULL_SHARD, framework.name = "composer")
  bool dp_overlap = false;            // reduce DP gradients under the backward pass
  // ZeRO-1 under Megatron-LM: gather the updated parameters under the next forward instead of after the optimizer
  // step (Megatron-Core's --overlap-param-gather): the first micro-batch's forward of each bucket waits for its
  // gather, which was dispatched when the bucket before it began its forward.
  bool overlap_param_gather = false;
  std::int64_t vocab_pad_multiple = 128;  // Megatron's make-vocab-size-divisible-by (times tp)
  // Transformer layers of the first and of the last pipeline stage, the others sharing the rest evenly (Megatron-Core's
  // --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers: lighter end stages make room for the
  // embedding and the LM head); 0: an even split. With interleaving each stage's layers split evenly over its chunks.
  std::int64_t first_stage_layers = 0;
  std::int64_t last_stage_layers = 0;
  // The embedding, and the loss, counted as one transformer layer each in the split (Megatron-Core's
  // --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split): the first virtual stage holds
  // one layer fewer, the last one fewer; with one layer per chunk they hold the embedding alone and the LM head and
  // loss alone, as Llama 3 405B trained (arXiv:2407.21783, section 3.3.2).
  bool account_for_embedding = false;
  bool account_for_loss = false;
  // With recompute = full, recompute only the first N transformer layers of every model chunk and keep the others'
  // activations (Megatron-LM's --recompute-method block --recompute-num-layers N: less recompute for more memory;
  // N at or above a chunk's layers recomputes them all, as Megatron does); 0: every layer.
  std::int64_t recompute_num_layers = 0;
  // Mixture-of-Experts (Megatron-Core's --expert-model-parallel-size, --expert-tensor-parallel-size): the ranks that
  // split a layer's routed experts, and those that split one expert's weights. Both grids of model/plan/ranks.hpp number
  // the same tp x cp x dp ranks of a stage, so ep x etp divides tp x cp x dp; edp = tp x cp x dp / (ep x etp).
  std::int64_t ep = 1;
  std::int64_t etp = 1;

  std::int64_t micro_batches() const { return global_batch / (dp * micro_batch); }  // m, per pipeline
  // Where the model's virtual stages (its runs of consecutive layers, 0..pp*v-1) sit. Interleaved and one chunk:
  // stage s's chunk c is virtual stage c * pp + s. In a V (ZB-V): chunk 0 is virtual stage s and chunk 1 is
  // 2 pp - 1 - s, so stage 0 holds both ends of the model and the turn (pp - 1 to pp) stays on the last stage
  // (ZB-V and DualPipeV).
  bool v_shape() const { return schedule == ScheduleKind::ZeroBubbleV || schedule == ScheduleKind::DualPipeV; }
  // DualPipe: two pipelines over the same stages in opposite directions, each a whole copy of the model in pp
  // blocks; virtual stages 0..pp-1 are the down pipeline's blocks, pp..2pp-1 the up one's, placed as in a V: stage
  // s holds down block s (chunk 0) and up block pp - 1 - s (chunk 1), the same layers as its mirror stage pp - 1 - s's
  // chunk 0. Every stage so holds two blocks' parameters, stages 0 and pp - 1 both ends of the model.
  bool bidirectional() const { return schedule == ScheduleKind::DualPipe; }
  std::int64_t virtual_stage(std::int64_t stage, std::int64_t chunk) const {
    return (v_shape() || bidirectional()) && chunk == 1 ? 2 * pp - 1 - stage : chunk * pp + stage;
  }
  std::int64_t stage_of_virtual_stage(std::int64_t virtual_stage) const {
    return (v_shape() || bidirectional()) && virtual_stage >= pp ? 2 * pp - 1 - virtual_stage : virtual_stage % pp;
  }
  // The virtual stages one micro-batch passes through: pp x virtual_stages, or pp in either direction of DualPipe.
  std::int64_t route_length() const { return bidirectional() ? pp : pp * virtual_stages; }
  // Whether a micro-batch's route starts (the embedding) or ends (the final layer norm, LM head and loss) there.
  bool starts_route(std::int64_t virtual_stage) const { return virtual_stage % route_length() == 0; }
  bool ends_route(std::int64_t virtual_stage) const { return virtual_stage % route_length() == route_length() - 1; }
  // The stage with the final layer norm, the LM head and the loss: pp - 1, or 0 in a V (and the up pipeline's in
  // DualPipe, whose down one's is pp - 1: holds_head).
  std::int64_t head_stage() const { return stage_of_virtual_stage(pp * virtual_stages - 1); }
  bool holds_embedding(std::int64_t stage) const { return stage == 0 || (bidirectional() && stage == pp - 1); }
  bool holds_head(std::int64_t stage) const { return stage == head_stage() || (bidirectional() && stage == pp - 1); }
  // The embedding and the LM head on different stages: a tied embedding needs its copy on the head's stage. Not in
  // DualPipe: each end stage's one copy is one direction's embedding and the other's head.
  bool ends_apart() const { return head_stage() != 0; }
  // DualPipe's mirror of `stage`, whose chunk 0 holds the parameters of this stage's chunk 1 and the reverse: their
  // gradients are summed before the optimizer (Group::MirrorStages).
  std::int64_t mirror_stage(std::int64_t stage) const { return pp - 1 - stage; }
  // The first micro-batch a stage's chunk runs: 0, or in DualPipe's up direction (chunk 1) m / 2.
  std::int64_t first_micro_batch(std::int64_t chunk) const {
    return bidirectional() && chunk == 1 ? micro_batches() / 2 : 0;
  }
  std::int64_t world_size() const { return tp * cp * pp * dp; }
};

struct ClusterSpec {
  std::int64_t nodes = 1;
  NodeKind node = NodeKind::DgxA100;
  std::int64_t gpus_per_node = 8;
  // This cluster's own GPU measurements (bench/gpu: twin_gemm_peak prints them), in place of the cited values of
  // sim/cost_model.cpp (which describe the software the published runs used); 0: not measured, use the cited value.
  double gemm_tflops = 0;                                    // a large 16-bit GEMM's achieved rate ...
  std::array<std::int64_t, 3> gemm_shape{8192, 8192, 8192};  // ... at this m, n, k
  double hbm_gb_per_s = 0;                                   // a streaming kernel's reads + writes per second
  double attention_gemm_hbm_fraction = 0;  // of that rate, what the attention core's batched GEMMs move (0 < f <= 1)
  // This cluster's own inter-node network, in place of the DGX node's (8 NICs of 200 Gb/s on DGX A100, 8 of 400 on
  // DGX H100/H200); 0: the node's. Cloud nodes differ here most (e.g. 4 x 100 Gb/s).
  std::int64_t nics_per_node = 0;  // compute NICs per node, shared by the GPUs when fewer than they
  double nic_gbps = 0;             // line rate of one NIC, Gb/s per direction
  // The host thread's time to issue one kernel (Python, the framework, PyTorch's dispatcher, the launch call), in
  // microseconds: the GPU cannot run ahead of it, which paces small kernels. 0: the host is never behind; unset: the
  // node's host, as measured (topology/host_launch.hpp).
  std::optional<double> host_us_per_kernel;
  // A hardware profile measured on this cluster (`twin calibrate` writes one): a GPU's GEMM, HBM, attention and
  // collective rates, or a cpu-host's rates, in place of the cited ones. A path (relative ones from the scenario
  // file's folder); empty: none.
  std::string gpu_profile;
  Fabric fabric = Fabric::NodeDefault;  // the network between nodes
  bool rail_optimized = false;          // NIC i of every node of a scalable unit under the same leaf (rail) switch
  // Reliability, what `twin goodput` reads (model/program/goodput.hpp): interruptions per GPU-hour of the job, by the
  // component that caused them; unset: the cited default (Llama 3's fleet, model/program/goodput.cpp). 0: never.
  std::optional<double> gpu_failures_per_gpu_hour;
  std::optional<double> host_failures_per_gpu_hour;
  std::optional<double> nic_failures_per_gpu_hour;
  std::optional<double> switch_failures_per_gpu_hour;
  std::optional<double> software_failures_per_gpu_hour;
  // The checkpoint storage's aggregate write (and read) rate for this job, GB/s; unset: the cited default.
  std::optional<double> storage_gb_per_s;
  // Seconds from an interruption to training again (detection, re-queue, process start, communicator set-up), the
  // checkpoint's load excluded; unset: the default.
  std::optional<double> restart_s;
  // The price of one GPU-hour in US dollars, for the cost of a --train-tokens run (twin sim, sweep, search);
  // --usd-per-gpu-hour overrides it; 0: not given.
  double usd_per_gpu_hour = 0;

  std::int64_t total_gpus() const { return nodes * gpus_per_node; }
};

// The reliability keys of [cluster] (the optional ones above), by key name: what the reader, to_toml and the rules
// walk over.
std::array<std::pair<const char*, std::optional<double>*>, 7> failure_model_fields(ClusterSpec& cluster);
std::array<std::pair<const char*, const std::optional<double>*>, 7> failure_model_fields(const ClusterSpec& cluster);

// The framework's habits that change what work is done (kernels, masks, accumulation, communication overlap).
// Defaults are Megatron-LM as of 2021 (Narayanan et al., SC'21); docs/accuracy.md describes each effect.
struct FrameworkSpec {
  Framework name = Framework::Megatron;
  bool tied_embeddings = true;        // GPT-2 style: the LM head reuses the word embedding
  bool dropout = true;                // hidden and attention dropout (Megatron's default p = 0.1): dropout kernels
                                      // run and write their masks; false: p = 0, no dropout kernels
  bool fused_kernels = true;          // Megatron's fused bias+GeLU, bias+dropout+add and scale+mask+softmax kernels;
                                      // false: one kernel (one memory pass) per elementwise operation
  bool tp_comm_overlap = false;       // backward TP communication overlapped with the independent GEMM (Megatron's
                                      // --async-tensor-model-parallel-allreduce and its sequence-parallel twin, 2022)
                                      // (a scenario that leaves it unset gets parallel.sequence_parallel)
  bool gradient_accumulation_fusion = false;  // weight-gradient GEMMs accumulate into the fp32 main gradient
                                              // (Megatron's --gradient-accumulation-fusion, 2022); false: a
                                              // separate accumulation kernel per weight and micro-batch (a
                                              // scenario that leaves it unset gets parallel.sequence_parallel)
  bool pipeline_gather_copies = true;  // the receiver's all-gather of a pipeline tensor scattered across TP copies it
                                       // out of NCCL's flat buffer (PyTorch's list all_gather: Megatron-LM until
                                       // February 2022); false: _all_gather_base, no copy (Megatron-LM after)
  AttentionKind attention = AttentionKind::Unfused;  // the attention core's implementation
  bool bf16_optimizer = false;  // DeepSpeed's BF16_Optimizer (v0.6.2 on, the only bf16 path of its pipeline engine):
                                // gradients accumulate into an fp32 copy every micro-batch, cross stages partitioned
                                // across TP, and the optimizer shards its fp32 state across DP; false: the engine of
                                // v0.5 (2021, fp16 only), gradients accumulating in the 16-bit .grad
  // The DeepSpeed release whose pipeline engine ran (framework.deepspeed_version = "0.9.5"; {0, 0, 0}: not given,
  // the engine of v0.5, or of v0.6.2 with bf16_optimizer). What twin times differently by release, read in
  // deepspeed/runtime/pipe/engine.py and schedule.py at their tags: from 0.5.4 (October 2021) the gradients crossing
  // stages are partitioned across TP like the activations; from 0.8.3 (March 2023) a TrainSchedule step moves the
  // gradient before the activation. See deepspeed_release().
  std::array<int, 3> deepspeed_version{0, 0, 0};
  // DeepSpeed activation checkpointing's partition_activations (runtime/activation_checkpointing/checkpointing.py):
  // each checkpointed transformer layer keeps 1/t of its input, all-gathered across TP before its recompute;
  // false: the whole input (with framework.name = "deepspeed", parallel.recompute = "full", tp > 1).
  bool partition_activations = false;
  // How context parallelism exchanges keys and values (Megatron-Core's --cp-comm-type): p2p ring, all_gather, a2a.
  CpComm cp_comm = CpComm::P2P;
  // FP8 scaling (Megatron-Core's --fp8-recipe, its default delayed), with model.fp8.
  Fp8Recipe fp8_recipe = Fp8Recipe::Delayed;
  // Megatron-Core's --overlap-moe-expert-parallel-comm (Megatron-Bridge's moe_a2a_overlap): each 1F1B step runs one
  // micro-batch's forward and another's backward layer by layer, the MoE dispatch and combine all-to-alls of each on
  // a communication stream under the other's compute (model/program/moe_a2a_overlap.hpp).
  bool moe_a2a_overlap = false;
  // Megatron-Core's MoE token dispatcher: the all-to-all one, or the flex one (DeepEP / HybridEP), which deduplicates
  // a token's rows per destination rank and node (MoeDispatcher above). With model.experts and parallel.ep > 1.
  MoeDispatcher moe_dispatcher = MoeDispatcher::AllToAll;
  // Megatron-Core's --async-save: training waits only for each GPU's state to reach host memory, the write to storage
  // runs behind the next steps; false: training waits for the write (model/program/goodput.hpp).
  bool async_checkpoint = false;
  // Megatron's main-gradient buffer and its data-parallel reduction in fp32 (Megatron-LM's
  // --accumulate-allreduce-grads-in-fp32, which megatron/training/arguments.py sets with --bf16); false: in bf16,
  // Megatron-Core's own default (DistributedDataParallelConfig.grad_reduce_in_fp32 = False) and NeMo's
  // optim.grad_sync_dtype = bf16. Megatron with bf16 only.
  bool grad_reduce_in_fp32 = true;
  // Megatron-Core's --fp8-param-gather (Transformer Engine's fp8_model_init): the GEMM weights are FP8 tensors, kept
  // as their FP8 bytes and TE's FP8 transpose, with no 16-bit copy, and the distributed optimizer all-gathers them in
  // FP8; false: 16-bit weights beside TE's FP8 copies of them. With model.fp8 and the distributed optimizer.
  bool fp8_param_gather = false;
  // Megatron-Core's --enable-cuda-graph / --external-cuda-graph: each transformer layer's forward and backward
  // captured once and replayed as one CUDA graph, so that the host issues one graph launch where it issued the
  // layer's kernels and its tensor- and context-parallel collectives. Dropless MoE routing leaves the token dispatch,
  // the experts and the combine outside the graph (their sizes are data: model/ops/host_issue.hpp).
  bool cuda_graphs = false;
  // Megatron-Core's --transformer-impl transformer_engine: the layers' linear layers are Transformer Engine modules
  // (TELayerNormColumnParallelLinear, TERowParallelLinear, TEGroupedLinear), whose host cost per call was measured
  // (sim/te_host.hpp); false: --transformer-impl local, each kernel issued from PyTorch's eager path. Only the host's
  // time changes (the kernels are the same). Default: on with model.fp8 under Megatron (FP8 runs only through TE).
  bool transformer_engine = false;
};

// The DeepSpeed release twin models: framework.deepspeed_version when given, else 0.6.2 under bf16_optimizer (its
// first release) and 0.5.0 otherwise (the engine of 2021, contemporary with MT-NLG).
std::array<int, 3> deepspeed_release(const FrameworkSpec& framework);
bool deepspeed_at_least(const FrameworkSpec& framework, int major, int minor, int patch);
// Whether DeepSpeed's pipeline engine sends gradients between stages partitioned across TP (is_grad_partitioned =
// is_model_parallel, v0.5.4 on); through v0.5.3 they cross whole.
bool deepspeed_partitions_gradients(const FrameworkSpec& framework);
// Whether a TrainSchedule step moves the gradient before the activation (v0.8.3 on, DeepSpeed #2862); before, the
// activation first.
bool deepspeed_gradient_first_in_step(const FrameworkSpec& framework);
std::string version_text(const std::array<int, 3>& version);  // "0.9.5"

// Hyper-parameters of real training (the executor); the simulator ignores them.
struct TrainingSpec {
  std::uint64_t seed = 1234;
  double learning_rate = 1e-3;
  double min_learning_rate = 0.0;     // cosine decay floor; equal to learning_rate for a constant rate
  std::int64_t warmup_steps = 0;
  std::int64_t decay_steps = 0;       // 0: no decay
  double weight_decay = 0.1;
  double grad_clip = 1.0;             // global L2 norm; 0 disables clipping
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.95;
  double adam_eps = 1e-8;
  double init_std = 0.02;
};

struct Scenario {
  std::string source = "<memory>";   // file it was loaded from, for messages
  ModelSpec model;
  ParallelSpec parallel;
  ClusterSpec cluster;
  FrameworkSpec framework;
  TrainingSpec training;

  std::int64_t ffn_hidden() const { return model.ffn_hidden > 0 ? model.ffn_hidden : 4 * model.hidden; }
  // Width of the MLP's up-projection output: ffn_hidden, twice that for SwiGLU's gate and up halves.
  std::int64_t mlp_up_width() const { return (model.activation == Activation::Swiglu ? 2 : 1) * ffn_hidden(); }
  // One expert's MLP width: model.moe_ffn_hidden, else ffn_hidden() (Megatron-Core's default).
  std::int64_t moe_ffn_hidden() const { return model.moe_ffn_hidden > 0 ? model.moe_ffn_hidden : ffn_hidden(); }
  // Whether transformer layer `layer` (0-based) has a Mixture-of-Experts MLP: every layer past model.dense_layers.
  bool is_moe_layer(std::int64_t layer) const { return model.is_moe() && layer >= model.dense_layers; }
  // ZeRO-3 with more than one DP rank: each rank holds only its shard of the parameters outside their gathers.
  bool shards_parameters() const { return parallel.zero_stage == 3 && parallel.dp > 1; }
  // Vocabulary padded as Megatron does: up to a multiple of vocab_pad_multiple * tp.
  std::int64_t padded_vocab() const;
  std::int64_t layers_per_chunk() const { return model.layers / parallel.route_length(); }
  // The transformer layers of virtual stage `virtual_stage` (ParallelSpec::virtual_stage places it), and the
  // first of them: layers_per_chunk() each, or parallel.first_stage_layers / last_stage_layers at the ends.
  std::int64_t layers_in_virtual_stage(std::int64_t virtual_stage) const;
  std::int64_t first_layer_of_virtual_stage(std::int64_t virtual_stage) const;
  // The transformer layers pipeline stage `stage` holds, over its chunks.
  std::int64_t layers_on_stage(std::int64_t stage) const;
  // How transformer layer `layer` (0-based, over the whole model) is recomputed: parallel.recompute, except that
  // parallel.recompute_num_layers > 0 leaves every layer past the first N of its chunk unrecomputed (None).
  Recompute recompute_of_layer(std::int64_t layer) const;
  // Of pipeline stage `stage`'s transformer layers, how many are recomputed under Recompute::Full.
  std::int64_t recomputed_layers_on_stage(std::int64_t stage) const;
};

// framework.transformer_engine when the scenario leaves it unset: Megatron-Core with model.fp8 (FP8 runs only through
// Transformer Engine's modules).
bool transformer_engine_by_default(const Scenario& s);

// A scenario the user wrote is wrong: every problem is listed, each naming its field and values.
class ScenarioError : public UserError {
 public:
  using UserError::UserError;
};

// One `--set section.key=value` override, applied on top of the file before validation.
struct Override {
  std::string key;    // "parallel.pp"
  std::string value;  // TOML value text ("35", "true", "\"1f1b\"") or a bare word taken as a string ("1f1b")
};
Override parse_override(std::string_view text);  // "parallel.pp=35"; throws ScenarioError when malformed

Scenario load_scenario(const std::filesystem::path& path, const std::vector<Override>& overrides = {});
Scenario parse_scenario(std::string_view toml_text, std::string_view source_name,
                        const std::vector<Override>& overrides = {});

// The scenario's precision as reports name it: "bf16" (the dtype), or with FP8 GEMMs "fp8 hybrid, delayed" (the
// format, then the recipe).
std::string precision_label(const Scenario& scenario);

// Every rule a valid scenario obeys (scenario_rules.cpp); empty when valid. load_/parse_scenario throw ScenarioError
// with these.
std::vector<std::string> validation_problems(const Scenario& scenario);

// The scenario as TOML, in the documented schema (round-trips through parse_scenario).
std::string to_toml(const Scenario& scenario);

}  // namespace twin::model
