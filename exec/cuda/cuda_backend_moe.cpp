// The CUDA backend's Mixture-of-Experts kernels (kernels/cuda/moe.cuh): bf16 logits and token rows, fp32
// probabilities and scores, int32 expert indices and row maps on the device. The host keeps the integer bookkeeping:
// the interpreter downloads the (T, k) chosen experts once per layer (download_i32: the host wait Megatron-Core also
// pays to size its all-to-all, model/ops/moe_host_sync.hpp) and uploads the permutation rows it derives; the grouped GEMMs
// take the rows per local expert from the host and run one cuBLASLt GEMM per expert with rows, on a handle of their own
// without autotuning (expert_blas()).
#include <algorithm>
#include <memory>
#include <numeric>
#include <vector>

#include "exec/core/check.hpp"
#include "exec/cuda/cuda_backend.hpp"
#include "kernels/cuda/kernels.cuh"
#include "kernels/cuda/moe_math.hpp"

namespace twin::exec::cuda {

namespace k = twin::kernels::cuda;

namespace {

std::size_t total_rows(const std::vector<int>& rows) {
  return static_cast<std::size_t>(std::accumulate(rows.begin(), rows.end(), 0));
}

}  // namespace

kernels::cuda::Cublas& CudaBackend::expert_blas() {
  if (!expert_blas_) {
    expert_blas_ = std::make_unique<k::Cublas>(k::Cublas::kDefaultWorkspaceBytes, k::Cublas::Autotune::Off);
  }
  return *expert_blas_;
}

void CudaBackend::download_i32(int* host, const Tensor& src) {
  if (src.numel == 0) return;
  context_->wait_deferred();
  TWIN_CUDA_CHECK(
      cudaMemcpyAsync(host, i32(src, "download_i32", "src"), src.bytes(), cudaMemcpyDeviceToHost, context_->compute()));
  synchronize();
}

void CudaBackend::moe_topk_softmax_forward(const Tensor& probs, const Tensor& chosen, const Tensor& logits, int tokens,
                                           int experts, int top_k) {
  TWIN_EXEC_CHECK(probs.numel == numel(tokens, top_k) && chosen.numel == probs.numel && logits.numel == numel(tokens, experts),
                  "cuda moe_topk_softmax_forward: probs {} chosen {} logits {} for T {} E {} k {}", probs.numel,
                  chosen.numel, logits.numel, tokens, experts, top_k);
  const char* kernel = "moe_topk_softmax_forward";
  k::moe_topk_softmax_forward(f32(probs, kernel, "probs"), i32(chosen, kernel, "chosen"), b16(logits, kernel, "logits"),
                              tokens, experts, top_k, context_->compute());
}

void CudaBackend::moe_router_scores_forward(const Tensor& scores, const Tensor& logits, int tokens, int experts) {
  TWIN_EXEC_CHECK(scores.numel == numel(tokens, experts) && logits.numel == scores.numel,
                  "cuda moe_router_scores_forward: scores {} logits {} for T {} E {}", scores.numel, logits.numel,
                  tokens, experts);
  const char* kernel = "moe_router_scores_forward";
  k::moe_router_scores_forward(f32(scores, kernel, "scores"), b16(logits, kernel, "logits"), tokens, experts,
                               context_->compute());
}

// The scores' column sums on the device, then the loss on the host from them and the counts.
double CudaBackend::moe_aux_loss_forward(const Tensor& scores, const std::vector<float>& counts, int tokens,
                                         int experts, int top_k, double total_tokens, double coeff) {
  TWIN_EXEC_CHECK(scores.numel == numel(tokens, experts) && counts.size() == static_cast<std::size_t>(experts),
                  "cuda moe_aux_loss_forward: scores {} counts {} for T {} E {}", scores.numel, counts.size(), tokens,
                  experts);
  const Tensor sums = allocate(static_cast<std::size_t>(experts), DType::F64);
  k::moe_score_sums(static_cast<double*>(sums.data), f32(scores, "moe_aux_loss_forward", "scores"), tokens, experts,
                    context_->compute());
  std::vector<double> host(static_cast<std::size_t>(experts));
  TWIN_CUDA_CHECK(cudaMemcpyAsync(host.data(), sums.data, sums.bytes(), cudaMemcpyDeviceToHost, context_->compute()));
  synchronize();
  return k::moe_math::aux_loss(host.data(), counts.data(), experts, top_k, total_tokens, coeff);
}

void CudaBackend::moe_router_backward(const Tensor& dlogits, const Tensor& dprobs, const Tensor& probs,
                                      const Tensor& chosen, const Tensor& scores, const std::vector<float>& counts,
                                      int tokens, int experts, int top_k, const MoeAuxLoss& aux) {
  TWIN_EXEC_CHECK(dlogits.numel == numel(tokens, experts) && dprobs.numel == numel(tokens, top_k) &&
                      probs.numel == dprobs.numel && chosen.numel == dprobs.numel,
                  "cuda moe_router_backward: dlogits {} dprobs {} probs {} chosen {} for T {} E {} k {}", dlogits.numel,
                  dprobs.numel, probs.numel, chosen.numel, tokens, experts, top_k);
  const char* kernel = "moe_router_backward";
  const float* score_data = nullptr;
  const int* count_data = nullptr;
  Tensor device_counts;
  float scale = 0.0f;
  if (aux.coeff > 0) {
    TWIN_EXEC_CHECK(scores.numel == numel(tokens, experts) && counts.size() == static_cast<std::size_t>(experts),
                    "cuda moe_router_backward: scores {} counts {} for T {} E {}", scores.numel, counts.size(), tokens,
                    experts);
    // Tokens per expert are whole numbers: uploaded as int32 through upload_i32's pinned slots (no host wait)
    const std::vector<int> whole(counts.begin(), counts.end());
    device_counts = allocate(whole.size(), DType::I32);
    upload_i32(device_counts, whole.data());
    score_data = f32(scores, kernel, "scores");
    count_data = i32(device_counts, kernel, "counts");
    scale = k::moe_math::aux_loss_grad_scale(experts, top_k, aux.total_tokens, aux.coeff, aux.loss_grad);
  }
  k::moe_router_backward(b16(dlogits, kernel, "dlogits"), f32(dprobs, kernel, "dprobs"), f32(probs, kernel, "probs"),
                         i32(chosen, kernel, "chosen"), score_data, count_data, tokens, experts, top_k, scale,
                         context_->compute());
}

void CudaBackend::moe_permute_forward(const Tensor& out, const Tensor& inp, const Tensor& rows, int tokens, int hidden,
                                      int top_k) {
  TWIN_EXEC_CHECK(
      out.numel >= numel(tokens * top_k, hidden) && inp.numel >= numel(tokens, hidden) && rows.numel == numel(tokens, top_k),
      "cuda moe_permute_forward: out {} inp {} rows {} for T {} C {} k {}", out.numel, inp.numel, rows.numel, tokens,
      hidden, top_k);
  const char* kernel = "moe_permute_forward";
  k::moe_permute_forward(b16(out, kernel, "out"), b16(inp, kernel, "inp"), i32(rows, kernel, "rows"), tokens, hidden,
                         top_k, context_->compute());
}

void CudaBackend::moe_permute_backward(const Tensor& dinp, const Tensor& dout, const Tensor& rows, int tokens,
                                       int hidden, int top_k) {
  TWIN_EXEC_CHECK(
      dinp.numel >= numel(tokens, hidden) && dout.numel >= numel(tokens * top_k, hidden) && rows.numel == numel(tokens, top_k),
      "cuda moe_permute_backward: dinp {} dout {} rows {} for T {} C {} k {}", dinp.numel, dout.numel, rows.numel,
      tokens, hidden, top_k);
  const char* kernel = "moe_permute_backward";
  k::moe_permute_backward(b16(dinp, kernel, "dinp"), b16(dout, kernel, "dout"), i32(rows, kernel, "rows"), tokens,
                          hidden, top_k, context_->compute());
}

void CudaBackend::moe_unpermute_forward(const Tensor& out, const Tensor& inp, const Tensor& probs, const Tensor& rows,
                                        int tokens, int hidden, int top_k) {
  TWIN_EXEC_CHECK(out.numel >= numel(tokens, hidden) && inp.numel >= numel(tokens * top_k, hidden) &&
                      probs.numel == numel(tokens, top_k) && rows.numel == probs.numel,
                  "cuda moe_unpermute_forward: out {} inp {} probs {} rows {} for T {} C {} k {}", out.numel, inp.numel,
                  probs.numel, rows.numel, tokens, hidden, top_k);
  const char* kernel = "moe_unpermute_forward";
  k::moe_unpermute_forward(b16(out, kernel, "out"), b16(inp, kernel, "inp"), f32(probs, kernel, "probs"),
                           i32(rows, kernel, "rows"), tokens, hidden, top_k, context_->compute());
}

void CudaBackend::moe_unpermute_backward(const Tensor& dinp, const Tensor& dprobs, const Tensor& dout,
                                         const Tensor& inp, const Tensor& probs, const Tensor& rows, int tokens,
                                         int hidden, int top_k) {
  TWIN_EXEC_CHECK(dinp.numel >= numel(tokens * top_k, hidden) && dprobs.numel == numel(tokens, top_k) &&
                      dout.numel >= numel(tokens, hidden) && inp.numel >= numel(tokens * top_k, hidden) &&
                      probs.numel == dprobs.numel && rows.numel == dprobs.numel,
                  "cuda moe_unpermute_backward: dinp {} dprobs {} dout {} inp {} for T {} C {} k {}", dinp.numel,
                  dprobs.numel, dout.numel, inp.numel, tokens, hidden, top_k);
  const char* kernel = "moe_unpermute_backward";
  k::moe_unpermute_backward(b16(dinp, kernel, "dinp"), f32(dprobs, kernel, "dprobs"), b16(dout, kernel, "dout"),
                            b16(inp, kernel, "inp"), f32(probs, kernel, "probs"), i32(rows, kernel, "rows"), tokens,
                            hidden, top_k, context_->compute());
}

void CudaBackend::moe_sort_chunks_forward(const Tensor& out, const Tensor& inp, const std::vector<int>& chunk_rows,
                                          const std::vector<int>& order, int hidden) {
  const std::size_t numel = total_rows(chunk_rows) * static_cast<std::size_t>(hidden);
  TWIN_EXEC_CHECK(chunk_rows.size() == order.size() && out.numel >= numel && inp.numel >= numel,
                  "cuda moe_sort_chunks_forward: {} chunks, {} in the order, out {} inp {} for {} elements",
                  chunk_rows.size(), order.size(), out.numel, inp.numel, numel);
  const char* kernel = "moe_sort_chunks_forward";
  k::moe_sort_chunks_forward(b16(out, kernel, "out"), b16(inp, kernel, "inp"), chunk_rows.data(), order.data(),
                             static_cast<int>(order.size()), hidden, context_->compute());
}

void CudaBackend::moe_sort_chunks_backward(const Tensor& dinp, const Tensor& dout, const std::vector<int>& chunk_rows,
                                           const std::vector<int>& order, int hidden) {
  const std::size_t numel = total_rows(chunk_rows) * static_cast<std::size_t>(hidden);
  TWIN_EXEC_CHECK(chunk_rows.size() == order.size() && dinp.numel >= numel && dout.numel >= numel,
                  "cuda moe_sort_chunks_backward: {} chunks, {} in the order, dinp {} dout {} for {} elements",
                  chunk_rows.size(), order.size(), dinp.numel, dout.numel, numel);
  const char* kernel = "moe_sort_chunks_backward";
  k::moe_sort_chunks_backward(b16(dinp, kernel, "dinp"), b16(dout, kernel, "dout"), chunk_rows.data(), order.data(),
                              static_cast<int>(order.size()), hidden, context_->compute());
}

void CudaBackend::moe_grouped_matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weights,
                                             const std::vector<int>& rows_per_group, int in_features,
                                             int out_features) {
  const std::size_t rows = total_rows(rows_per_group), groups = rows_per_group.size();
  TWIN_EXEC_CHECK(out.numel >= rows * static_cast<std::size_t>(out_features) &&
                      inp.numel >= rows * static_cast<std::size_t>(in_features) &&
                      weights.numel == groups * numel(out_features, in_features),
                  "cuda moe_grouped_matmul_forward: out {} inp {} weights {} for {} rows of {} groups ({} -> {})",
                  out.numel, inp.numel, weights.numel, rows, groups, in_features, out_features);
  if (rows == 0) return;
  const char* kernel = "moe_grouped_matmul_forward";
  k::moe_grouped_matmul_forward(b16(out, kernel, "out"), b16(inp, kernel, "inp"), b16(weights, kernel, "weights"),
                                rows_per_group.data(), static_cast<int>(groups), in_features, out_features,
                                expert_blas(), context_->compute());
}

