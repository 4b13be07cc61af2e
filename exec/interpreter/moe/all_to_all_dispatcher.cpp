// The all-to-all token dispatcher's exchanges (Megatron-Core's MoEAlltoAllTokenDispatcher, token_dispatcher.py):
//   ExpertCounts  (ep or etp > 1) preprocess()'s all-gather of the counts over the expert-TP x EP grid, which
//                 this executor runs but does not read (its dispatch exchanges the rows per expert itself)
//   Tokens        the all-to-alls over the Expert group. Dispatch sends peer j the permuted rows of j's experts (they
//                 lie together: the permutation is expert-major and EP rank j holds experts [j El, (j + 1) El));
//                 the rows per expert are data-dependent, so each dispatch first exchanges them (El counts to every
//                 peer, as the dispatcher's preprocess does) and then the rows. What arrives is grouped by source
//                 peer, then expert; sort_chunks_by_idxs regroups it by local expert for the grouped GEMMs. Combine
//                 is the inverse (unsort, then the transposed all-to-all). In the backward the gradients travel the
//                 same ways: the unpermute's gradient as a dispatch, the experts' input gradient as a combine.
//   ExpertProbs   the routing probabilities' all-to-all after the rows' (Megatron-Core sends them to the experts,
//                 which weight their outputs by them), over the dispatch's split sizes, and their gradient back. This
//                 executor weights the rows at the unpermute instead (the same sums), so what arrives is not read and
//                 the experts' side of the gradient is zero: the exchange runs as the Program has it.
//   Tokens over ExpertTensor (parallel.etp > 1; Megatron-Core's gather_from_sequence_parallel_region and
//                 reduce_scatter_to_sequence_parallel_region with per-rank sizes): each ETP member holds its slice of
//                 every local expert's width, so the rows its peers received are all-gathered (their counts first),
//                 regrouped by local expert, and after the down GEMM the partial sums go back to the rows' owners
//                 and are summed there in member order (deterministic). The gradients take the adjoint ways.
#include <algorithm>
#include <numeric>

#include <fmt/core.h>

#include "exec/core/check.hpp"
#include "exec/interpreter/moe/all_to_all_dispatcher.hpp"

