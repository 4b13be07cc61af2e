// The CPU backend's Mixture-of-Experts kernels: kernels/cpu/moe.hpp on host memory, fp32 rows, int32 row maps.
#include <algorithm>
#include <numeric>

#include "exec/core/check.hpp"
#include "exec/cpu/cpu_backend.hpp"
#include "kernels/cpu/moe.hpp"

namespace twin::exec::cpu {

namespace k = twin::kernels::cpu;

namespace {

std::size_t total_rows(const std::vector<int>& rows) {
  return static_cast<std::size_t>(std::accumulate(rows.begin(), rows.end(), 0));
}

// The rows of the permuted buffer a row map (tokens, k) addresses: its largest row + 1 (k::kMoeDropped rows have none,
// so a buffer with drops holds fewer than tokens x k).
std::size_t permuted_rows(const Tensor& rows) {
  const int* begin = rows.i32();
  return rows.numel == 0 ? 0 : static_cast<std::size_t>(*std::max_element(begin, begin + rows.numel) + 1);
}

}  // namespace

void CpuBackend::download_i32(int* host, const Tensor& src) {
  if (src.numel > 0) std::copy(src.i32(), src.i32() + src.numel, host);
}

void CpuBackend::moe_topk_softmax_forward(const Tensor& probs, const Tensor& chosen, const Tensor& logits, int tokens,
                                          int experts, int top_k) {
  TWIN_EXEC_CHECK(probs.numel == numel(tokens, top_k) && chosen.numel == probs.numel && logits.numel == numel(tokens, experts),
                  "moe_topk_softmax_forward: probs {} chosen {} logits {} for T {} E {} k {}", probs.numel,
                  chosen.numel, logits.numel, tokens, experts, top_k);
  k::moe_topk_softmax_forward(probs.f32(), chosen.i32(), logits.f32(), tokens, experts, top_k);
}

void CpuBackend::moe_router_scores_forward(const Tensor& scores, const Tensor& logits, int tokens, int experts) {
  TWIN_EXEC_CHECK(scores.numel == numel(tokens, experts) && logits.numel == scores.numel,
                  "moe_router_scores_forward: scores {} logits {} for T {} E {}", scores.numel, logits.numel, tokens,
                  experts);
  k::moe_router_scores_forward(scores.f32(), logits.f32(), tokens, experts);
}

double CpuBackend::moe_aux_loss_forward(const Tensor& scores, const std::vector<float>& counts, int tokens, int experts,
                                        int top_k, double total_tokens, double coeff) {
  TWIN_EXEC_CHECK(scores.numel == numel(tokens, experts) && counts.size() == static_cast<std::size_t>(experts),
                  "moe_aux_loss_forward: scores {} counts {} for T {} E {}", scores.numel, counts.size(), tokens,
                  experts);
  return k::moe_aux_loss_forward(scores.f32(), counts.data(), tokens, experts, top_k, total_tokens, coeff);
}

void CpuBackend::moe_router_backward(const Tensor& dlogits, const Tensor& dprobs, const Tensor& probs,
                                     const Tensor& chosen, const Tensor& scores, const std::vector<float>& counts,
                                     int tokens, int experts, int top_k, const MoeAuxLoss& aux) {
  TWIN_EXEC_CHECK(dlogits.numel == numel(tokens, experts) && dprobs.numel == numel(tokens, top_k) &&
                      probs.numel == dprobs.numel && chosen.numel == dprobs.numel,
                  "moe_router_backward: dlogits {} dprobs {} probs {} chosen {} for T {} E {} k {}", dlogits.numel,
                  dprobs.numel, probs.numel, chosen.numel, tokens, experts, top_k);
  k::moe_topk_softmax_backward(dlogits.f32(), dprobs.f32(), probs.f32(), chosen.i32(), tokens, experts, top_k);
  if (aux.coeff <= 0) return;
  TWIN_EXEC_CHECK(scores.numel == numel(tokens, experts) && counts.size() == static_cast<std::size_t>(experts),
                  "moe_router_backward: scores {} counts {} for T {} E {}", scores.numel, counts.size(), tokens,
                  experts);
  k::moe_aux_loss_backward(dlogits.f32(), scores.f32(), counts.data(), tokens, experts, top_k, aux.total_tokens,
                           aux.coeff, aux.loss_grad);
}

void CpuBackend::moe_permute_forward(const Tensor& out, const Tensor& inp, const Tensor& rows, int tokens, int hidden,
                                     int top_k) {
  TWIN_EXEC_CHECK(
      rows.numel == numel(tokens, top_k) && out.numel >= permuted_rows(rows) * hidden && inp.numel >= numel(tokens, hidden),
      "moe_permute_forward: out {} inp {} rows {} for T {} C {} k {}", out.numel, inp.numel, rows.numel, tokens, hidden,
      top_k);
  k::moe_permute_forward(out.f32(), inp.f32(), rows.i32(), tokens, hidden, top_k);
}

void CpuBackend::moe_permute_backward(const Tensor& dinp, const Tensor& dout, const Tensor& rows, int tokens,
                                      int hidden, int top_k) {
  TWIN_EXEC_CHECK(
      rows.numel == numel(tokens, top_k) && dinp.numel >= numel(tokens, hidden) && dout.numel >= permuted_rows(rows) * hidden,
      "moe_permute_backward: dinp {} dout {} rows {} for T {} C {} k {}", dinp.numel, dout.numel, rows.numel, tokens,
      hidden, top_k);
  k::moe_permute_backward(dinp.f32(), dout.f32(), rows.i32(), tokens, hidden, top_k);
}

void CpuBackend::moe_unpermute_forward(const Tensor& out, const Tensor& inp, const Tensor& probs, const Tensor& rows,
                                       int tokens, int hidden, int top_k) {
  TWIN_EXEC_CHECK(probs.numel == numel(tokens, top_k) && rows.numel == probs.numel && out.numel >= numel(tokens, hidden) &&
                      inp.numel >= permuted_rows(rows) * hidden,
                  "moe_unpermute_forward: out {} inp {} probs {} rows {} for T {} C {} k {}", out.numel, inp.numel,
                  probs.numel, rows.numel, tokens, hidden, top_k);
  k::moe_unpermute_forward(out.f32(), inp.f32(), probs.f32(), rows.i32(), tokens, hidden, top_k);
}

void CpuBackend::moe_unpermute_backward(const Tensor& dinp, const Tensor& dprobs, const Tensor& dout, const Tensor& inp,
                                        const Tensor& probs, const Tensor& rows, int tokens, int hidden, int top_k) {
  TWIN_EXEC_CHECK(dprobs.numel == numel(tokens, top_k) && probs.numel == dprobs.numel && rows.numel == dprobs.numel &&
                      dinp.numel >= permuted_rows(rows) * hidden && dout.numel >= numel(tokens, hidden) &&
                      inp.numel >= permuted_rows(rows) * hidden,
                  "moe_unpermute_backward: dinp {} dprobs {} dout {} inp {} for T {} C {} k {}", dinp.numel,
                  dprobs.numel, dout.numel, inp.numel, tokens, hidden, top_k);
  k::moe_unpermute_backward(dinp.f32(), dprobs.f32(), dout.f32(), inp.f32(), probs.f32(), rows.i32(), tokens, hidden,
                            top_k);
}

void CpuBackend::moe_sort_chunks_forward(const Tensor& out, const Tensor& inp, const std::vector<int>& chunk_rows,
                                         const std::vector<int>& order, int hidden) {
  const std::size_t numel = total_rows(chunk_rows) * static_cast<std::size_t>(hidden);
  TWIN_EXEC_CHECK(chunk_rows.size() == order.size() && out.numel >= numel && inp.numel >= numel,
                  "moe_sort_chunks_forward: {} chunks, {} in the order, out {} inp {} for {} elements",
                  chunk_rows.size(), order.size(), out.numel, inp.numel, numel);
  k::moe_sort_chunks_forward(out.f32(), inp.f32(), chunk_rows.data(), order.data(), static_cast<int>(order.size()),
                             hidden);
}

void CpuBackend::moe_sort_chunks_backward(const Tensor& dinp, const Tensor& dout, const std::vector<int>& chunk_rows,
                                          const std::vector<int>& order, int hidden) {
  const std::size_t numel = total_rows(chunk_rows) * static_cast<std::size_t>(hidden);
  TWIN_EXEC_CHECK(chunk_rows.size() == order.size() && dinp.numel >= numel && dout.numel >= numel,
                  "moe_sort_chunks_backward: {} chunks, {} in the order, dinp {} dout {} for {} elements",
                  chunk_rows.size(), order.size(), dinp.numel, dout.numel, numel);
  k::moe_sort_chunks_backward(dinp.f32(), dout.f32(), chunk_rows.data(), order.data(), static_cast<int>(order.size()),
                              hidden);
}

void CpuBackend::moe_grouped_matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weights,
                                            const std::vector<int>& rows_per_group, int in_features, int out_features) {
  const std::size_t rows = total_rows(rows_per_group), groups = rows_per_group.size();
  TWIN_EXEC_CHECK(out.numel >= rows * static_cast<std::size_t>(out_features) &&
                      inp.numel >= rows * static_cast<std::size_t>(in_features) &&
                      weights.numel == groups * numel(out_features, in_features),
                  "moe_grouped_matmul_forward: out {} inp {} weights {} for {} rows of {} groups ({} -> {})", out.numel,
                  inp.numel, weights.numel, rows, groups, in_features, out_features);
  k::moe_grouped_matmul_forward(out.f32(), inp.f32(), weights.f32(), rows_per_group.data(), static_cast<int>(groups),
                                in_features, out_features);
}

