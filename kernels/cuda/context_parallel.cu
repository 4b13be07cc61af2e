#include "kernels/cuda/context_parallel.cuh"

#include <cmath>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/launch.hpp"

namespace twin::kernels::cuda {

using device::bf16;

namespace {

// Threads per block of the row kernels: each thread keeps up to 4 head vectors of fp32 (context_attention_rows.hpp).
constexpr int kRowThreads = 128;

void require_layout(const context::Layout& s) {
  TWIN_CUDA_REQUIRE(s.batch > 0 && s.heads > 0 && s.kv_heads > 0 && s.head_dim > 0 && s.cp > 0);
  TWIN_CUDA_REQUIRE(s.heads % s.kv_heads == 0 && s.seq > 0 && s.seq % (2 * s.cp) == 0);
  TWIN_CUDA_REQUIRE(s.head_dim <= context::kMaxHeadDim);
}

// --- rotary embeddings by position in the whole sequence (context::rope_pair) ---------------------------------------
__global__ void context_rope_kernel(bf16* qkv, std::size_t n, context::Layout s, int rank, int rotary_dim, float base,
                                    double direction) {
  TWIN_GRID_STRIDE_LOOP(e, n) {
    context::rope_pair(e, qkv, rank, rotary_dim, base, direction, s);
  }
}

// --- copies by an index map
// --------------------------------------------------------------------------------------------
template <class Map>
__global__ void gather_kernel(bf16* compact, const bf16* strided, std::size_t n, Map map) {
  TWIN_GRID_STRIDE_LOOP(e, n) {
    compact[e] = strided[map(e)];
  }
}
template <class Map>
__global__ void scatter_kernel(bf16* strided, const bf16* compact, std::size_t n, Map map) {
  TWIN_GRID_STRIDE_LOOP(e, n) {
    strided[map(e)] = compact[e];
  }
}

template <class Map>
void gather(bf16* compact, const bf16* strided, std::size_t n, const Map& map, cudaStream_t stream) {
  if (n == 0) return;
  TWIN_CUDA_REQUIRE(compact != nullptr && strided != nullptr);
  gather_kernel<<<launch::grid_stride_blocks(n), launch::kElementwiseThreads, 0, stream>>>(compact, strided, n, map);
  TWIN_CUDA_CHECK_LAUNCH();
}
template <class Map>
void scatter(bf16* strided, const bf16* compact, std::size_t n, const Map& map, cudaStream_t stream) {
  if (n == 0) return;
  TWIN_CUDA_REQUIRE(compact != nullptr && strided != nullptr);
  scatter_kernel<<<launch::grid_stride_blocks(n), launch::kElementwiseThreads, 0, stream>>>(strided, compact, n, map);
  TWIN_CUDA_CHECK_LAUNCH();
}

// --- attention rows
// ----------------------------------------------------------------------------------------------------
__global__ void forward_kernel(bf16* out, float* lse, const bf16* qkv, context::KeyBlocks<const bf16> kv, int rank,
                               bool merge, context::Layout s) {
  TWIN_GRID_STRIDE_LOOP(row, context::query_rows(s)) {
    context::forward_row(row, out, lse, qkv, kv, rank, merge, s);
  }
}

__global__ void delta_kernel(float* delta, const bf16* dout, const bf16* out, context::Layout s) {
  TWIN_GRID_STRIDE_LOOP(row, context::query_rows(s)) {
    context::delta_row(row, delta, dout, out, s);
  }
}

__global__ void dq_kernel(bf16* dq, std::size_t dq_stride, context::Backward<bf16> x, context::KeyBlocks<const bf16> kv,
                          context::Layout s) {
  TWIN_GRID_STRIDE_LOOP(row, context::query_rows(s)) {
    context::dq_row(row, dq, dq_stride, x, kv, s);
  }
}

__global__ void dkv_kernel(context::KeyBlocks<bf16> dkv, context::Backward<bf16> x, context::KeyBlocks<const bf16> kv,
                           bool accumulate, context::Layout s) {
  TWIN_GRID_STRIDE_LOOP(row, context::key_rows(kv.ranks, s)) {
    context::dkv_row(row, dkv, x, kv, accumulate, s);
  }
}

unsigned row_blocks(std::size_t rows) {
  return launch::grid_stride_blocks(rows, kRowThreads);
}

void require_blocks(const context::KeyBlocks<const bf16>& kv, const context::Layout& s) {
  TWIN_CUDA_REQUIRE(kv.keys != nullptr && kv.values != nullptr && kv.ranks > 0);
  TWIN_CUDA_REQUIRE(kv.first_rank >= 0 && kv.first_rank + kv.ranks <= s.cp);
}

}  // namespace

void context_rope(bf16* qkv, const context::Layout& s, int rank, int rotary_dim, bool backward, cudaStream_t stream,
                  float base) {
  require_layout(s);
  if (rotary_dim == 0) rotary_dim = s.head_dim;
  TWIN_CUDA_REQUIRE(rotary_dim > 0 && rotary_dim <= s.head_dim && rotary_dim % 2 == 0);
  TWIN_CUDA_REQUIRE(std::isfinite(base) && base > 0.0f && rank >= 0 && rank < s.cp && qkv != nullptr);
  const std::size_t n = context::rope_pairs(rotary_dim, s);
  context_rope_kernel<<<launch::grid_stride_blocks(n), launch::kElementwiseThreads, 0, stream>>>(
      qkv, n, s, rank, rotary_dim, base, backward ? -1.0 : 1.0);
  TWIN_CUDA_CHECK_LAUNCH();
}

void context_gather(bf16* compact, const bf16* strided, std::size_t n, const context::ColumnRange& map,
                    cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(map.range > 0 && map.column + map.range <= map.width);
  gather(compact, strided, n, map, stream);
}
void context_gather(bf16* compact, const bf16* strided, std::size_t n, const context::HeadGroups& map,
                    cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(map.rows > 0 && map.group > 0 && n % (map.rows * map.group) == 0);
  gather(compact, strided, n, map, stream);
}
void context_gather(bf16* compact, const bf16* strided, std::size_t n, const context::SequenceBlocks& map,
                    cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(map.cp > 0 && map.seq % (2 * map.cp) == 0 && map.range > 0 && map.column + map.range <= map.width);
  gather(compact, strided, n, map, stream);
}
void context_scatter(bf16* strided, const bf16* compact, std::size_t n, const context::ColumnRange& map,
                     cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(map.range > 0 && map.column + map.range <= map.width);
  scatter(strided, compact, n, map, stream);
}
void context_scatter(bf16* strided, const bf16* compact, std::size_t n, const context::HeadGroups& map,
                     cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(map.rows > 0 && map.group > 0 && n % (map.rows * map.group) == 0);
  scatter(strided, compact, n, map, stream);
}
void context_scatter(bf16* strided, const bf16* compact, std::size_t n, const context::SequenceBlocks& map,
                     cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(map.cp > 0 && map.seq % (2 * map.cp) == 0 && map.range > 0 && map.column + map.range <= map.width);
  scatter(strided, compact, n, map, stream);
}

void context_attention_forward(bf16* out, float* lse, const bf16* qkv, const context::KeyBlocks<const bf16>& kv,
                               int rank, bool merge, const context::Layout& s, cudaStream_t stream) {
  require_layout(s);
  require_blocks(kv, s);
  TWIN_CUDA_REQUIRE(out != nullptr && lse != nullptr && qkv != nullptr && rank >= 0 && rank < s.cp);
  forward_kernel<<<row_blocks(context::query_rows(s)), kRowThreads, 0, stream>>>(out, lse, qkv, kv, rank, merge, s);
  TWIN_CUDA_CHECK_LAUNCH();
}

void context_attention_delta(float* delta, const bf16* dout, const bf16* out, const context::Layout& s,
                             cudaStream_t stream) {
  require_layout(s);
  TWIN_CUDA_REQUIRE(delta != nullptr && dout != nullptr && out != nullptr);
  delta_kernel<<<row_blocks(context::query_rows(s)), kRowThreads, 0, stream>>>(delta, dout, out, s);
  TWIN_CUDA_CHECK_LAUNCH();
}

void context_attention_backward(bf16* dq, std::size_t dq_stride, const context::KeyBlocks<bf16>& dkv, bool accumulate,
                                const context::Backward<bf16>& x, const context::KeyBlocks<const bf16>& kv,
                                const context::Layout& s, cudaStream_t stream) {
  require_layout(s);
  require_blocks(kv, s);
  TWIN_CUDA_REQUIRE(dq != nullptr && dq_stride >= s.out_width() && dkv.keys != nullptr && dkv.values != nullptr);
  TWIN_CUDA_REQUIRE(x.dout != nullptr && x.qkv != nullptr && x.lse != nullptr && x.delta != nullptr);
  TWIN_CUDA_REQUIRE(x.rank >= 0 && x.rank < s.cp && dkv.ranks == kv.ranks && dkv.first_rank == kv.first_rank);
  dq_kernel<<<row_blocks(context::query_rows(s)), kRowThreads, 0, stream>>>(dq, dq_stride, x, kv, s);
  TWIN_CUDA_CHECK_LAUNCH();
  dkv_kernel<<<row_blocks(context::key_rows(kv.ranks, s)), kRowThreads, 0, stream>>>(dkv, x, kv, accumulate, s);
  TWIN_CUDA_CHECK_LAUNCH();
}

}  // namespace twin::kernels::cuda