void CudaBackend::moe_grouped_matmul_backward(const Tensor& dinp, const Tensor& dweights, const Tensor& dout,
                                              const Tensor& inp, const Tensor& weights,
                                              const std::vector<int>& rows_per_group, int in_features,
                                              int out_features) {
  const std::size_t rows = total_rows(rows_per_group), groups = rows_per_group.size();
  TWIN_EXEC_CHECK((dinp.empty() || dinp.numel >= rows * static_cast<std::size_t>(in_features)) &&
                      dout.numel >= rows * static_cast<std::size_t>(out_features) &&
                      inp.numel >= rows * static_cast<std::size_t>(in_features) &&
                      weights.numel == groups * numel(out_features, in_features) && dweights.numel == weights.numel,
                  "cuda moe_grouped_matmul_backward: dinp {} dout {} inp {} weights {} dweights {} for {} rows of {} "
                  "groups",
                  dinp.numel, dout.numel, inp.numel, weights.numel, dweights.numel, rows, groups);
  if (rows == 0) return;
  const char* kernel = "moe_grouped_matmul_backward";
  k::moe_grouped_matmul_backward(optional_b16(dinp, kernel, "dinp"), f32(dweights, kernel, "dweights"),
                                 b16(dout, kernel, "dout"), b16(inp, kernel, "inp"), b16(weights, kernel, "weights"),
                                 rows_per_group.data(), static_cast<int>(groups), in_features, out_features,
                                 expert_blas(), context_->compute());
}

}  // namespace twin::exec::cuda
