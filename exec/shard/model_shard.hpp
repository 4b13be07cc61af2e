// The parameters one rank holds: its (pp, tp) shard of a GPT-2 model, exactly as Megatron-LM splits it.
//
//   word embedding wte (V, C)      vocab-parallel: rows [tp * V_local, (tp + 1) * V_local) of the padded vocabulary
//   position embedding wpe (T, C)  replicated across TP (first stage); none under ALiBi (model.position_embedding),
//                                  whose per-head slopes are constants, not parameters (alibi_slopes below)
//   per layer:  ln1, ln2 (C)                replicated (weight and bias; RMSNorm: the weight alone)
//               qkv (3C, C) + bias (3C)     column-parallel, whole heads: each of q, k, v keeps heads
//                                           [tp * H/t, (tp + 1) * H/t), so the local rows are (3, H/t, D); with
//                                           grouped-query attention the full rows are (H D | KV D | KV D) and the
//                                           local ones (H/t D | KV/t D | KV/t D)
//               proj (C, C)                 row-parallel: columns [tp * C/t, ...); its bias (C) replicated
//               fc (F, C) + bias (F)        column-parallel rows; SwiGLU: (2F, C) as [gate (F) | up (F)], each rank
//                                           keeping its rows of both halves, (2, F/t) locally
//               fc_proj (C, F)              row-parallel columns; its bias (C) replicated
//               no biases at all with model.linear_bias = false
//   MoE layers (model.experts > 0, after model.dense_layers): no fc / fc_proj; a router (E, C) and the shared experts,
//                                  replicated, and this EP rank's routed experts in a bucket of their own
//                                  (exec/shard/model_shard_moe.cpp)
//   final layernorm lnf (C)        replicated (last stage)
//   LM head                        the tied wte (pp = 1), or the last stage's copy of it (pp > 1; Megatron keeps one
//                                  on each end and all-reduces their gradients), or its own weight (untied)
//
// Initialisation does not depend on the plan: element (r, c) of a full tensor named N is
// std * normal(seed, fnv1a(N), r * cols + c) (exec/core/rng.hpp), so each shard draws exactly its own elements. Padded
// vocabulary rows are zero (their logits are masked and never get a gradient). Biases 0, layernorm weights 1,
// matrices and embeddings N(0, init_std), the residual projections (proj, fc_proj) N(0, init_std / sqrt(2 layers))
// as GPT-2.
//
// Storage: parameters live in buckets, one flat buffer per bucket (a layer; the embedding; the head), so that a DP
// reduction or a ZeRO shard is one contiguous range. Each bucket starts with the parameters that are replicated
// across TP but see only a sequence shard under sequence parallelism (layernorms, row-parallel biases): that prefix is
// what a LayerNormGrads all-reduce sums.
//
// ZeRO-3 (PyTorch FSDP's FULL_SHARD, parallel.zero_stage = 3 with dp > 1): a rank owns only its shard of each
// bucket's parameters. The Program all-gathers a bucket before the ops that read it and marks the op after which FSDP
// frees the gathered copy (after the layer's forward and after its backward); here "freed" means the other ranks'
// regions are filled with NaN (free_other_shards), from initialisation and checkpoint loading on, so that an op that no
// gather preceded cannot silently use stale weights (the interpreter also names such an op before it runs).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "exec/core/backend.hpp"
#include "model/plan/rank_shapes.hpp"
#include "model/program/program.hpp"

namespace twin::exec {

// Sizes of one rank's micro-batch and shard: model::RankShapes' widths (model/plan/rank_shapes.hpp) as the kernels
// take them, the rank's indices in the groups that split them, and the block's kind.
struct Dims {
  int batch = 0, seq = 0;  // sequences per micro-batch, tokens per sequence on this rank (seq_len / cp)
  int tokens = 0;          // batch * seq
  int cp = 1, cp_rank = 0;  // context parallelism: the rank holds two chunks of each sequence (model/context_parallel)
  int tokens_sp = 0;       // tokens a rank holds outside the TP region: tokens / tp with sequence parallelism
  int hidden = 0, heads_local = 0, head_dim = 0, ffn_local = 0;
  int kv_heads_local = 0;  // key/value heads on this rank (heads_local without grouped-query attention)
  int qkv_local = 0;       // the QKV projection's output width on this rank: (heads_local + 2 kv_heads_local) D
  int up_local = 0;        // the MLP-up output width on this rank: ffn_local, 2 ffn_local with SwiGLU
  bool rmsnorm = false, swiglu = false, rope = false, linear_bias = true;  // the block's kind (model/scenario/scenario.hpp)
  bool parallel_residual = false;        // attention and MLP side by side on the layer input
  bool shared_norm = false;              // ... both on LN1's output (no LN2)
  int rotary_dim = 0;                    // dimensions of a head rotary embeddings rotate (rope)
  int vocab = 0;                         // the real vocabulary (valid columns)
  int vocab_local = 0, vocab_start = 0;  // this rank's shard of the padded vocabulary
  int tp = 1, tp_rank = 0;
  bool sequence_parallel = false;
  int etp = 1, etp_rank = 0;  // expert tensor parallel: the ExpertTensor group's size, this rank's index (MoE only)

