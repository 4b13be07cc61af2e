// The CUDA backend's Mixture-of-Experts kernels (kernels/cuda/moe.cuh): bf16 logits and token rows, fp32
// probabilities and scores, int32 expert indices and row maps on the device. The host keeps the integer bookkeeping:
// the interpreter downloads the (T, k) chosen experts once per layer (download_i32: the host wait Megatron-Core also
// pays to size its all-to-all, model/ops/moe_host_sync.hpp) and uploads the permutation rows it derives; the grouped
// GEMMs take the rows per local expert from the host and run one cuBLASLt GEMM per expert with rows, on a handle of
// their own without autotuning (expert_blas()).
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

void CudaBackend::do_download_i32(int* host, const Tensor& src) {
  if (src.numel == 0) return;
  context_->wait_deferred();
  TWIN_CUDA_CHECK(
      cudaMemcpyAsync(host, i32(src, "download_i32", "src"), src.bytes(), cudaMemcpyDeviceToHost, context_->compute()));
  synchronize();
}

void CudaBackend::do_moe_topk_softmax_forward(const Tensor& probs, const Tensor& chosen, const Tensor& logits,
                                              int tokens, int experts, int top_k) {
  const char* kernel = "moe_topk_softmax_forward";
  k::moe_topk_softmax_forward(f32(probs, kernel, "probs"), i32(chosen, kernel, "chosen"), b16(logits, kernel, "logits"),
                              tokens, experts, top_k, context_->compute());
}

void CudaBackend::do_moe_router_scores_forward(const Tensor& scores, const Tensor& logits, int tokens, int experts) {
  const char* kernel = "moe_router_scores_forward";
  k::moe_router_scores_forward(f32(scores, kernel, "scores"), b16(logits, kernel, "logits"), tokens, experts,
                               context_->compute());
}

// The scores' column sums on the device, then the loss on the host from them and the counts.
double CudaBackend::do_moe_aux_loss_forward(const Tensor& scores, const std::vector<float>& counts, int tokens,
                                            int experts, int top_k, double total_tokens, double coeff) {
  const Tensor sums = allocate(static_cast<std::size_t>(experts), DType::F64);
  k::moe_score_sums(static_cast<double*>(sums.data), f32(scores, "moe_aux_loss_forward", "scores"), tokens, experts,
                    context_->compute());
  std::vector<double> host(static_cast<std::size_t>(experts));
  TWIN_CUDA_CHECK(cudaMemcpyAsync(host.data(), sums.data, sums.bytes(), cudaMemcpyDeviceToHost, context_->compute()));
  synchronize();
  return k::moe_math::aux_loss(host.data(), counts.data(), experts, top_k, total_tokens, coeff);
}

