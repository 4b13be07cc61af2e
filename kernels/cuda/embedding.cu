#include "kernels/cuda/embedding.cuh"

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device.cuh"

namespace twin::kernels::cuda {

using device::bf16;

namespace {

// token id -> its row in the shard, or -1 (64-bit arithmetic: no overflow for any int token)
__device__ __forceinline__ long long local_row(int token, int vocab_start, int vocab_local) {
  const long long local = static_cast<long long>(token) - vocab_start;
  return (local >= 0 && local < vocab_local) ? local : -1;
}

// out[r, c] = wte_local[local(tokens[r]), c] or 0, flat index i = r * channels + c
__global__ void embedding_forward_kernel(bf16* out, const int* tokens, const bf16* wte_local, std::size_t n,
                                         int channels, int vocab_start, int vocab_local) {
  TWIN_GRID_STRIDE_LOOP(i, n) {
    const std::size_t r = i / channels;
    const int c = static_cast<int>(i % channels);
    const long long local = local_row(tokens[r], vocab_start, vocab_local);
    out[i] = local >= 0 ? wte_local[static_cast<std::size_t>(local) * channels + c] : __float2bfloat16_rn(0.0f);
  }
}

// Block (kEmbeddingChannelsPerBlock threads) = channel tile blockIdx.x x vocabulary range blockIdx.y. The block stages
// token ids in shared memory, tile by tile; each thread walks every row in order and adds dout[r, c] to its column of
// the rows it owns:  dwte_local[v, c] += dout[r, c]  for every r with local(tokens[r]) = v in the block's range.
__global__ void embedding_backward_kernel(float* dwte_local, const bf16* dout, const int* tokens, int rows,
                                          int channels, int vocab_start, int vocab_local) {
  __shared__ int local_tokens[launch::kEmbeddingTokenTile];
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const long long v_begin = static_cast<long long>(blockIdx.y) * launch::kEmbeddingVocabPerBlock;
  const long long v_end = v_begin + launch::kEmbeddingVocabPerBlock;
  for (int tile = 0; tile < rows; tile += launch::kEmbeddingTokenTile) {
    const int count = min(launch::kEmbeddingTokenTile, rows - tile);
    __syncthreads();  // the previous tile is consumed
    for (int i = threadIdx.x; i < count; i += blockDim.x) {
      const long long local = local_row(tokens[tile + i], vocab_start, vocab_local);
      local_tokens[i] = (local >= v_begin && local < v_end) ? static_cast<int>(local) : -1;
    }
    __syncthreads();
    if (c >= channels) continue;  // after the barriers: every thread takes part in staging
    for (int i = 0; i < count; ++i) {
      const int v = local_tokens[i];
      if (v < 0) continue;
      const std::size_t r = static_cast<std::size_t>(tile) + i;
      dwte_local[static_cast<std::size_t>(v) * channels + c] += __bfloat162float(dout[r * channels + c]);
    }
  }
}

// out[b, t, c] += wpe[t, c], flat index i = (b * seq + t) * channels + c
__global__ void position_embedding_forward_kernel(bf16* out, const bf16* wpe, std::size_t n, int seq, int channels) {
  const std::size_t per_sequence = static_cast<std::size_t>(seq) * channels;
  TWIN_GRID_STRIDE_LOOP(i, n) {
    out[i] = __float2bfloat16_rn(__bfloat162float(out[i]) + __bfloat162float(wpe[i % per_sequence]));
  }
}

// dwpe[t, c] += sum_b dout[b, t, c], b in order; flat index i = t * channels + c
__global__ void position_embedding_backward_kernel(float* dwpe, const bf16* dout, int batch, std::size_t per_sequence) {
  TWIN_GRID_STRIDE_LOOP(i, per_sequence) {
    float sum = dwpe[i];
    for (int b = 0; b < batch; ++b) sum += __bfloat162float(dout[b * per_sequence + i]);
    dwpe[i] = sum;
  }
}

}  // namespace

void embedding_forward(bf16* out, const int* tokens, const bf16* wte_local, int rows, int channels, int vocab_start,
                       int vocab_local, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(rows > 0 && channels > 0 && vocab_local > 0 && vocab_start >= 0);
  TWIN_CUDA_REQUIRE(out != nullptr && tokens != nullptr && wte_local != nullptr);
  const std::size_t n = static_cast<std::size_t>(rows) * channels;
  embedding_forward_kernel<<<launch::grid_stride_blocks(n), launch::kElementwiseThreads, 0, stream>>>(
      out, tokens, wte_local, n, channels, vocab_start, vocab_local);
  TWIN_CUDA_CHECK_LAUNCH();
}

void embedding_backward(float* dwte_local, const bf16* dout, const int* tokens, int rows, int channels, int vocab_start,
                        int vocab_local, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(rows > 0 && channels > 0 && vocab_local > 0 && vocab_start >= 0);
  TWIN_CUDA_REQUIRE(dwte_local != nullptr && dout != nullptr && tokens != nullptr);
  const launch::EmbeddingBackwardShape shape = launch::embedding_backward_shape(channels, vocab_local);
  embedding_backward_kernel<<<dim3(shape.channel_tiles, shape.vocab_ranges), launch::kEmbeddingChannelsPerBlock, 0,
                              stream>>>(dwte_local, dout, tokens, rows, channels, vocab_start, vocab_local);
  TWIN_CUDA_CHECK_LAUNCH();
}

void position_embedding_forward(bf16* out, const bf16* wpe, int batch, int seq, int channels, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(batch > 0 && seq > 0 && channels > 0);
  TWIN_CUDA_REQUIRE(out != nullptr && wpe != nullptr);
  const std::size_t n = static_cast<std::size_t>(batch) * seq * channels;
  position_embedding_forward_kernel<<<launch::grid_stride_blocks(n), launch::kElementwiseThreads, 0, stream>>>(
      out, wpe, n, seq, channels);
  TWIN_CUDA_CHECK_LAUNCH();
}

void position_embedding_backward(float* dwpe, const bf16* dout, int batch, int seq, int channels, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(batch > 0 && seq > 0 && channels > 0);
  TWIN_CUDA_REQUIRE(dwpe != nullptr && dout != nullptr);
  const std::size_t per_sequence = static_cast<std::size_t>(seq) * channels;
  position_embedding_backward_kernel<<<launch::grid_stride_blocks(per_sequence), launch::kElementwiseThreads, 0,
                                       stream>>>(dwpe, dout, batch, per_sequence);
  TWIN_CUDA_CHECK_LAUNCH();
}

}  // namespace twin::kernels::cuda