  Dims(const model::Scenario& scenario, const model::RankShapes& shapes, int tp_rank, int cp_rank = 0);
};

// Sizes of a rank's Mixture-of-Experts layers (all zero for a dense model): model::RankShapes' expert widths and the
// rank's place on the expert grid of model::rank_layout.
struct MoeDims {
  int experts = 0, top_k = 0;  // routed experts per MoE layer, experts per token
  int ep = 1, ep_rank = 0;     // the Expert group's size and this rank's index in it
  int local_experts = 0;       // experts / ep: this rank holds experts [ep_rank * local, (ep_rank + 1) * local)
  int expert_ffn = 0;          // one expert's width on this rank: model.moe_ffn_hidden / etp
  int expert_up = 0;           // its up projection's width: expert_ffn, 2 expert_ffn with SwiGLU ([gate | up])
  int etp = 1, etp_rank = 0;   // the ExpertTensor group's size and this rank's index in it
  int shared_ffn = 0;          // the shared experts' summed width (0: none)
  int shared_up = 0;           // their up projection's width
  int edp = 1, edp_rank = 0;   // the ExpertData group's size and this rank's index in it
  double aux_loss_coeff = 0;   // model.moe_aux_loss_coeff

  MoeDims(const model::Scenario& scenario, const model::RankShapes& shapes, model::RankCoord coord);
};

// Expert*: a routed expert's split over expert tensor parallelism (parallel.etp, Dims::etp): its fc's rows (SwiGLU:
// of both halves, as GateUpRows), its fc_proj's columns.
enum class Sharding : std::uint8_t {
  Replicated,
  Rows,
  Columns,
  QkvHeads,
  GateUpRows,
  VocabRows,
  ExpertRows,
  ExpertGateUpRows,
  ExpertColumns
};
enum class Init : std::uint8_t { Normal, ResidualNormal, Zeros, Ones };

struct ParamTensor {
  std::string name;                 // unique in the full model (its random stream), e.g. "layers.3.attn.qkv.weight"
  std::int64_t rows = 0, cols = 1;  // the full tensor; vectors have cols = 1
  Sharding sharding = Sharding::Replicated;
  Init init = Init::Zeros;
  bool decay = false;                 // AdamW weight decay: matrices and embeddings only
  bool tp_replicated = false;         // the same on every TP rank: counted in the gradient norm on tp rank 0 only
  bool copy = false;                  // a copy counted elsewhere (the tied word embedding on the last stage)
  std::size_t offset = 0, numel = 0;  // local shard, inside the bucket's flat buffers
  Tensor value, grad;                 // views of the bucket's buffers
};

// A parameter tensor of the full model, as this shard's tensor lists hold it.
ParamTensor param_tensor(std::string name, std::int64_t rows, std::int64_t cols, Sharding sharding, Init init,
                         bool decay, bool tp_replicated);

struct Bucket {
  std::string name;  // "layer 3", "embedding", "head": for messages and checkpoints
  int layer = -1;    // as the Program's Gradients / Parameters ops name it
  // An MoE layer's routed experts ("layer 3 experts"): reduced and ZeRO-sharded over the ExpertData group, where the
  // other buckets go over Data (their ops name the group).
  bool experts = false;
  model::ComputeKind what = model::ComputeKind::TransformerLayer;
  std::vector<ParamTensor> tensors;
  std::size_t numel = 0;              // sum of the tensors
  std::size_t padded_numel = 0;       // a multiple of dp under ZeRO-1 and ZeRO-3 (the tail is zero padding)
  std::size_t replicated_prefix = 0;  // elements summed across TP under sequence parallelism
  Tensor params, grads;               // (padded_numel)
  // Adam state (and the master copy) for [shard_offset, shard_offset + shard_numel): this rank's DP shard under
  // ZeRO-1 and ZeRO-3, the whole bucket otherwise.
  std::size_t shard_offset = 0, shard_numel = 0;
  Tensor master, adam_m, adam_v;
  // ZeRO-3: `params` is whole only between a Parameters all-gather and the next free; `other_shards_freed` says
  // whether the regions outside [shard_offset, shard_offset + shard_numel) are NaN now.
  bool parameters_sharded = false;
  bool other_shards_freed = false;
};

// Where element `local` of `tensor` (row-major in this rank's local shape) sits in the full tensor (row-major,
// tensor.rows x tensor.cols) on a rank with `dims`, or -1 for a padded vocabulary row: the map initialisation draws
// by, and the one re-sharding a checkpoint across plans goes through.
std::int64_t full_element_index(const ParamTensor& tensor, const Dims& dims, std::size_t local);

// Views of one layer's parameters (or of their gradients), shapes local to this rank.
struct LayerTensors {
  Tensor ln1_weight, ln1_bias;  // (C); the bias empty under RMSNorm
  Tensor proj_bias;             // (C); empty without linear biases, as every bias below
  Tensor ln2_weight, ln2_bias;  // (C)
  Tensor fc_proj_bias;          // (C)
  Tensor qkv_weight;            // (qkv_local, C): 3 C/t rows, (H/t + 2 KV/t) D with grouped-query attention
  Tensor qkv_bias;              // (qkv_local)
  Tensor proj_weight;           // (C, C/t)
  Tensor fc_weight;             // (up_local, C): F/t rows, 2 F/t with SwiGLU
  Tensor fc_bias;               // (up_local)
  Tensor fc_proj_weight;        // (C, F/t)
  // Mixture-of-Experts layers (empty in dense ones, which have the four MLP tensors above instead)
  Tensor router_weight;          // (E, C), replicated across TP
  Tensor shared_fc_weight;       // (shared_up, C): the shared experts as one MLP, replicated across TP
  Tensor shared_fc_proj_weight;  // (C, shared_ffn)
  Tensor expert_fc_weight;       // (local_experts, expert_up, C): the local experts' up projections, back to back
  Tensor expert_fc_proj_weight;  // (local_experts, C, expert_ffn)
};

class ModelShard {
 public:
  ModelShard(const model::Scenario& scenario, model::RankCoord coord, Backend& backend);