void CudaBackend::do_moe_router_backward(const Tensor& dlogits, const Tensor& dprobs, const Tensor& probs,
                                         const Tensor& chosen, const Tensor& scores, const std::vector<float>& counts,
                                         int tokens, int experts, int top_k, const MoeAuxLoss& aux) {
  const char* kernel = "moe_router_backward";
  const float* score_data = nullptr;
  const int* count_data = nullptr;
  Tensor device_counts;
  float scale = 0.0f;
  if (aux.coeff > 0) {
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

void CudaBackend::do_moe_permute_forward(const Tensor& out, const Tensor& inp, const Tensor& rows, int tokens,
                                         int hidden, int top_k) {
  TWIN_EXEC_CHECK(out.numel >= numel(tokens * top_k, hidden), "cuda moe_permute_forward: out {} for T {} C {} k {}",
                  out.numel, tokens, hidden, top_k);
  const char* kernel = "moe_permute_forward";
  k::moe_permute_forward(b16(out, kernel, "out"), b16(inp, kernel, "inp"), i32(rows, kernel, "rows"), tokens, hidden,
                         top_k, context_->compute());
}

void CudaBackend::do_moe_permute_backward(const Tensor& dinp, const Tensor& dout, const Tensor& rows, int tokens,
                                          int hidden, int top_k) {
  TWIN_EXEC_CHECK(dout.numel >= numel(tokens * top_k, hidden), "cuda moe_permute_backward: dout {} for T {} C {} k {}",
                  dout.numel, tokens, hidden, top_k);
  const char* kernel = "moe_permute_backward";
  k::moe_permute_backward(b16(dinp, kernel, "dinp"), b16(dout, kernel, "dout"), i32(rows, kernel, "rows"), tokens,
                          hidden, top_k, context_->compute());
}

void CudaBackend::do_moe_unpermute_forward(const Tensor& out, const Tensor& inp, const Tensor& probs,
                                           const Tensor& rows, int tokens, int hidden, int top_k) {
  TWIN_EXEC_CHECK(inp.numel >= numel(tokens * top_k, hidden), "cuda moe_unpermute_forward: inp {} for T {} C {} k {}",
                  inp.numel, tokens, hidden, top_k);
  const char* kernel = "moe_unpermute_forward";
  k::moe_unpermute_forward(b16(out, kernel, "out"), b16(inp, kernel, "inp"), f32(probs, kernel, "probs"),
                           i32(rows, kernel, "rows"), tokens, hidden, top_k, context_->compute());
}

void CudaBackend::do_moe_unpermute_backward(const Tensor& dinp, const Tensor& dprobs, const Tensor& dout,
                                            const Tensor& inp, const Tensor& probs, const Tensor& rows, int tokens,
                                            int hidden, int top_k) {
  TWIN_EXEC_CHECK(dinp.numel >= numel(tokens * top_k, hidden) && inp.numel >= numel(tokens * top_k, hidden),
                  "cuda moe_unpermute_backward: dinp {} inp {} for T {} C {} k {}", dinp.numel, inp.numel, tokens,
                  hidden, top_k);
  const char* kernel = "moe_unpermute_backward";
  k::moe_unpermute_backward(b16(dinp, kernel, "dinp"), f32(dprobs, kernel, "dprobs"), b16(dout, kernel, "dout"),
                            b16(inp, kernel, "inp"), f32(probs, kernel, "probs"), i32(rows, kernel, "rows"), tokens,
                            hidden, top_k, context_->compute());
}

void CudaBackend::do_moe_sort_chunks_forward(const Tensor& out, const Tensor& inp, const std::vector<int>& chunk_rows,
                                             const std::vector<int>& order, int hidden) {
  const char* kernel = "moe_sort_chunks_forward";
  k::moe_sort_chunks_forward(b16(out, kernel, "out"), b16(inp, kernel, "inp"), chunk_rows.data(), order.data(),
                             static_cast<int>(order.size()), hidden, context_->compute());
}

void CudaBackend::do_moe_sort_chunks_backward(const Tensor& dinp, const Tensor& dout,
                                              const std::vector<int>& chunk_rows, const std::vector<int>& order,
                                              int hidden) {
  const char* kernel = "moe_sort_chunks_backward";
  k::moe_sort_chunks_backward(b16(dinp, kernel, "dinp"), b16(dout, kernel, "dout"), chunk_rows.data(), order.data(),
                              static_cast<int>(order.size()), hidden, context_->compute());
}

void CudaBackend::do_moe_grouped_matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weights,
                                                const std::vector<int>& rows_per_group, int in_features,
                                                int out_features) {
  const std::size_t rows = total_rows(rows_per_group), groups = rows_per_group.size();
  if (rows == 0) return;
  const char* kernel = "moe_grouped_matmul_forward";
  k::moe_grouped_matmul_forward(b16(out, kernel, "out"), b16(inp, kernel, "inp"), b16(weights, kernel, "weights"),
                                rows_per_group.data(), static_cast<int>(groups), in_features, out_features,
                                expert_blas(), context_->compute());
}

void CudaBackend::do_moe_grouped_matmul_backward(const Tensor& dinp, const Tensor& dweights, const Tensor& dout,
                                                 const Tensor& inp, const Tensor& weights,
                                                 const std::vector<int>& rows_per_group, int in_features,
                                                 int out_features) {
  const std::size_t rows = total_rows(rows_per_group), groups = rows_per_group.size();
  if (rows == 0) return;
  const char* kernel = "moe_grouped_matmul_backward";
  k::moe_grouped_matmul_backward(optional_b16(dinp, kernel, "dinp"), f32(dweights, kernel, "dweights"),
                                 b16(dout, kernel, "dout"), b16(inp, kernel, "inp"), b16(weights, kernel, "weights"),
                                 rows_per_group.data(), static_cast<int>(groups), in_features, out_features,
                                 expert_blas(), context_->compute());
}

}  // namespace twin::exec::cuda
