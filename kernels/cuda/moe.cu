#include "kernels/cuda/moe.cuh"

#include <cstddef>
#include <vector>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/matmul.cuh"
#include "kernels/cuda/moe_math.hpp"

namespace twin::kernels::cuda {

using device::bf16;

namespace {

__host__ __device__ std::size_t at(int row, int width) {
  return static_cast<std::size_t>(row) * static_cast<std::size_t>(width);
}

// ---- routing: one thread per token -------------------------------------------------------------------------------

__global__ void topk_softmax_forward_kernel(float* probs, int* experts, const bf16* logits, int tokens, int num_experts,
                                            int top_k) {
  TWIN_GRID_STRIDE_LOOP(t, static_cast<std::size_t>(tokens)) {
    const bf16* row = logits + t * num_experts;
    int* chosen = experts + t * top_k;
    moe_math::topk(
        chosen, [row](int e) { return __bfloat162float(row[e]); }, num_experts, top_k);
    moe_math::softmax(
        probs + t * top_k, [row, chosen](int j) { return __bfloat162float(row[chosen[j]]); }, top_k);
  }
}

__global__ void router_scores_kernel(float* scores, const bf16* logits, int tokens, int num_experts) {
  TWIN_GRID_STRIDE_LOOP(t, static_cast<std::size_t>(tokens)) {
    const bf16* row = logits + t * num_experts;
    moe_math::softmax(
        scores + t * num_experts, [row](int e) { return __bfloat162float(row[e]); }, num_experts);
  }
}

// block e: sums[e] = sum over tokens of scores[t, e], each thread a strided share in double, then block_sum
__global__ void score_sums_kernel(double* sums, const float* scores, int tokens, int num_experts) {
  __shared__ double shared[32];
  const int e = blockIdx.x;
  double x = 0.0;
  for (int t = threadIdx.x; t < tokens; t += blockDim.x) x += static_cast<double>(scores[at(t, num_experts) + e]);
  x = device::block_sum(x, shared);
  if (threadIdx.x == 0) sums[e] = x;
}

__global__ void router_backward_kernel(bf16* dlogits, const float* dprobs, const float* probs, const int* experts,
                                       const float* scores, const int* counts, int tokens, int num_experts, int top_k,
                                       float aux_scale) {
  TWIN_GRID_STRIDE_LOOP(t, static_cast<std::size_t>(tokens)) {
    const float* s = scores == nullptr ? nullptr : scores + t * num_experts;
    bf16* d = dlogits + t * num_experts;
    moe_math::router_backward_row([d](int e, float value) { d[e] = __float2bfloat16_rn(value); }, probs + t * top_k,
                                  dprobs + t * top_k, experts + t * top_k, [s](int e) { return s[e]; },
                                  [counts](int e) { return static_cast<float>(counts[e]); }, s != nullptr, aux_scale,
                                  num_experts, top_k);
  }
}

// ---- permutation: one thread per element -------------------------------------------------------------------------

// one thread per element: the bodies are moe_math's (bf16 loads and stores, fp32 arithmetic)
__global__ void permute_forward_kernel(bf16* out, const bf16* inp, const int* rows, std::size_t n, int hidden,
                                       int top_k) {
  TWIN_GRID_STRIDE_LOOP(i, n) {
    moe_math::permute_forward_element(
        i, [out](std::size_t at, float x) { out[at] = __float2bfloat16_rn(x); },
        [inp](std::size_t at) { return __bfloat162float(inp[at]); }, rows, hidden, top_k);
  }
}

__global__ void permute_backward_kernel(bf16* dinp, const bf16* dout, const int* rows, std::size_t n, int hidden,
                                        int top_k) {
  TWIN_GRID_STRIDE_LOOP(i, n) {
    moe_math::permute_backward_element(
        i, [dinp](std::size_t at, float x) { dinp[at] = __float2bfloat16_rn(x); },
        [dout](std::size_t at) { return __bfloat162float(dout[at]); }, rows, hidden, top_k);
  }
}

__global__ void unpermute_forward_kernel(bf16* out, const bf16* inp, const float* probs, const int* rows, std::size_t n,
                                         int hidden, int top_k) {
  TWIN_GRID_STRIDE_LOOP(i, n) {
    moe_math::unpermute_forward_element(
        i, [out](std::size_t at, float x) { out[at] = __float2bfloat16_rn(x); },
        [inp](std::size_t at) { return __bfloat162float(inp[at]); }, probs, rows, hidden, top_k);
  }
}

__global__ void unpermute_backward_rows_kernel(bf16* dinp, const bf16* dout, const float* probs, const int* rows,
                                               std::size_t n, int hidden, int top_k) {
  TWIN_GRID_STRIDE_LOOP(i, n) {
    moe_math::unpermute_backward_element(
        i, [dinp](std::size_t at, float x) { dinp[at] = __float2bfloat16_rn(x); },
        [dout](std::size_t at) { return __bfloat162float(dout[at]); }, probs, rows, hidden, top_k);
  }
}

// one warp per slot (t, j):  dprobs[t, j] = dout[t] . inp[rows[t, j]]
__global__ void unpermute_backward_probs_kernel(float* dprobs, const bf16* dout, const bf16* inp, const int* rows,
                                                std::size_t slots, int hidden, int top_k) {
  const std::size_t warps = static_cast<std::size_t>(gridDim.x) * (blockDim.x / 32);
  const int lane = threadIdx.x % 32;
  for (std::size_t slot = static_cast<std::size_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; slot < slots;
       slot += warps) {
    const bf16* g = dout + (slot / top_k) * hidden;
    const bf16* x = inp + static_cast<std::size_t>(rows[slot]) * hidden;
    float sum = 0.0f;
    for (int c = lane; c < hidden; c += 32) sum += __bfloat162float(g[c]) * __bfloat162float(x[c]);
    sum = device::warp_sum(sum);
    if (lane == 0) dprobs[slot] = sum;
  }
}

void check_router(const void* a, const void* b, int tokens, int num_experts, int top_k) {
  TWIN_CUDA_REQUIRE(tokens > 0 && num_experts > 0 && top_k > 0 && top_k <= num_experts);
  TWIN_CUDA_REQUIRE(a != nullptr && b != nullptr);
}

void check_permutation(const void* out, const void* inp, const int* rows, int tokens, int hidden, int top_k) {
  TWIN_CUDA_REQUIRE(tokens > 0 && hidden > 0 && top_k > 0);
  TWIN_CUDA_REQUIRE(out != nullptr && inp != nullptr && rows != nullptr && out != inp);
}

std::vector<moe_math::ChunkCopy> chunk_copies(const int* chunk_rows, const int* order, int chunks) {
  TWIN_CUDA_REQUIRE(chunks > 0 && chunk_rows != nullptr && order != nullptr);
  std::vector<moe_math::ChunkCopy> copies;
  const bool valid = moe_math::sort_chunk_copies(copies, chunk_rows, order, chunks);
  TWIN_CUDA_REQUIRE(valid);  // order a permutation of the chunks, no chunk with negative rows
  return copies;
}

void copy_rows(bf16* to, const bf16* from, std::size_t rows, int hidden, cudaStream_t stream) {
  TWIN_CUDA_CHECK(cudaMemcpyAsync(to, from, rows * hidden * sizeof(bf16), cudaMemcpyDeviceToDevice, stream));
}

}  // namespace

void moe_topk_softmax_forward(float* probs, int* experts, const bf16* logits, int tokens, int num_experts, int top_k,
                              cudaStream_t stream) {
  check_router(probs, logits, tokens, num_experts, top_k);
  TWIN_CUDA_REQUIRE(experts != nullptr);
  topk_softmax_forward_kernel<<<launch::grid_stride_blocks(tokens), launch::kElementwiseThreads, 0, stream>>>(
      probs, experts, logits, tokens, num_experts, top_k);
  TWIN_CUDA_CHECK_LAUNCH();
}

void moe_router_scores_forward(float* scores, const bf16* logits, int tokens, int num_experts, cudaStream_t stream) {
  check_router(scores, logits, tokens, num_experts, 1);
  router_scores_kernel<<<launch::grid_stride_blocks(tokens), launch::kElementwiseThreads, 0, stream>>>(
      scores, logits, tokens, num_experts);
  TWIN_CUDA_CHECK_LAUNCH();
}

void moe_score_sums(double* sums, const float* scores, int tokens, int num_experts, cudaStream_t stream) {
  check_router(sums, scores, tokens, num_experts, 1);
  score_sums_kernel<<<static_cast<unsigned>(num_experts), launch::kReduceThreads, 0, stream>>>(sums, scores, tokens,
                                                                                               num_experts);
  TWIN_CUDA_CHECK_LAUNCH();
}

void moe_router_backward(bf16* dlogits, const float* dprobs, const float* probs, const int* experts,
                         const float* scores, const int* counts, int tokens, int num_experts, int top_k,
                         float aux_scale, cudaStream_t stream) {
  check_router(dlogits, dprobs, tokens, num_experts, top_k);
  TWIN_CUDA_REQUIRE(probs != nullptr && experts != nullptr);
  TWIN_CUDA_REQUIRE((scores == nullptr) == (counts == nullptr));
  router_backward_kernel<<<launch::grid_stride_blocks(tokens), launch::kElementwiseThreads, 0, stream>>>(
      dlogits, dprobs, probs, experts, scores, counts, tokens, num_experts, top_k, aux_scale);
  TWIN_CUDA_CHECK_LAUNCH();
}

void moe_permute_forward(bf16* out, const bf16* inp, const int* rows, int tokens, int hidden, int top_k,
                         cudaStream_t stream) {
  check_permutation(out, inp, rows, tokens, hidden, top_k);
  const std::size_t n = at(tokens, top_k) * static_cast<std::size_t>(hidden);
  permute_forward_kernel<<<launch::grid_stride_blocks(n), launch::kElementwiseThreads, 0, stream>>>(out, inp, rows, n,
                                                                                                    hidden, top_k);
  TWIN_CUDA_CHECK_LAUNCH();
}

void moe_permute_backward(bf16* dinp, const bf16* dout, const int* rows, int tokens, int hidden, int top_k,
                          cudaStream_t stream) {
  check_permutation(dinp, dout, rows, tokens, hidden, top_k);
  const std::size_t n = at(tokens, hidden);
  permute_backward_kernel<<<launch::grid_stride_blocks(n), launch::kElementwiseThreads, 0, stream>>>(dinp, dout, rows,
                                                                                                     n, hidden, top_k);
  TWIN_CUDA_CHECK_LAUNCH();
}

void moe_unpermute_forward(bf16* out, const bf16* inp, const float* probs, const int* rows, int tokens, int hidden,
                           int top_k, cudaStream_t stream) {
  check_permutation(out, inp, rows, tokens, hidden, top_k);
  TWIN_CUDA_REQUIRE(probs != nullptr);
  const std::size_t n = at(tokens, hidden);
  unpermute_forward_kernel<<<launch::grid_stride_blocks(n), launch::kElementwiseThreads, 0, stream>>>(
      out, inp, probs, rows, n, hidden, top_k);
  TWIN_CUDA_CHECK_LAUNCH();
}

void moe_unpermute_backward(bf16* dinp, float* dprobs, const bf16* dout, const bf16* inp, const float* probs,
                            const int* rows, int tokens, int hidden, int top_k, cudaStream_t stream) {
  check_permutation(dinp, dout, rows, tokens, hidden, top_k);
  TWIN_CUDA_REQUIRE(dprobs != nullptr && inp != nullptr && probs != nullptr && dinp != inp);
  const std::size_t n = at(tokens, top_k) * static_cast<std::size_t>(hidden), slots = at(tokens, top_k);
  unpermute_backward_rows_kernel<<<launch::grid_stride_blocks(n), launch::kElementwiseThreads, 0, stream>>>(
      dinp, dout, probs, rows, n, hidden, top_k);
  TWIN_CUDA_CHECK_LAUNCH();
  const unsigned warp_blocks = launch::grid_stride_blocks(slots * 32);  // one warp per slot
  unpermute_backward_probs_kernel<<<warp_blocks, launch::kElementwiseThreads, 0, stream>>>(dprobs, dout, inp, rows,
                                                                                           slots, hidden, top_k);
  TWIN_CUDA_CHECK_LAUNCH();
}

void moe_sort_chunks_forward(bf16* out, const bf16* inp, const int* chunk_rows, const int* order, int chunks,
                             int hidden, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(out != nullptr && inp != nullptr && out != inp && hidden > 0);
  for (const moe_math::ChunkCopy& c : chunk_copies(chunk_rows, order, chunks)) {
    copy_rows(out + c.sorted_row * hidden, inp + c.unsorted_row * hidden, c.rows, hidden, stream);
  }
}

void moe_sort_chunks_backward(bf16* dinp, const bf16* dout, const int* chunk_rows, const int* order, int chunks,
                              int hidden, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(dinp != nullptr && dout != nullptr && dinp != dout && hidden > 0);
  for (const moe_math::ChunkCopy& c : chunk_copies(chunk_rows, order, chunks)) {
    copy_rows(dinp + c.unsorted_row * hidden, dout + c.sorted_row * hidden, c.rows, hidden, stream);
  }
}

void moe_grouped_matmul_forward(bf16* out, const bf16* inp, const bf16* weights, const int* rows_per_group, int groups,
                                int in_features, int out_features, Cublas& blas, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(groups > 0 && in_features > 0 && out_features > 0);
  TWIN_CUDA_REQUIRE(out != nullptr && inp != nullptr && weights != nullptr && rows_per_group != nullptr);
  std::size_t row = 0;
  for (int g = 0; g < groups; ++g) {
    const int rows = rows_per_group[g];
    TWIN_CUDA_REQUIRE(rows >= 0);
    if (rows > 0) {
      matmul_forward(out + row * out_features, inp + row * in_features, weights + at(g, out_features) * in_features,
                     nullptr, rows, in_features, out_features, blas, stream);
    }
    row += static_cast<std::size_t>(rows);
  }
}

void moe_grouped_matmul_backward(bf16* dinp, float* dweights, const bf16* dout, const bf16* inp, const bf16* weights,
                                 const int* rows_per_group, int groups, int in_features, int out_features, Cublas& blas,
                                 cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(groups > 0 && in_features > 0 && out_features > 0);
  TWIN_CUDA_REQUIRE(dweights != nullptr && dout != nullptr && inp != nullptr && rows_per_group != nullptr);
  TWIN_CUDA_REQUIRE(dinp == nullptr || weights != nullptr);
  std::size_t row = 0;
  for (int g = 0; g < groups; ++g) {
    const int rows = rows_per_group[g];
    TWIN_CUDA_REQUIRE(rows >= 0);
    if (rows > 0) {
      const std::size_t weight = at(g, out_features) * in_features;
      matmul_backward(dinp == nullptr ? nullptr : dinp + row * in_features, dweights + weight, nullptr,
                      dout + row * out_features, inp + row * in_features,
                      weights == nullptr ? nullptr : weights + weight, rows, in_features,
                      out_features, blas, stream);
    }
    row += static_cast<std::size_t>(rows);
  }
}

}  // namespace twin::kernels::cuda
