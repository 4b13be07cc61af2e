#include "exec/shard/model_shard.hpp"

#include <cmath>
#include <limits>
#include <stdexcept>

#include <fmt/core.h>

#include "exec/core/check.hpp"
#include "exec/core/rng.hpp"
#include "kernels/cpu/attention.hpp"

namespace twin::exec {

using model::ComputeKind;

Dims::Dims(const model::Scenario& s, const model::RankShapes& shapes, int rank_in_tp, int rank_in_cp) {
  const auto narrow = [](std::int64_t width) { return static_cast<int>(width); };
  tp = static_cast<int>(s.parallel.tp);
  tp_rank = rank_in_tp;
  cp = static_cast<int>(s.parallel.cp);
  cp_rank = rank_in_cp;
  batch = narrow(shapes.micro_batch);
  seq = narrow(shapes.seq_local);
  tokens = narrow(shapes.tokens);
  sequence_parallel = shapes.sequence_parallel;
  tokens_sp = narrow(shapes.tokens_sp);
  hidden = narrow(shapes.hidden);
  heads_local = narrow(shapes.heads_local);
  head_dim = narrow(shapes.head_dim);
  ffn_local = narrow(shapes.ffn_local);
  kv_heads_local = narrow(shapes.kv_heads_local);
  qkv_local = narrow(shapes.qkv_local);
  up_local = narrow(shapes.up_local);
  rmsnorm = s.model.norm == model::Norm::RmsNorm;
  swiglu = s.model.activation == model::Activation::Swiglu;
  rope = s.model.position_embedding == model::PositionEmbedding::Rope;
  linear_bias = s.model.linear_bias;
  parallel_residual = s.model.parallel_residual;
  shared_norm = s.model.shared_norm;
  rotary_dim = narrow(shapes.rotary_dim);
  vocab = narrow(shapes.vocab);
  vocab_local = narrow(shapes.vocab_local);
  vocab_start = narrow(shapes.vocab_start(tp_rank));
}

namespace {

// Local shape of a tensor on TP rank `tp_rank`, and where its local (row, col) sits in the full tensor.
struct ShardMap {
  const ParamTensor& t;
  const Dims& d;
  std::int64_t local_rows() const {
    switch (t.sharding) {
      case Sharding::Replicated:
      case Sharding::Columns:
        return t.rows;
      case Sharding::Rows:
      case Sharding::GateUpRows:
        return t.rows / d.tp;
      case Sharding::ExpertRows:
      case Sharding::ExpertGateUpRows:
        return t.rows / d.etp;
      case Sharding::ExpertColumns:
        return t.rows;
      case Sharding::QkvHeads:
        return d.qkv_local;
      case Sharding::VocabRows:
        return d.vocab_local;
    }
    return 0;
  }
  std::int64_t local_cols() const {
    if (t.sharding == Sharding::ExpertColumns) return t.cols / d.etp;
    return t.sharding == Sharding::Columns ? t.cols / d.tp : t.cols;
  }
  // full row of a local row; -1 for a padded vocabulary row (outside the real vocabulary)
  std::int64_t full_row(std::int64_t r) const {
    switch (t.sharding) {
      case Sharding::Replicated:
      case Sharding::Columns:
      case Sharding::ExpertColumns:
        return r;
      case Sharding::Rows:
        return d.tp_rank * local_rows() + r;
      case Sharding::ExpertRows:
        return d.etp_rank * local_rows() + r;
      case Sharding::ExpertGateUpRows: {  // (2, F/etp) -> (2, F), as GateUpRows over etp
        const std::int64_t half_local = t.rows / 2 / d.etp;
        return r / half_local * half_local * d.etp + d.etp_rank * half_local + r % half_local;
      }
      case Sharding::QkvHeads: {
        // local rows (H/t D | KV/t D | KV/t D) -> full rows (H D | KV D | KV D): (3, H/t, D) -> (3, H, D) without
        // grouped-query attention
        const std::int64_t q_local = static_cast<std::int64_t>(d.heads_local) * d.head_dim;
        const std::int64_t kv_local = static_cast<std::int64_t>(d.kv_heads_local) * d.head_dim;
        if (r < q_local) return d.tp_rank * q_local + r;
        const std::int64_t which = (r - q_local) / kv_local, within = (r - q_local) % kv_local;  // 0: k, 1: v
        return q_local * d.tp + which * kv_local * d.tp + d.tp_rank * kv_local + within;
      }
      case Sharding::GateUpRows: {
        // local rows (2, F/t) -> full rows (2, F): this rank's rows of the gate half, then of the up half
        const std::int64_t half_local = t.rows / 2 / d.tp;
        const std::int64_t which = r / half_local, within = r % half_local;
        return which * half_local * d.tp + d.tp_rank * half_local + within;
      }
      case Sharding::VocabRows: {
        const std::int64_t row = static_cast<std::int64_t>(d.vocab_start) + r;
        return row < t.rows ? row : -1;
      }
    }
    return -1;
  }
  std::int64_t full_col(std::int64_t c) const {
    if (t.sharding == Sharding::ExpertColumns) return d.etp_rank * local_cols() + c;
    return t.sharding == Sharding::Columns ? d.tp_rank * local_cols() + c : c;
  }
};

}  // namespace

std::int64_t full_element_index(const ParamTensor& tensor, const Dims& dims, std::size_t local) {
  const ShardMap map{tensor, dims};
  const auto cols = map.local_cols();
  const std::int64_t row = map.full_row(static_cast<std::int64_t>(local) / cols);
  return row < 0 ? -1 : row * tensor.cols + map.full_col(static_cast<std::int64_t>(local) % cols);
}

ParamTensor param_tensor(std::string name, std::int64_t rows, std::int64_t cols, Sharding sharding, Init init,
                         bool decay, bool tp_replicated) {
  ParamTensor t;
  t.name = std::move(name);
  t.rows = rows;
  t.cols = cols;
  t.sharding = sharding;
  t.init = init;
  t.decay = decay;
  t.tp_replicated = tp_replicated;
  return t;
}

ModelShard::ModelShard(const model::Scenario& scenario, model::RankCoord coord, Backend& backend)
    : scenario_(scenario),
      coord_(coord),
      backend_(backend),
      shapes_(model::rank_shapes(scenario)),
      dims_(scenario, shapes_, coord.tp, coord.cp),
      moe_(scenario, shapes_, coord) {
  dims_.etp = moe_.etp;
  dims_.etp_rank = moe_.etp_rank;
  const auto& p = scenario.parallel;
  const int chunks = static_cast<int>(p.virtual_stages);
  first_stage_ = p.holds_embedding(coord.pp);  // DualPipe: both end stages hold an embedding and a head
  last_stage_ = p.holds_head(coord.pp);
  const std::int64_t C = dims_.hidden, F = scenario.ffn_hidden(), V = scenario.model.vocab;
  const std::int64_t QKV = scenario.model.qkv_width(), UP = scenario.mlp_up_width();
  const Sharding up_rows = dims_.swiglu ? Sharding::GateUpRows : Sharding::Rows;
  const std::int64_t T = scenario.model.seq_len;
  const bool tied = scenario.framework.tied_embeddings;

  const auto tensor = param_tensor;

  // One bucket per layer, in the order of the rank's chunks.
  for (int chunk = 0; chunk < chunks; ++chunk) {
    const int vs = static_cast<int>(p.virtual_stage(coord.pp, chunk));
    const int first = static_cast<int>(scenario.first_layer_of_virtual_stage(vs));
    const int count = static_cast<int>(scenario.layers_in_virtual_stage(vs));
    for (int layer = first; layer < first + count; ++layer) {
      const std::string n = fmt::format("layers.{}.", layer);
      const bool moe = scenario.is_moe_layer(layer);  // no dense MLP: a router, shared and routed experts instead
      Bucket b;
      b.name = fmt::format("layer {}", layer);
      b.layer = layer;
      b.what = ComputeKind::TransformerLayer;
      // replicated across TP (summed across TP under sequence parallelism) first
      const bool norm_bias = !dims_.rmsnorm, bias = dims_.linear_bias;
      auto replicated = [&](std::string name, Init init) {
        b.tensors.push_back(tensor(n + name, C, 1, Sharding::Replicated, init, false, true));
        b.replicated_prefix += static_cast<std::size_t>(C);
      };
      replicated("ln1.weight", Init::Ones);
      if (norm_bias) replicated("ln1.bias", Init::Zeros);
      if (bias) replicated("attn.proj.bias", Init::Zeros);
      if (!dims_.shared_norm) replicated("ln2.weight", Init::Ones);
      if (norm_bias && !dims_.shared_norm) replicated("ln2.bias", Init::Zeros);
      if (bias && !moe) replicated("mlp.fc_proj.bias", Init::Zeros);
      if (moe) add_moe_router(b, layer);
      b.tensors.push_back(tensor(n + "attn.qkv.weight", QKV, C, Sharding::QkvHeads, Init::Normal, true, false));
      if (bias) b.tensors.push_back(tensor(n + "attn.qkv.bias", QKV, 1, Sharding::QkvHeads, Init::Zeros, false, false));
      b.tensors.push_back(tensor(n + "attn.proj.weight", C, C, Sharding::Columns, Init::ResidualNormal, true, false));
      if (!moe) {
        b.tensors.push_back(tensor(n + "mlp.fc.weight", UP, C, up_rows, Init::Normal, true, false));
        if (bias) b.tensors.push_back(tensor(n + "mlp.fc.bias", UP, 1, up_rows, Init::Zeros, false, false));
        b.tensors.push_back(
            tensor(n + "mlp.fc_proj.weight", C, F, Sharding::Columns, Init::ResidualNormal, true, false));
      }
      add_bucket(std::move(b));
      if (moe) add_expert_bucket(layer);
      layers_.push_back(layer);
    }
  }
  if (first_stage_) {
    Bucket b;
    b.name = "embedding";
    b.what = ComputeKind::Embedding;
    if (scenario.model.position_embedding == model::PositionEmbedding::Learned) {
      b.tensors.push_back(tensor("wpe", T, C, Sharding::Replicated, Init::Normal, true, true));
    }
    b.tensors.push_back(tensor("wte", V, C, Sharding::VocabRows, Init::Normal, true, false));
    add_bucket(std::move(b));
  }
  if (last_stage_) {
    Bucket b;
    b.name = "head";
    b.what = ComputeKind::LmHead;
    b.tensors.push_back(tensor("lnf.weight", C, 1, Sharding::Replicated, Init::Ones, false, true));
    if (!dims_.rmsnorm) b.tensors.push_back(tensor("lnf.bias", C, 1, Sharding::Replicated, Init::Zeros, false, true));
    b.replicated_prefix = static_cast<std::size_t>((dims_.rmsnorm ? 1 : 2) * C);
    if (!tied) {
      b.tensors.push_back(tensor("lm_head.weight", V, C, Sharding::VocabRows, Init::Normal, true, false));
    } else if (p.ends_apart()) {
      // Megatron's copy of the word embedding on the last stage: same values (same name, same draws), gradients
      // all-reduced with the first stage's (EmbeddingGrads); counted once, on the first stage, in the norm.
      ParamTensor copy = tensor("wte", V, C, Sharding::VocabRows, Init::Normal, true, false);
      copy.copy = true;
      b.tensors.push_back(copy);
    }
    add_bucket(std::move(b));
  }
  bind_views();
  if (scenario.model.position_embedding == model::PositionEmbedding::Alibi) {
    const std::vector<float> slopes = kernels::cpu::alibi_slopes(static_cast<int>(scenario.model.heads));
    alibi_slopes = backend_.allocate(static_cast<std::size_t>(dims_.heads_local), DType::F32);
    backend_.upload_f32(alibi_slopes, slopes.data() + static_cast<std::size_t>(dims_.tp_rank) * dims_.heads_local);
  }
}

void ModelShard::add_bucket(Bucket b) {
  const auto& p = scenario_.parallel;
  for (ParamTensor& t : b.tensors) {
    const ShardMap map{t, dims_};
    t.offset = b.numel;
    t.numel = static_cast<std::size_t>(map.local_rows() * map.local_cols());
    b.numel += t.numel;
  }
  // ZeRO-1 and ZeRO-3 shard the optimizer state alike, over the ranks the gradients reduce over: dp, or dp x cp under
  // context parallelism (the DataWithContext group, where this rank's index is cp + CP x dp, model/plan/ranks.cpp); an MoE
  // layer's routed experts over ExpertData
  const auto dp = static_cast<std::size_t>(b.experts ? moe_.edp : p.dp * p.cp);
  const auto dp_rank = static_cast<std::size_t>(b.experts ? moe_.edp_rank : coord_.cp + p.cp * coord_.dp);
  const bool zero = p.zero_stage >= 1 && dp > 1;
  b.padded_numel = zero ? (b.numel + dp - 1) / dp * dp : b.numel;
  b.shard_offset = zero ? b.padded_numel / dp * dp_rank : 0;
  b.shard_numel = zero ? b.padded_numel / dp : b.numel;
  b.parameters_sharded = scenario_.shards_parameters();
  b.params = backend_.zeros(b.padded_numel, backend_.activation_dtype());
  b.grads = backend_.zeros(b.padded_numel, DType::F32);
  b.adam_m = backend_.zeros(b.shard_numel, DType::F32);
  b.adam_v = backend_.zeros(b.shard_numel, DType::F32);
  if (backend_.keeps_master_weights()) b.master = backend_.zeros(b.shard_numel, DType::F32);
  for (ParamTensor& t : b.tensors) {
    t.value = b.params.slice(t.offset, t.numel);
    t.grad = b.grads.slice(t.offset, t.numel);
  }
  buckets_.push_back(std::move(b));
}

void ModelShard::bind_views() {
  auto find_optional = [](Bucket& b, std::string_view suffix) -> ParamTensor* {
    for (ParamTensor& t : b.tensors) {
      if (t.name.size() >= suffix.size() && t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) == 0)
        return &t;
    }
    return nullptr;
  };
  auto find = [&](Bucket& b, std::string_view suffix) -> ParamTensor& {
    if (ParamTensor* t = find_optional(b, suffix)) return *t;
    throw InternalError(fmt::format("bucket {} has no tensor {}", b.name, suffix));
  };
  // the biases a block may not have (RMSNorm's, or every linear bias): empty views
  const bool norm_bias = !dims_.rmsnorm, bias = dims_.linear_bias;
  for (Bucket& b : buckets_) {
    if (b.experts) {
      bind_moe_views(b, layer_params_.back(), layer_grads_.back());  // right after its layer's bucket
    } else if (b.what == ComputeKind::TransformerLayer) {
      const bool dense_mlp = !scenario_.is_moe_layer(b.layer);
      LayerTensors values, grads;
      auto bind = [&](Tensor LayerTensors::*field, std::string_view suffix, bool present = true) {
        if (!present) return;
        ParamTensor& t = find(b, suffix);
        values.*field = t.value;
        grads.*field = t.grad;
      };
      bind(&LayerTensors::ln1_weight, "ln1.weight");
      bind(&LayerTensors::ln1_bias, "ln1.bias", norm_bias);
      bind(&LayerTensors::proj_bias, "attn.proj.bias", bias);
      bind(&LayerTensors::ln2_weight, "ln2.weight", !dims_.shared_norm);
      bind(&LayerTensors::ln2_bias, "ln2.bias", norm_bias && !dims_.shared_norm);
      bind(&LayerTensors::fc_proj_bias, "mlp.fc_proj.bias", bias && dense_mlp);
      bind(&LayerTensors::qkv_weight, "attn.qkv.weight");
      bind(&LayerTensors::qkv_bias, "attn.qkv.bias", bias);
      bind(&LayerTensors::proj_weight, "attn.proj.weight");
      bind(&LayerTensors::fc_weight, "mlp.fc.weight", dense_mlp);
      bind(&LayerTensors::fc_bias, "mlp.fc.bias", bias && dense_mlp);
      bind(&LayerTensors::fc_proj_weight, "mlp.fc_proj.weight", dense_mlp);
      if (!dense_mlp) bind_moe_views(b, values, grads);
      layer_params_.push_back(values);
      layer_grads_.push_back(grads);
    } else if (b.what == ComputeKind::Embedding) {
      if (scenario_.model.position_embedding == model::PositionEmbedding::Learned) {
        wpe = find(b, "wpe").value;
        wpe_grad = find(b, "wpe").grad;
      }
      wte = find(b, "wte").value;
      wte_grad = find(b, "wte").grad;
    } else {
      lnf_weight = find(b, "lnf.weight").value;
      lnf_weight_grad = find(b, "lnf.weight").grad;
      if (norm_bias) {
        lnf_bias = find(b, "lnf.bias").value;
        lnf_bias_grad = find(b, "lnf.bias").grad;
      }
    }
  }
  if (last_stage_) {
    Bucket& head = bucket(-1, ComputeKind::LmHead);
    if (head.tensors.size() > (dims_.rmsnorm ? 1u : 2u)) {
      head_weight = head.tensors.back().value;
      head_grad = head.tensors.back().grad;
    } else {  // tied, one stage: the head is the word embedding itself
      head_weight = wte;
      head_grad = wte_grad;
    }
  }
}