namespace twin::exec {

using model::CollectiveKind;
using model::ComputeKind;
using model::Op;
using model::Payload;
using model::Phase;

namespace {

// chunk order[e * ep + i] = the received chunk of (peer i, local expert e), which sits at i * El + e
std::vector<int> expert_major_order(int ep, int local_experts) {
  std::vector<int> order(static_cast<std::size_t>(ep * local_experts));
  for (int e = 0; e < local_experts; ++e) {
    for (int i = 0; i < ep; ++i) order[static_cast<std::size_t>(e * ep + i)] = i * local_experts + e;
  }
  return order;
}

std::vector<std::size_t> times(const std::vector<std::size_t>& rows, std::size_t width) {
  std::vector<std::size_t> out(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) out[i] = rows[i] * width;
  return out;
}

std::size_t total(const std::vector<std::size_t>& rows) {
  return std::accumulate(rows.begin(), rows.end(), std::size_t{0});
}

}  // namespace

void AllToAllDispatcher::exchange(const Op& op, MoeStash& m) {
  const std::string& label = ctx_.label();
  if (op.payload == Payload::ExpertCounts) {
    // Megatron-Core gathers every member's counts for its all-to-all's split sizes (model/ops/moe_host_sync.hpp); this
    // dispatcher exchanges its own rows per expert (dispatch), so the gathered copy is not read.
    TWIN_EXEC_CHECK(op.collective == CollectiveKind::AllGather, "{}: expected an all-gather", label);
    const CommGroup& members = ctx_.group(op.group);
    std::vector<float> gathered(members.members.size() * m.counts.size());
    ctx_.comm.all_gather(members, m.counts.data(), gathered.data(), m.counts.size(), DType::F32, label);
    return;
  }
  const bool backward = op.phase == Phase::Backward;
  Splits& splits = splits_[StashKey::of(op)];
  if (op.payload == Payload::ExpertProbs) {
    probabilities(op, m, splits, backward);
    return;
  }
  if (op.group == model::Group::ExpertTensor) {
    TWIN_EXEC_CHECK(op.collective == CollectiveKind::AllGather || op.collective == CollectiveKind::ReduceScatter,
                    "{}: expected an all-gather or a reduce-scatter", label);
    if (op.collective == CollectiveKind::AllGather) {
      gather_rows(op, m, splits, backward);
    } else {
      scatter_rows(op, m, splits, backward);
    }
    return;
  }
  TWIN_EXEC_CHECK(op.collective == CollectiveKind::AllToAll && op.group == model::Group::Expert,
                  "{}: expected an all-to-all over the Expert group", label);
  const bool towards_experts = (op.what == ComputeKind::ExpertUp) != backward;  // dispatch, or its gradient's way
  if (towards_experts) {
    dispatch(op, m, splits, backward);
  } else {
    combine(op, m, splits, backward);
  }
}

void AllToAllDispatcher::probabilities(const Op& op, const MoeStash& m, const Splits& s, bool gradients) {
  const std::string label = ctx_.label() + " (probabilities)";
  TWIN_EXEC_CHECK(op.collective == CollectiveKind::AllToAll && s.send_rows.size() == s.recv_rows.size() &&
                      !s.send_rows.empty(),
                  "{}: the probabilities' all-to-all before its rows' dispatch", label);
  const std::vector<std::size_t>& send = gradients ? s.recv_rows : s.send_rows;
  const std::vector<std::size_t>& recv = gradients ? s.send_rows : s.recv_rows;
  std::vector<float> out(total(send), 0.0f), in(total(recv));
  if (!gradients) {  // each row's probability at its row of the permuted buffer (a dropped slot has none)
    std::vector<float> probs(m.rows.size());
    ctx_.backend.download_f32(probs.data(), m.probs);
    for (std::size_t i = 0; i < m.rows.size(); ++i) {
      const auto row = static_cast<std::size_t>(m.rows[i]);
      if (m.rows[i] >= 0 && row < out.size()) out[row] = probs[i];
    }
  }
  ctx_.comm.all_to_all(ctx_.group(op.group), out.data(), send, in.data(), recv, DType::F32, label);
}

void AllToAllDispatcher::dispatch(const Op& op, MoeStash& m, Splits& s, bool gradients) {
  const MoeDims& d = ctx_.shard.moe();
  const CommGroup& ep_group = ctx_.group(op.group);
  const std::string& label = ctx_.label();
  const auto C = static_cast<std::size_t>(ctx_.dims.hidden);
  const auto El = static_cast<std::size_t>(d.local_experts), ep = static_cast<std::size_t>(d.ep);
  TWIN_EXEC_CHECK(ep_group.members.size() == ep, "{}: the Expert group has {} members, ep is {}", label,
                  ep_group.members.size(), ep);
  if (!gradients) {  // the rows of each (peer, expert) first: what each peer will send
    const std::vector<std::size_t> counts(ep, El);
    s.recv_chunk_rows.assign(ep * El, 0);
    ctx_.comm.all_to_all(ep_group, m.rows_per_expert.data(), counts, s.recv_chunk_rows.data(), counts, DType::I32,
                         label + " (rows per expert)");
    s.send_rows.assign(ep, 0);
    s.recv_rows.assign(ep, 0);
    m.expert_rows.assign(El, 0);
    for (std::size_t j = 0; j < ep; ++j) {
      for (std::size_t e = 0; e < El; ++e) {
        s.send_rows[j] += static_cast<std::size_t>(m.rows_per_expert[j * El + e]);
        const int received = s.recv_chunk_rows[j * El + e];
        s.recv_rows[j] += static_cast<std::size_t>(received);
        m.expert_rows[e] += received;
      }
    }
  }
  const Tensor& in = gradients ? m.d_rows : m.permuted;  // (T k, C) in permuted order
  const std::size_t rows = total(s.recv_rows);
  const DType act = ctx_.backend.activation_dtype();
  const Tensor received = ctx_.backend.allocate(std::max<std::size_t>(rows, 1) * C, act);
  ctx_.comm.all_to_all(ep_group, in.data, times(s.send_rows, C), received.data, times(s.recv_rows, C), act, label);
  Tensor sorted = ctx_.backend.allocate(std::max<std::size_t>(rows, 1) * C, act);  // (R, C) expert-major
  ctx_.backend.moe_kernels().moe_sort_chunks_forward(sorted, received, s.recv_chunk_rows,
                                                     expert_major_order(d.ep, d.local_experts), ctx_.dims.hidden);
  (gradients ? m.d_rows : m.expert_in) = sorted;
}

void AllToAllDispatcher::combine(const Op& op, MoeStash& m, Splits& s, bool gradients) {
  const MoeDims& d = ctx_.shard.moe();
  const CommGroup& ep_group = ctx_.group(op.group);
  const std::string& label = ctx_.label();
  const auto C = static_cast<std::size_t>(ctx_.dims.hidden);
  const Tensor& in = gradients ? m.d_rows : m.expert_out;  // (R, C) expert-major
  const std::size_t rows = total(s.recv_rows);
  const DType act = ctx_.backend.activation_dtype();
  const Tensor unsorted = ctx_.backend.allocate(std::max<std::size_t>(rows, 1) * C, act);  // by peer, then expert
  ctx_.backend.moe_kernels().moe_sort_chunks_backward(unsorted, in, s.recv_chunk_rows,
                                                      expert_major_order(d.ep, d.local_experts), ctx_.dims.hidden);
  const Tensor out = ctx_.backend.allocate(std::max<std::size_t>(total(s.send_rows), 1) * C, act);  // (T k, C)
  ctx_.comm.all_to_all(ep_group, unsorted.data, times(s.recv_rows, C), out.data, times(s.send_rows, C), act, label);
  (gradients ? m.d_rows : m.combined) = out;
}

void AllToAllDispatcher::gather_rows(const Op& op, MoeStash& m, Splits& s, bool gradients) {
  const MoeDims& d = ctx_.shard.moe();
  const CommGroup& etp_group = ctx_.group(op.group);
  const std::string& label = ctx_.label();
  const auto C = static_cast<std::size_t>(ctx_.dims.hidden);
  const auto El = static_cast<std::size_t>(d.local_experts), etp = static_cast<std::size_t>(d.etp);
  if (!gradients) {  // each member's rows per local expert: what it will send
    std::vector<int> mine(etp * El);
    for (std::size_t j = 0; j < etp; ++j) std::copy(m.expert_rows.begin(), m.expert_rows.end(), mine.begin() + j * El);
    const std::vector<std::size_t> counts(etp, El);
    s.etp_chunk_rows.assign(etp * El, 0);
    ctx_.comm.all_to_all(etp_group, mine.data(), counts, s.etp_chunk_rows.data(), counts, DType::I32,
                         label + " (rows per expert)");
    s.own_rows = static_cast<std::size_t>(std::accumulate(m.expert_rows.begin(), m.expert_rows.end(), 0));
    s.etp_rows.assign(etp, 0);
    m.expert_rows.assign(El, 0);
    for (std::size_t j = 0; j < etp; ++j) {
      for (std::size_t e = 0; e < El; ++e) {
        s.etp_rows[j] += static_cast<std::size_t>(s.etp_chunk_rows[j * El + e]);
        m.expert_rows[e] += s.etp_chunk_rows[j * El + e];
      }
    }
  }
  const Tensor& own = gradients ? m.d_rows : m.expert_in;  // (own rows, C) expert-major
  const std::size_t own_numel = s.own_rows * C;
  const DType act = ctx_.backend.activation_dtype();
  const Tensor copies = ctx_.backend.allocate(std::max<std::size_t>(etp * own_numel, 1), act);  // one per member
  for (std::size_t j = 0; j < etp && own_numel > 0; ++j)
    ctx_.backend.copy(copies.slice(j * own_numel, own_numel), own.slice(0, own_numel));
  const std::size_t rows = total(s.etp_rows);
  const Tensor received = ctx_.backend.allocate(std::max<std::size_t>(rows, 1) * C, act);  // by member, expert
  ctx_.comm.all_to_all(etp_group, copies.data, std::vector<std::size_t>(etp, own_numel), received.data,
                       times(s.etp_rows, C), act, label);
  const Tensor sorted = ctx_.backend.allocate(std::max<std::size_t>(rows, 1) * C, act);  // expert-major
  ctx_.backend.moe_kernels().moe_sort_chunks_forward(sorted, received, s.etp_chunk_rows,
                                                     expert_major_order(d.etp, d.local_experts), ctx_.dims.hidden);
  (gradients ? m.d_rows : m.expert_in) = sorted;
}

void AllToAllDispatcher::scatter_rows(const Op& op, MoeStash& m, Splits& s, bool gradients) {
  const MoeDims& d = ctx_.shard.moe();
  const CommGroup& etp_group = ctx_.group(op.group);
  const auto C = static_cast<std::size_t>(ctx_.dims.hidden), etp = static_cast<std::size_t>(d.etp);
  const Tensor& partial = gradients ? m.d_rows : m.expert_out;  // (all rows, C) expert-major, partial sums
  const std::size_t rows = total(s.etp_rows), own_numel = s.own_rows * C;
  const DType act = ctx_.backend.activation_dtype();
  const Tensor unsorted = ctx_.backend.allocate(std::max<std::size_t>(rows, 1) * C, act);  // by member, expert
  ctx_.backend.moe_kernels().moe_sort_chunks_backward(unsorted, partial, s.etp_chunk_rows,
                                                      expert_major_order(d.etp, d.local_experts), ctx_.dims.hidden);
  const Tensor parts = ctx_.backend.allocate(std::max<std::size_t>(etp * own_numel, 1), act);  // one per member
  ctx_.comm.all_to_all(etp_group, unsorted.data, times(s.etp_rows, C), parts.data,
                       std::vector<std::size_t>(etp, own_numel), act, ctx_.label());
  Tensor sum = ctx_.backend.allocate(std::max<std::size_t>(own_numel, 1), act);  // (own rows, C)
  if (own_numel > 0) {
    ctx_.backend.copy(sum.slice(0, own_numel), parts.slice(0, own_numel));
    for (std::size_t j = 1; j < etp; ++j)
      ctx_.backend.accumulate(sum.slice(0, own_numel), parts.slice(j * own_numel, own_numel));
  }
  if (gradients) {
    m.d_rows = sum;
    return;
  }
  m.expert_out = sum;
  if (d.ep == 1) m.combined = sum;  // no combine: this rank's own rows, in permuted order
}

}  // namespace twin::exec
