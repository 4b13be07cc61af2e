// The Mixture-of-Experts exchanges (Megatron-Core's MoEAlltoAllTokenDispatcher, token_dispatcher.py):
//   ExpertCounts  sequence parallel: the router's tokens per expert summed over TP, for the load-balancing loss
//   Tokens        the all-to-alls over the Expert group. Dispatch sends peer j the permuted rows of j's experts (they
//                 lie together: the permutation is expert-major and EP rank j holds experts [j El, (j + 1) El));
//                 the rows per expert are data-dependent, so each dispatch first exchanges them (El counts to every
//                 peer, as the dispatcher's preprocess does) and then the rows. What arrives is grouped by source
//                 peer, then expert; sort_chunks_by_idxs regroups it by local expert for the grouped GEMMs. Combine
//                 is the inverse (unsort, then the transposed all-to-all). In the backward the gradients travel the
//                 same ways: the unpermute's gradient as a dispatch, the experts' input gradient as a combine.
#include <algorithm>
#include <numeric>

#include <fmt/core.h>

#include "exec/check.hpp"
#include "exec/interpreter.hpp"
#include "kernels/cpu/moe.hpp"

namespace twin::exec {

namespace k = kernels::cpu;
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

void Interpreter::moe_collective(const Op& op) {
  MoeStash& m = moe_stash(op);
  const std::string& label = labels_[current_op_];
  if (op.payload == Payload::ExpertCounts) {
    TWIN_EXEC_CHECK(op.collective == CollectiveKind::AllReduce, "{}: expected an all-reduce", label);
    comm_.all_reduce(group(op.group), m.counts.data(), m.counts.size(), DType::F32, label);
    return;
  }
  if (op.collective != CollectiveKind::AllToAll || op.group != model::Group::Expert) {
    throw RunError(fmt::format("rank {}: {}: the executor does not split experts over parallel.etp yet", rank_, label));
  }
  const bool backward = op.phase == Phase::Backward;
  const bool towards_experts = (op.what == ComputeKind::ExpertUp) != backward;  // dispatch, or its gradient's way
  if (towards_experts) {
    dispatch_tokens(op, m, backward);
  } else {
    combine_tokens(op, m, backward);
  }
}

void Interpreter::dispatch_tokens(const Op& op, MoeStash& m, bool gradients) {
  const MoeDims& d = shard_.moe();
  const CommGroup& ep_group = group(op.group);
  const std::string& label = labels_[current_op_];
  const auto C = static_cast<std::size_t>(dims_.hidden);
  const auto El = static_cast<std::size_t>(d.local_experts), ep = static_cast<std::size_t>(d.ep);
  TWIN_EXEC_CHECK(ep_group.members.size() == ep, "{}: the Expert group has {} members, ep is {}", label,
                  ep_group.members.size(), ep);
  if (!gradients) {  // the rows of each (peer, expert) first: what each peer will send
    const std::vector<std::size_t> counts(ep, El);
    m.recv_chunk_rows.assign(ep * El, 0);
    comm_.all_to_all(ep_group, m.rows_per_expert.data(), counts, m.recv_chunk_rows.data(), counts, DType::I32,
                     label + " (rows per expert)");
    m.send_rows.assign(ep, 0);
    m.recv_rows.assign(ep, 0);
    m.expert_rows.assign(El, 0);
    for (std::size_t j = 0; j < ep; ++j) {
      for (std::size_t e = 0; e < El; ++e) {
        m.send_rows[j] += static_cast<std::size_t>(m.rows_per_expert[j * El + e]);
        const int received = m.recv_chunk_rows[j * El + e];
        m.recv_rows[j] += static_cast<std::size_t>(received);
        m.expert_rows[e] += received;
      }
    }
  }
  const Tensor& in = gradients ? m.d_rows : m.permuted;  // (T k, C) in permuted order
  const std::size_t rows = total(m.recv_rows);
  const Tensor received = backend_.allocate(std::max<std::size_t>(rows, 1) * C, DType::F32);
  comm_.all_to_all(ep_group, in.data, times(m.send_rows, C), received.data, times(m.recv_rows, C), DType::F32, label);
  Tensor sorted = backend_.allocate(std::max<std::size_t>(rows, 1) * C, DType::F32);  // (R, C) expert-major
  const std::vector<int> order = expert_major_order(d.ep, d.local_experts);
  k::moe_sort_chunks_forward(sorted.f32(), received.f32(), m.recv_chunk_rows.data(), order.data(),
                             d.ep * d.local_experts, dims_.hidden);
  (gradients ? m.d_rows : m.expert_in) = sorted;
}

void Interpreter::combine_tokens(const Op& op, MoeStash& m, bool gradients) {
  const MoeDims& d = shard_.moe();
  const CommGroup& ep_group = group(op.group);
  const std::string& label = labels_[current_op_];
  const auto C = static_cast<std::size_t>(dims_.hidden);
  const Tensor& in = gradients ? m.d_rows : m.expert_out;  // (R, C) expert-major
  const std::size_t rows = total(m.recv_rows);
  const Tensor unsorted = backend_.allocate(std::max<std::size_t>(rows, 1) * C, DType::F32);  // by peer, then expert
  const std::vector<int> order = expert_major_order(d.ep, d.local_experts);
  k::moe_sort_chunks_backward(unsorted.f32(), in.f32(), m.recv_chunk_rows.data(), order.data(), d.ep * d.local_experts,
                              dims_.hidden);
  const Tensor out = backend_.allocate(std::max<std::size_t>(total(m.send_rows), 1) * C, DType::F32);  // (T k, C)
  comm_.all_to_all(ep_group, unsorted.data, times(m.recv_rows, C), out.data, times(m.send_rows, C), DType::F32, label);
  (gradients ? m.d_rows : m.combined) = out;
}

}  // namespace twin::exec