void ModelShard::initialize(std::uint64_t seed) {
  const double std_dev = scenario_.training.init_std;
  const double residual_std = std_dev / std::sqrt(2.0 * static_cast<double>(scenario_.model.layers));
  for (Bucket& b : buckets_) {
    std::vector<float> host(b.padded_numel, 0.0f);
    for (const ParamTensor& t : b.tensors) {
      const ShardMap map{t, dims_};
      const std::uint64_t stream = fnv1a64(t.name);
      const std::int64_t rows = map.local_rows(), cols = map.local_cols();
      float* out = host.data() + t.offset;
      for (std::int64_t r = 0; r < rows; ++r) {
        const std::int64_t full_row = map.full_row(r);
        for (std::int64_t c = 0; c < cols; ++c) {
          float value = 0.0f;
          if (full_row >= 0) {
            const auto index = static_cast<std::uint64_t>(full_row * t.cols + map.full_col(c));
            switch (t.init) {
              case Init::Zeros:
                value = 0.0f;
                break;
              case Init::Ones:
                value = 1.0f;
                break;
              case Init::Normal:
                value = static_cast<float>(std_dev * random_normal(seed, stream, index));
                break;
              case Init::ResidualNormal:
                value = static_cast<float>(residual_std * random_normal(seed, stream, index));
                break;
            }
          }
          out[r * cols + c] = value;
        }
      }
    }
    backend_.upload_f32(b.params, host.data());
    if (!b.master.empty()) backend_.upload_f32(b.master, host.data() + b.shard_offset);
    backend_.fill(b.adam_m, 0.0f);
    backend_.fill(b.adam_v, 0.0f);
  }
  zero_grads();
  free_all_other_shards();  // ZeRO-3: every rank drew the whole bucket, it keeps its shard
}

