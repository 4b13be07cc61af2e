#include "kernels/cuda/cross_entropy.cuh"

#include <algorithm>
#include <cmath>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device.cuh"

namespace twin::kernels::cuda {

using device::bf16;

namespace {

// A running softmax denominator: sum = sum_i exp(x_i - max). The empty state is (-inf, 0).
struct MaxSum {
  float max;
  float sum;
};

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  if (a.max == -INFINITY) return b;  // also keeps exp(-inf - -inf) = NaN out when both are empty
  if (b.max == -INFINITY) return a;
  const float m = fmaxf(a.max, b.max);
  return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

// number of this shard's columns that are real vocabulary entries (global index < valid_vocab)
int valid_local_columns(int vocab_start, int vocab_local, int valid_vocab) {
  return std::clamp(valid_vocab - vocab_start, 0, vocab_local);
}

// One block per row r: each thread folds its columns (v = tid, tid + blockDim, ...) into a MaxSum, then the warps
// merge by butterfly and warp 0 merges the warps, in a fixed order.
__global__ void cross_entropy_local_stats_kernel(float* stats, const bf16* logits, const int* targets, int columns,
                                                 int vocab_start, int vocab_local) {
  __shared__ MaxSum warp_results[32];
  const int r = blockIdx.x;
  const bf16* x = logits + static_cast<std::size_t>(r) * vocab_local;
  MaxSum state{-INFINITY, 0.0f};
  for (int v = threadIdx.x; v < columns; v += blockDim.x) {
    const float value = __bfloat162float(x[v]);
    if (value > state.max) {
      state.sum = state.sum * expf(state.max - value) + 1.0f;  // exp(-inf) = 0 for the first value
      state.max = value;
    } else {
      state.sum += expf(value - state.max);
    }
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    const MaxSum other{__shfl_xor_sync(0xffffffffu, state.max, offset),
                       __shfl_xor_sync(0xffffffffu, state.sum, offset)};
    state = merge(state, other);
  }
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  if (lane == 0) warp_results[warp] = state;
  __syncthreads();
  if (threadIdx.x == 0) {
    MaxSum total = warp_results[0];
    for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) total = merge(total, warp_results[w]);
    const long long local_target = static_cast<long long>(targets[r]) - vocab_start;
    const bool target_is_local = local_target >= 0 && local_target < vocab_local;
    float* s = stats + static_cast<std::size_t>(r) * kCrossEntropyStats;
    s[0] = total.max;
    s[1] = total.sum;
    s[2] = target_is_local ? __bfloat162float(x[local_target]) : 0.0f;
  }
}

// One thread per row: max over shards, then sum_s sum_s exp(max_s - max), lse, loss; in double, shards in order
__global__ void cross_entropy_combine_kernel(float* losses, float* log_sum_exp, const float* gathered_stats, int rows,
                                             int shards) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const std::size_t shard_stride = static_cast<std::size_t>(rows) * kCrossEntropyStats;
  const float* row_stats = gathered_stats + static_cast<std::size_t>(r) * kCrossEntropyStats;
  double max_logit = -INFINITY;
  for (int s = 0; s < shards; ++s) max_logit = fmax(max_logit, static_cast<double>(row_stats[s * shard_stride]));
  double sum = 0.0;
  double target_logit = 0.0;
  for (int s = 0; s < shards; ++s) {
    const float* stats = row_stats + s * shard_stride;
    if (stats[1] > 0.0f) sum += static_cast<double>(stats[1]) * exp(static_cast<double>(stats[0]) - max_logit);
    target_logit += stats[2];
  }
  const double lse = max_logit + log(sum);  // -inf max (no valid column anywhere, a caller bug) gives NaN: visible
  log_sum_exp[r] = static_cast<float>(lse);
  losses[r] = static_cast<float>(lse - target_logit);
}

// One block per row: dx[v] = scale * (exp(x[v] - lse) - [v is the target]) for valid columns, 0 for padding
__global__ void cross_entropy_backward_kernel(bf16* dlogits, const bf16* logits, const float* log_sum_exp,
                                              const int* targets, int columns, int vocab_start, int vocab_local,
                                              float scale) {
  const int r = blockIdx.x;
  const std::size_t row_offset = static_cast<std::size_t>(r) * vocab_local;
  const float lse = log_sum_exp[r];
  const long long local_target = static_cast<long long>(targets[r]) - vocab_start;
  for (int v = threadIdx.x; v < vocab_local; v += blockDim.x) {
    float d = 0.0f;
    if (v < columns) {
      const float p = expf(__bfloat162float(logits[row_offset + v]) - lse);
      d = v == local_target ? scale * (p - 1.0f) : scale * p;
    }
    dlogits[row_offset + v] = __float2bfloat16_rn(d);
  }
}

}  // namespace

void cross_entropy_local_stats(float* stats, const bf16* logits, const int* targets, int rows, int vocab_start,
                               int vocab_local, int valid_vocab, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(rows > 0 && vocab_local > 0 && vocab_start >= 0 && valid_vocab > 0);
  TWIN_CUDA_REQUIRE(stats != nullptr && logits != nullptr && targets != nullptr);
  const int columns = valid_local_columns(vocab_start, vocab_local, valid_vocab);
  cross_entropy_local_stats_kernel<<<rows, launch::kCrossEntropyThreads, 0, stream>>>(stats, logits, targets, columns,
                                                                                      vocab_start, vocab_local);
  TWIN_CUDA_CHECK_LAUNCH();
}

void cross_entropy_combine(float* losses, float* log_sum_exp, const float* gathered_stats, int rows, int shards,
                           cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(rows > 0 && shards > 0);
  TWIN_CUDA_REQUIRE(losses != nullptr && log_sum_exp != nullptr && gathered_stats != nullptr);
  const int threads = 256;
  cross_entropy_combine_kernel<<<static_cast<unsigned>(launch::ceil_div(rows, threads)), threads, 0, stream>>>(
      losses, log_sum_exp, gathered_stats, rows, shards);
  TWIN_CUDA_CHECK_LAUNCH();
}

void cross_entropy_backward(bf16* dlogits, const bf16* logits, const float* log_sum_exp, const int* targets, int rows,
                            int vocab_start, int vocab_local, int valid_vocab, float scale, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(rows > 0 && vocab_local > 0 && vocab_start >= 0 && valid_vocab > 0);
  TWIN_CUDA_REQUIRE(dlogits != nullptr && logits != nullptr && log_sum_exp != nullptr && targets != nullptr);
  const int columns = valid_local_columns(vocab_start, vocab_local, valid_vocab);
  cross_entropy_backward_kernel<<<rows, launch::kCrossEntropyThreads, 0, stream>>>(
      dlogits, logits, log_sum_exp, targets, columns, vocab_start, vocab_local, scale);
  TWIN_CUDA_CHECK_LAUNCH();
}

}  // namespace twin::kernels::cuda
