#include "model/ops/moe_ops.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "model/ops/compute_ops.hpp"
#include "model/ops/moe_host_sync.hpp"
#include "model/plan/parameters.hpp"

namespace twin::model {

std::vector<double> expert_row_shares(const Scenario& s) {
  const auto experts = static_cast<std::size_t>(std::max<std::int64_t>(1, s.model.experts));
  std::vector<double> shares(experts);
  double sum = 0;
  for (std::size_t i = 0; i < experts; ++i)
    sum += shares[i] = std::pow(static_cast<double>(i + 1), -s.model.expert_load_skew);
  const double capacity = s.model.capacity_factor > 0 ? s.model.capacity_factor / static_cast<double>(experts) : 1;
  for (double& share : shares) share = s.model.pad_to_capacity ? capacity : std::min(share / sum, capacity);
  return shares;
}

std::vector<double> ep_rank_row_shares(const Scenario& s) {
  const std::vector<double> experts = expert_row_shares(s);
  const auto ep = static_cast<std::size_t>(s.parallel.ep);
  const std::size_t local = experts.size() / ep;
  std::vector<double> ranks(ep, 0.0);
  for (std::size_t i = 0; i < experts.size(); ++i) ranks[std::min(ep - 1, i / local)] += experts[i];
  return ranks;
}

double flex_reach(const Scenario& s, double share, double hottest_expert_share) {
  const double experts = static_cast<double>(s.model.experts), k = static_cast<double>(s.model.top_k);
  double none = 1;  // no choice on the set: k draws without replacement missing its share x E experts
  for (int q = 0; q < s.model.top_k; ++q) none *= std::max(0.0, 1 - share * experts / (experts - q));
  // A token picks an expert at most once: a set reaches at least the tokens of its hottest expert, k times its share,
  // and at most all of its rows' tokens.
  return std::clamp(1 - none, std::min(1.0, k * hottest_expert_share), std::min(1.0, k * share));
}

std::shared_ptr<const std::vector<double>> dispatch_peer_bytes(const Scenario& s, double rows_per_rank,
                                                               double row_bytes) {
  const std::vector<double> shares = ep_rank_row_shares(s);
  const std::size_t ep = shares.size();
  auto bytes = std::make_shared<std::vector<double>>(ep * ep, 0.0);
  if (s.framework.moe_dispatcher != MoeDispatcher::Flex) {
    for (std::size_t i = 0; i < ep; ++i) {
      for (std::size_t j = 0; j < ep; ++j) (*bytes)[i * ep + j] = rows_per_rank * shares[j] * row_bytes;
    }
    return bytes;
  }
  // The flex dispatcher: EP ranks consecutive on the nodes (Megatron-Core's expert grid, etp innermost, etp = 1), a
  // token once to each rank of its node that holds any of its experts, and once to each other node that does, spread
  // here over that node's EP ranks (what crosses the network; the forward over NVLink there is not costed).
  const std::size_t per_node = std::clamp<std::size_t>(static_cast<std::size_t>(s.cluster.gpus_per_node), 1, ep);
  const double tokens = rows_per_rank / static_cast<double>(s.model.top_k);
  const std::vector<double> experts = expert_row_shares(s);
  const std::size_t local = experts.size() / ep, nodes = (ep + per_node - 1) / per_node;
  std::vector<double> hottest(ep, 0.0), node_share(nodes, 0.0), node_hottest(nodes, 0.0), node_ranks(nodes, 0.0);
  for (std::size_t e = 0; e < experts.size(); ++e) {
    double& hot = hottest[std::min(ep - 1, e / local)];
    hot = std::max(hot, experts[e]);
  }
  for (std::size_t j = 0; j < ep; ++j) {
    node_share[j / per_node] += shares[j];
    node_hottest[j / per_node] = std::max(node_hottest[j / per_node], hottest[j]);
    node_ranks[j / per_node] += 1;
  }
  for (std::size_t i = 0; i < ep; ++i) {
    for (std::size_t j = 0; j < ep; ++j) {
      const std::size_t node = j / per_node;
      const double rows =
          node == i / per_node
              ? tokens * flex_reach(s, shares[j], hottest[j])
              : tokens * flex_reach(s, node_share[node], node_hottest[node]) / node_ranks[node];
      (*bytes)[i * ep + j] = rows * row_bytes;
    }
  }
  return bytes;
}

bool flex_dispatch_changes_nothing(const Scenario& s) {
  if (!s.model.is_moe() || s.framework.moe_dispatcher != MoeDispatcher::Flex) return false;
  if (s.parallel.ep == 1) return true;
  Scenario all_to_all = s;
  all_to_all.framework.moe_dispatcher = MoeDispatcher::AllToAll;
  const double rows = static_cast<double>(s.model.top_k);  // one token's rows: the bytes per row cancel
  const auto flex = dispatch_peer_bytes(s, rows, 1), plain = dispatch_peer_bytes(all_to_all, rows, 1);
  return std::equal(flex->begin(), flex->end(), plain->begin(),
                    [](double a, double b) { return std::abs(a - b) <= 1e-12 * std::max(1.0, b); });
}

namespace {

// The dense MLP's parameters over `tp` ranks (model/plan/parameters.cpp counts them in a layer).
double dense_mlp_parameters_per_rank(const Scenario& s, double tp) {
  const double h = static_cast<double>(s.model.hidden), f = static_cast<double>(s.ffn_hidden());
  const double up = static_cast<double>(s.mlp_up_width()), bias = s.model.linear_bias ? 1 : 0;
  return (h * up + bias * up + f * h) / tp + bias * h;
}

}  // namespace

double expert_parameters(const Scenario& s) {
  const double h = static_cast<double>(s.model.hidden), f = static_cast<double>(s.moe_ffn_hidden());
  const double up = (s.model.activation == Activation::Swiglu ? 2 : 1) * f, bias = s.model.linear_bias ? 1 : 0;
  return h * up + bias * up + f * h + bias * h;
}

double expert_parameters_per_gpu(const Scenario& s) {
  if (!s.model.is_moe()) return 0;
  return static_cast<double>(s.model.experts / s.parallel.ep) * expert_parameters(s) /
         static_cast<double>(s.parallel.etp);
}

double moe_layer_dense_parameters_per_gpu(const Scenario& s) {
  const double tp = static_cast<double>(s.parallel.tp), h = static_cast<double>(s.model.hidden);
  const double router = static_cast<double>(s.model.experts) * h;  // replicated over TP
  const double shared = static_cast<double>(s.model.shared_experts) * expert_parameters(s) / tp;
  return layer_parameters_per_gpu(s) - dense_mlp_parameters_per_rank(s, tp) + router + shared;
}

double layer_dense_parameters_per_gpu(const Scenario& s, std::int64_t layer) {
  return s.is_moe_layer(layer) ? moe_layer_dense_parameters_per_gpu(s) : layer_parameters_per_gpu(s);
}

MoeParameterCount count_moe_parameters(const Scenario& s) {
  const double total = count_parameters(s).total;
  if (!s.model.is_moe()) return {total, total};
  const double moe_layers = static_cast<double>(s.model.layers - s.model.dense_layers);
  const double h = static_cast<double>(s.model.hidden), one = expert_parameters(s);
  const double rest =
      total + moe_layers * (static_cast<double>(s.model.experts) * h - dense_mlp_parameters_per_rank(s, 1) +
                            static_cast<double>(s.model.shared_experts) * one);
  return {rest + moe_layers * static_cast<double>(s.model.experts) * one,
          rest + moe_layers * static_cast<double>(s.model.top_k) * one};
}

namespace {

// What one rank's experts compute on, per micro-batch: RankShapes' expert widths (Shapes::rank) and the rows the
// routing sends them.
struct ExpertShapes {
  double tokens = 0;    // T: the layer's tokens on this rank
  double rows_out = 0;  // T x top_k: the rows this rank routes
  double rows_sent = 0;  // the rows its permutation writes and its dispatch sends: rows_out, or padded, the capacity's
  double rows = 0;      // rows its experts compute on (the hottest EP rank's, times etp after the gather)
  double local_experts = 1;
  double width = 0;     // one expert's MLP width on this rank: moe_ffn_hidden / etp
  double up_width = 0;  // twice that with SwiGLU
  double etp = 1, ep = 1;
};

ExpertShapes expert_shapes(const Scenario& s, const Shapes& x) {
  ExpertShapes m;
  m.ep = static_cast<double>(s.parallel.ep);
  m.etp = static_cast<double>(s.parallel.etp);
  m.tokens = x.tokens_sp;
  m.rows_out = m.tokens * static_cast<double>(s.model.top_k);
  const std::vector<double> shares = ep_rank_row_shares(s);
  // Padded to capacity, the permutation writes and the dispatch sends each expert's whole capacity (num_out_tokens =
  // capacity x experts in the drop-and-pad preprocess): the shares sum to the capacity factor.
  m.rows_sent = m.rows_out * (s.model.pad_to_capacity ? std::accumulate(shares.begin(), shares.end(), 0.0) : 1.0);
  const double hottest = *std::max_element(shares.begin(), shares.end());
  m.rows = m.rows_out * m.ep * hottest * m.etp;  // every EP peer sends it this share; the ETP gather multiplies
  m.local_experts = d(x.rank.local_experts);
  m.width = d(x.rank.expert_ffn_local);
  m.up_width = d(x.rank.expert_up_local);
  return m;
}

// One GEMM per local expert over its rows, [rows / experts, k] x [k, n] each (expert_linear: the FLOPs of one
// [rows, k] x [k, n] GEMM, reading every expert's weight, and backward accumulating every expert's weight gradient;
// in FP8 each expert's casts with its own scales). Launched one per expert: Transformer Engine's GroupedLinear
// (Megatron-Core's TEGroupedMLP) runs general_grouped_gemm, whose multi_stream_cublas_gemm
// (transformer_engine/common/gemm/cublaslt_gemm.cu) loops over the num_gemms GEMMs, one cuBLASLt call each on its
// compute streams.
Op grouped_gemm(const Shapes& x, ComputeKind what, Phase phase, const ExpertShapes& m, double n, double k) {
  return expert_linear(x, what, phase, m.rows, n, k, std::max(1.0, m.local_experts));
}

Op expert_activation(const Shapes& x, Phase phase, double elements) {
  const bool backward = phase == Phase::Backward;
  if (x.swiglu) {
    return elementwise(ComputeKind::Swiglu, phase, (backward ? x.swiglu_backward() : x.swiglu_forward()) * elements,
                       x.swiglu_launches());
  }
  return elementwise(ComputeKind::Gelu, phase, (backward ? x.gelu_backward() : x.gelu_forward()) * elements,
                     x.gelu_launches(phase));
}

Op all_to_all(Phase phase, ComputeKind what, double bytes, std::shared_ptr<const std::vector<double>> peer_bytes) {
  Op op;
  op.kind = OpKind::Collective;
  op.collective = CollectiveKind::AllToAll;
  op.group = Group::Expert;
  op.payload = Payload::Tokens;
  op.what = what;
  op.phase = phase;
  op.bytes = bytes;
  op.peer_bytes = std::move(peer_bytes);
  return op;
}

// The routing probabilities' own all-to-all beside the rows' (Megatron-Core's MoEAlltoAllTokenDispatcher.token_dispatch
// at b0cc2706: `all_to_all(ep_group, permuted_probs, output_splits, input_splits)` after the rows', so that the experts
// weight their outputs; autograd sends their gradient back the same way): one probability a row, in the router's
// logits' dtype (the model's: no scenario here sets moe_router_dtype), over the rows' split sizes. The flex
// dispatcher moves them inside its dispatch (DeepEP's and HybridEP's dispatched_probs): none apart.
Op probs_all_to_all(const Shapes& x, Phase phase, double rows_bytes, const std::vector<double>& row_peer_bytes) {
  const double per_row = 1 / x.h;  // a row's bytes are h of the same dtype
  auto peers = std::make_shared<std::vector<double>>(row_peer_bytes);
  for (double& bytes : *peers) bytes *= per_row;
  Op op = all_to_all(phase, ComputeKind::ExpertUp, rows_bytes * per_row, std::move(peers));
  op.payload = Payload::ExpertProbs;
  return op;
}

// The transpose of an ep x ep matrix: what combine sends is what dispatch received.
std::shared_ptr<const std::vector<double>> transposed(const std::vector<double>& bytes) {
  const auto ep = static_cast<std::size_t>(std::lround(std::sqrt(static_cast<double>(bytes.size()))));
  auto out = std::make_shared<std::vector<double>>(bytes.size());
  for (std::size_t i = 0; i < ep; ++i) {
    for (std::size_t j = 0; j < ep; ++j) (*out)[j * ep + i] = bytes[i * ep + j];
  }
  return out;
}

Op expert_tensor_collective(CollectiveKind kind, ComputeKind what, Phase phase, double bytes) {
  Op op = tensor_collective(kind, Payload::Tokens, what, phase, bytes);
  op.group = Group::ExpertTensor;
  return op;
}

// The shared experts: one dense MLP of shared_experts x moe_ffn_hidden on the rank's tokens (its sequence shard:
// the FLOPs of Megatron-Core's TP-split shared expert summed over TP).
void shared_experts(std::vector<Op>& ops, const Scenario& s, const Shapes& x, Phase phase) {
  if (s.model.shared_experts <= 0) return;
  const double width = d(x.rank.shared_ffn), up = d(x.rank.shared_up);
  if (phase == Phase::Backward) {
    ops.push_back(linear(x, ComputeKind::MlpDown, phase, x.tokens_sp, x.h, width));
    ops.push_back(expert_activation(x, phase, x.tokens_sp * width));
    ops.push_back(linear(x, ComputeKind::MlpUp, phase, x.tokens_sp, up, x.h));
    return;
  }
  ops.push_back(linear(x, ComputeKind::MlpUp, phase, x.tokens_sp, up, x.h));
  ops.push_back(expert_activation(x, phase, x.tokens_sp * width));
  ops.push_back(linear(x, ComputeKind::MlpDown, phase, x.tokens_sp, x.h, width));
}

// The dispatcher's copies of every expert row around the expert GEMMs, as Megatron-Core runs them with permute fusion
// (Megatron-Bridge's recipes; token_dispatcher.py and experts.py at b0cc2706):
// - with more than one local expert, the rows each EP peer sent sorted into expert-major order after the dispatch
//   (dispatch_postprocess: sort_chunks_by_idxs, with their probabilities) and back before the combine
//   (combine_preprocess): Transformer Engine's _moe_chunk_sort, a map kernel and a copy of every row
//   (make_chunk_sort_map, sort_chunks_by_map; its backward one copy with the saved map: pytorch/permutation.py, v2.11);
// - with FP8 and dropless routing, each expert's rows padded to the FP8 GEMM's row alignment before the up-projection
//   (TEGroupedMLP.forward: quantization_padding of the rows and of their probabilities, TE's Fp8Padding,
//   fused_multi_row_padding: a copy of every row) and unpadded after the down-projection (Fp8Unpadding); their
//   backwards copy the gradients the other way (module/fp8_padding.py). Unless every count is already aligned, which
//   balanced routing of 2,048 rows an expert leaves to chance, the copies run. Padded to capacity (drop and pad),
//   the sort is a transpose of the [peers, local experts, capacity] rows (.transpose(0, 1).contiguous()), a copy of
//   every row as well; Fp8Padding returns its input when every count is aligned, as capacity x ep is in the drop-and-
//   pad runs twin models (a capacity factor with dropped, unpadded rows: their counts are data, no padding costed).
// The up-projection's op carries the passes on its input side (forward: sort, pad; backward: unpad, unsort), the
// down-projection's those on its output side (forward: unpad, unsort; backward: sort, pad), each as one streaming
// kernel of their launches and bytes (read and write of every row).
Op with_dispatcher_row_passes(const Scenario& s, const Shapes& x, const ExpertShapes& m, Op op, bool up) {
  const bool sort = m.local_experts > 1, pad = x.fp8 && s.model.capacity_factor <= 0;
  const bool backward = op.phase == Phase::Backward;
  const double rows = 2 * m.rows * x.h * x.e, probs = 2 * m.rows * x.e;
  int launches = 0;
  double bytes = 0;
  if (sort) {
    launches += backward ? 1 : 2;
    bytes += rows + (up ? probs : 0);
  }
  if (pad) {
    launches += up ? 2 : 1;  // the rows' and, on the up side, the probabilities'
    bytes += rows + (up ? probs : 0);
  }
  if (launches == 0) return op;
  auto breakdown = std::make_shared<KernelBreakdown>(*op.breakdown);
  breakdown->kernels.push_back(Kernel{KernelKind::Stream, launches, bytes, /*outside_module=*/true});
  op.breakdown = std::move(breakdown);
  op.bytes += bytes;
  return op;
}

}  // namespace

// Routing traffic (Megatron-Core's router and moe_utils.permute / unpermute), per pass: the top-k softmax reads the
// [T, E] logits and writes [T, k] probabilities and indices; permute reads each token once per choice and writes the
// [T k, h] rows; unpermute reads the rows and probabilities and writes [T, h]. Backward moves the same again.
std::vector<Op> moe_mlp_ops(const Scenario& s, const Shapes& x, Phase phase) {
  const ExpertShapes m = expert_shapes(s, x);
  const double experts = static_cast<double>(s.model.experts), k = static_cast<double>(s.model.top_k);
  const double row_bytes = x.h * x.e, dispatched = m.rows_sent * row_bytes;
  const double routing = m.tokens * experts * x.e + m.tokens * k * (x.e + 4);
  const double permute = routing + 2 * dispatched, unpermute = 2 * dispatched + m.tokens * (k * x.e + row_bytes);
  const bool exchange = m.ep > 1, split = m.etp > 1;
  const auto dispatch = exchange ? dispatch_peer_bytes(s, m.rows_out, row_bytes) : nullptr;
  // What one all-to-all moves from this rank: every row it sends, or the flex dispatcher's deduplicated ones.
  const bool flex = dispatch && s.framework.moe_dispatcher == MoeDispatcher::Flex;
  const auto ep = static_cast<std::ptrdiff_t>(m.ep);
  const double exchanged = flex ? std::accumulate(dispatch->begin(), dispatch->begin() + ep, 0.0) : dispatched;
  const double gathered = m.rows * row_bytes;  // the expert rows after the ETP gather
  std::vector<Op> ops;
  // The rows towards the experts (the dispatch, or in the backward its gradient's way back), and with the all-to-all
  // dispatcher their probabilities after them.
  const auto dispatch_rows = [&](std::shared_ptr<const std::vector<double>> peers) {
    ops.push_back(all_to_all(phase, ComputeKind::ExpertUp, exchanged, peers));
    if (!flex) ops.push_back(probs_all_to_all(x, phase, exchanged, *peers));
  };
  if (phase == Phase::Backward) {
    ops.push_back(elementwise(ComputeKind::ExpertUnpermute, phase, unpermute, 2));
    if (exchange) ops.push_back(all_to_all(phase, ComputeKind::ExpertDown, exchanged, dispatch));
    if (split)
      ops.push_back(expert_tensor_collective(CollectiveKind::AllGather, ComputeKind::ExpertDown, phase, gathered));
    ops.push_back(
        with_dispatcher_row_passes(s, x, m, grouped_gemm(x, ComputeKind::ExpertDown, phase, m, x.h, m.width), false));
    ops.push_back(expert_activation(x, phase, m.rows * m.width));
    ops.push_back(
        with_dispatcher_row_passes(s, x, m, grouped_gemm(x, ComputeKind::ExpertUp, phase, m, m.up_width, x.h), true));
    if (split) {
      ops.push_back(expert_tensor_collective(CollectiveKind::ReduceScatter, ComputeKind::ExpertUp, phase, gathered));
    }
    if (exchange) dispatch_rows(transposed(*dispatch));
    ops.push_back(elementwise(ComputeKind::ExpertPermute, phase, permute, 3));
    ops.push_back(gemm(x, ComputeKind::Router, phase, m.tokens, experts, x.h));
    shared_experts(ops, s, x, phase);
    return ops;
  }
  shared_experts(ops, s, x, phase);
  ops.push_back(gemm(x, ComputeKind::Router, phase, m.tokens, experts, x.h));
  if (x.sequence_parallel) {  // Megatron-Core's router sums tokens_per_expert over the TP (and CP) shards for the loss
    ops.push_back(
        tensor_collective(CollectiveKind::AllReduce, Payload::ExpertCounts, ComputeKind::Router, phase, experts * 4));
  }
  // The split sizes' source and the host's wait for them (model/ops/moe_host_sync.hpp); padded to capacity, every
  // size is known on the host and neither runs.
  const bool counted = !s.model.pad_to_capacity;
  if (counted && (exchange || split)) ops.push_back(expert_counts_gather(s, phase));
  const bool sync_first = splits_sync_before_permutation(s);
  if (counted && sync_first) ops.push_back(expert_splits_sync(s, phase));
  ops.push_back(elementwise(ComputeKind::ExpertPermute, phase, permute, 3));
  if (counted && !sync_first) ops.push_back(expert_splits_sync(s, phase));
  if (exchange) dispatch_rows(dispatch);
  if (split) ops.push_back(expert_tensor_collective(CollectiveKind::AllGather, ComputeKind::ExpertUp, phase, gathered));
  ops.push_back(
      with_dispatcher_row_passes(s, x, m, grouped_gemm(x, ComputeKind::ExpertUp, phase, m, m.up_width, x.h), true));
  ops.push_back(expert_activation(x, phase, m.rows * m.width));
  ops.push_back(
      with_dispatcher_row_passes(s, x, m, grouped_gemm(x, ComputeKind::ExpertDown, phase, m, x.h, m.width), false));
  if (split) {
    ops.push_back(expert_tensor_collective(CollectiveKind::ReduceScatter, ComputeKind::ExpertDown, phase, gathered));
  }
  if (exchange) ops.push_back(all_to_all(phase, ComputeKind::ExpertDown, exchanged, transposed(*dispatch)));
  ops.push_back(elementwise(ComputeKind::ExpertUnpermute, phase, unpermute, 2));
  return ops;
}

}  // namespace twin::model