void ModelShard::zero_grads() {
  for (Bucket& b : buckets_) backend_.fill(b.grads, 0.0f);
}

void ModelShard::free_other_shards(Bucket& b) {
  if (!b.parameters_sharded) return;
  const float freed = std::numeric_limits<float>::quiet_NaN();
  const std::size_t end = b.shard_offset + b.shard_numel;
  if (b.shard_offset > 0) backend_.fill(b.params.slice(0, b.shard_offset), freed);
  if (end < b.padded_numel) backend_.fill(b.params.slice(end, b.padded_numel - end), freed);
  b.other_shards_freed = true;
}

void ModelShard::free_all_other_shards() {
  for (Bucket& b : buckets_) free_other_shards(b);
}

Bucket& ModelShard::bucket(int layer, ComputeKind what, bool experts) {
  for (Bucket& b : buckets_) {
    if (b.experts == experts && (layer >= 0 ? b.layer == layer : (b.layer < 0 && b.what == what))) return b;
  }
  throw InternalError(fmt::format("rank (pp {}, tp {}, dp {}) holds no bucket for layer {} / {}", coord_.pp, coord_.tp,
                                  coord_.dp, layer, model::to_string(what)));
}

bool ModelShard::has_layer(int layer) const {
  for (int l : layers_) {
    if (l == layer) return true;
  }
  return false;
}

const LayerTensors& ModelShard::layer_params(int layer) const {
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    if (layers_[i] == layer) return layer_params_[i];
  }
  throw InternalError(fmt::format("layer {} is not on stage {}", layer, coord_.pp));
}

const LayerTensors& ModelShard::layer_grads(int layer) const {
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    if (layers_[i] == layer) return layer_grads_[i];
  }
  throw InternalError(fmt::format("layer {} is not on stage {}", layer, coord_.pp));
}

}  // namespace twin::exec