void CpuBackend::moe_grouped_matmul_backward(const Tensor& dinp, const Tensor& dweights, const Tensor& dout,
                                             const Tensor& inp, const Tensor& weights,
                                             const std::vector<int>& rows_per_group, int in_features,
                                             int out_features) {
  const std::size_t rows = total_rows(rows_per_group), groups = rows_per_group.size();
  TWIN_EXEC_CHECK((dinp.empty() || dinp.numel >= rows * static_cast<std::size_t>(in_features)) &&
                      dout.numel >= rows * static_cast<std::size_t>(out_features) &&
                      inp.numel >= rows * static_cast<std::size_t>(in_features) &&
                      weights.numel == groups * numel(out_features, in_features) && dweights.numel == weights.numel,
                  "moe_grouped_matmul_backward: dinp {} dout {} inp {} weights {} dweights {} for {} rows of {} groups",
                  dinp.numel, dout.numel, inp.numel, weights.numel, dweights.numel, rows, groups);
  k::moe_grouped_matmul_backward(dinp.empty() ? nullptr : dinp.f32(), dweights.f32(), dout.f32(), inp.f32(),
                                 weights.f32(), rows_per_group.data(), static_cast<int>(groups), in_features,
                                 out_features);
}

}  // namespace twin::exec::cpu