  // Draws every parameter from `seed` (plan-independent, see above) and zeroes the optimizer state; under ZeRO-3
  // the other ranks' shards are then freed.
  void initialize(std::uint64_t seed);
  void zero_grads();
  // ZeRO-3: FSDP's free of a gathered bucket: the regions of `bucket`'s parameters outside this rank's shard become
  // NaN. Nothing for a bucket whose parameters are not sharded.
  void free_other_shards(Bucket& bucket);
  void free_all_other_shards();

  const Dims& dims() const { return dims_; }
  std::vector<Bucket>& buckets() { return buckets_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  // The bucket a Gradients / Parameters / LayerNormGrads op names (layer >= 0: that layer; else Embedding or LmHead).
  Bucket& bucket(int layer, model::ComputeKind what, bool experts = false);
  const MoeDims& moe() const { return moe_; }
  bool is_moe_layer(int layer) const { return scenario_.is_moe_layer(layer); }

  bool has_layer(int layer) const;
  const LayerTensors& layer_params(int layer) const;
  const LayerTensors& layer_grads(int layer) const;

  bool first_stage() const { return first_stage_; }
  bool last_stage() const { return last_stage_; }
  // first stage: word embedding (V_local, C) and position embedding (T, C; empty under ALiBi)
  Tensor wte, wpe, wte_grad, wpe_grad;
  // ALiBi: the slopes of this rank's heads [tp_rank H/t, (tp_rank + 1) H/t) (H/t) fp32; empty without ALiBi
  Tensor alibi_slopes;
  // last stage: final layernorm (C) and the LM head weight (V_local, C) with its gradient
  Tensor lnf_weight, lnf_bias, lnf_weight_grad, lnf_bias_grad, head_weight, head_grad;  // lnf_bias empty: RMSNorm

 private:
  void add_bucket(Bucket bucket);
  void bind_views();
  // exec/shard/model_shard_moe.cpp: an MoE layer's router and shared experts (into its bucket, replicated across TP) and
  // its routed experts' own bucket; their views
  void add_moe_router(Bucket& layer_bucket, int layer) const;
  void add_expert_bucket(int layer);
  void bind_moe_views(const Bucket& bucket, LayerTensors& values, LayerTensors& grads) const;

  const model::Scenario& scenario_;
  model::RankCoord coord_;
  Backend& backend_;
  model::RankShapes shapes_;  // what dims_ and moe_ view
  Dims dims_;
  MoeDims moe_;
  bool first_stage_ = false, last_stage_ = false;
  std::vector<Bucket> buckets_;
  std::vector<int> layers_;                               // global indices of this rank's layers
  std::vector<LayerTensors> layer_params_, layer_grads_;  // parallel to layers_
};

}  // namespace twin::exec
