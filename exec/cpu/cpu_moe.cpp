// The CPU backend's Mixture-of-Experts kernels: kernels/cpu/moe.hpp on host memory, fp32 rows, int32 row maps.
#include <algorithm>
#include <numeric>

#include "exec/core/check.hpp"
#include "exec/cpu/cpu_backend.hpp"
#include "kernels/cpu/moe.hpp"

namespace twin::exec::cpu {

namespace k = twin::kernels::cpu;

namespace {

// The rows of the permuted buffer a row map (tokens, k) addresses: its largest row + 1 (k::kMoeDropped rows have none,
// so a buffer with drops holds fewer than tokens x k).
std::size_t permuted_rows(const Tensor& rows) {
  const int* begin = rows.i32();
  return rows.numel == 0 ? 0 : static_cast<std::size_t>(*std::max_element(begin, begin + rows.numel) + 1);
}

}  // namespace

void CpuBackend::do_download_i32(int* host, const Tensor& src) {
  if (src.numel > 0) std::copy(src.i32(), src.i32() + src.numel, host);
}

void CpuBackend::do_moe_topk_softmax_forward(const Tensor& probs, const Tensor& chosen, const Tensor& logits,
                                             int tokens, int experts, int top_k) {
  k::moe_topk_softmax_forward(probs.f32(), chosen.i32(), logits.f32(), tokens, experts, top_k);
}

void CpuBackend::do_moe_router_scores_forward(const Tensor& scores, const Tensor& logits, int tokens, int experts) {
  k::moe_router_scores_forward(scores.f32(), logits.f32(), tokens, experts);
}

double CpuBackend::do_moe_aux_loss_forward(const Tensor& scores, const std::vector<float>& counts, int tokens,
                                           int experts, int top_k, double total_tokens, double coeff) {
  return k::moe_aux_loss_forward(scores.f32(), counts.data(), tokens, experts, top_k, total_tokens, coeff);
}

void CpuBackend::do_moe_router_backward(const Tensor& dlogits, const Tensor& dprobs, const Tensor& probs,
                                        const Tensor& chosen, const Tensor& scores, const std::vector<float>& counts,
                                        int tokens, int experts, int top_k, const MoeAuxLoss& aux) {
  k::moe_topk_softmax_backward(dlogits.f32(), dprobs.f32(), probs.f32(), chosen.i32(), tokens, experts, top_k);
  if (aux.coeff <= 0) return;
  k::moe_aux_loss_backward(dlogits.f32(), scores.f32(), counts.data(), tokens, experts, top_k, aux.total_tokens,
                           aux.coeff, aux.loss_grad);
}

void CpuBackend::do_moe_permute_forward(const Tensor& out, const Tensor& inp, const Tensor& rows, int tokens,
                                        int hidden, int top_k) {
  TWIN_EXEC_CHECK(out.numel >= permuted_rows(rows) * hidden, "moe_permute_forward: out {} for the row map", out.numel);
  k::moe_permute_forward(out.f32(), inp.f32(), rows.i32(), tokens, hidden, top_k);
}

void CpuBackend::do_moe_permute_backward(const Tensor& dinp, const Tensor& dout, const Tensor& rows, int tokens,
                                         int hidden, int top_k) {
  TWIN_EXEC_CHECK(dout.numel >= permuted_rows(rows) * hidden, "moe_permute_backward: dout {} for the row map",
                  dout.numel);
  k::moe_permute_backward(dinp.f32(), dout.f32(), rows.i32(), tokens, hidden, top_k);
}

void CpuBackend::do_moe_unpermute_forward(const Tensor& out, const Tensor& inp, const Tensor& probs, const Tensor& rows,
                                          int tokens, int hidden, int top_k) {
  TWIN_EXEC_CHECK(inp.numel >= permuted_rows(rows) * hidden, "moe_unpermute_forward: inp {} for the row map",
                  inp.numel);
  k::moe_unpermute_forward(out.f32(), inp.f32(), probs.f32(), rows.i32(), tokens, hidden, top_k);
}

void CpuBackend::do_moe_unpermute_backward(const Tensor& dinp, const Tensor& dprobs, const Tensor& dout,
                                           const Tensor& inp, const Tensor& probs, const Tensor& rows, int tokens,
                                           int hidden, int top_k) {
  TWIN_EXEC_CHECK(dinp.numel >= permuted_rows(rows) * hidden && inp.numel >= permuted_rows(rows) * hidden,
                  "moe_unpermute_backward: dinp {} inp {} for the row map", dinp.numel, inp.numel);
  k::moe_unpermute_backward(dinp.f32(), dprobs.f32(), dout.f32(), inp.f32(), probs.f32(), rows.i32(), tokens, hidden,
                            top_k);
}

void CpuBackend::do_moe_sort_chunks_forward(const Tensor& out, const Tensor& inp, const std::vector<int>& chunk_rows,
                                            const std::vector<int>& order, int hidden) {
  k::moe_sort_chunks_forward(out.f32(), inp.f32(), chunk_rows.data(), order.data(), static_cast<int>(order.size()),
                             hidden);
}

void CpuBackend::do_moe_sort_chunks_backward(const Tensor& dinp, const Tensor& dout, const std::vector<int>& chunk_rows,
                                             const std::vector<int>& order, int hidden) {
  k::moe_sort_chunks_backward(dinp.f32(), dout.f32(), chunk_rows.data(), order.data(), static_cast<int>(order.size()),
                              hidden);
}

void CpuBackend::do_moe_grouped_matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weights,
                                               const std::vector<int>& rows_per_group, int in_features,
                                               int out_features) {
  const std::size_t groups = rows_per_group.size();
  k::moe_grouped_matmul_forward(out.f32(), inp.f32(), weights.f32(), rows_per_group.data(), static_cast<int>(groups),
                                in_features, out_features);
}

void CpuBackend::do_moe_grouped_matmul_backward(const Tensor& dinp, const Tensor& dweights, const Tensor& dout,
                                                const Tensor& inp, const Tensor& weights,
                                                const std::vector<int>& rows_per_group, int in_features,
                                                int out_features) {
  const std::size_t groups = rows_per_group.size();
  k::moe_grouped_matmul_backward(dinp.empty() ? nullptr : dinp.f32(), dweights.f32(), dout.f32(), inp.f32(),
                                 weights.f32(), rows_per_group.data(), static_cast<int>(groups), in_features,
                                 out_features);
}

}  // namespace twin::exec::cpu
