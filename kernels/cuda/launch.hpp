// Launch configurations of the CUDA kernels, as plain host arithmetic (no CUDA header): the tests check them on any
// machine (tests/kernels_cuda/launch_test.cpp). Every size that reaches a kernel is computed here, so that an
// overflowing grid or a row count past a kernel's limit is caught before a launch, not inside one.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace twin::kernels::cuda::launch {

// Threads per block of the element-wise kernels (grid-stride loops).
inline constexpr int kElementwiseThreads = 256;
// Blocks of a grid-stride loop never exceed this: 4 waves of 2048-thread SMs on a 132-SM H100 are ~2200 blocks of
// 256; more blocks only add scheduling.
inline constexpr std::size_t kMaxGridStrideBlocks = 4096;
// CUDA's limit on gridDim.y and gridDim.z.
inline constexpr std::size_t kMaxGridY = 65535;

// ceil(a / b) for b > 0
constexpr std::size_t ceil_div(std::size_t a, std::size_t b) {
  return (a + b - 1) / b;
}

// Blocks of a grid-stride loop over n items with `threads` threads per block: enough to give every thread one item,
// at most kMaxGridStrideBlocks, at least 1 (a launch with n = 0 is skipped by the caller).
constexpr unsigned grid_stride_blocks(std::size_t n, int threads = kElementwiseThreads) {
  return static_cast<unsigned>(
      std::clamp<std::size_t>(ceil_div(n, static_cast<std::size_t>(threads)), 1, kMaxGridStrideBlocks));
}

// --- rows handled one warp each (layernorm, softmax of attention) ---------------------------------------------------
inline constexpr int kWarpsPerRowBlock = 8;  // 256 threads: one row per warp
constexpr unsigned row_blocks(std::size_t rows) {
  return static_cast<unsigned>(ceil_div(rows, kWarpsPerRowBlock));
}

// --- norms of a row by a block (layernorm, rmsnorm): each thread keeps up to kNormPacks packs of 8 bf16 of the row in
// registers, so the row is read once; rows whose channels are not a multiple of 8 go to the warp-per-row kernels ----
inline constexpr int kNormPacks = 4;
inline constexpr int kNormMaxThreads = 1024;
// threads of a block for one row of `channels` (a multiple of 32, enough for kNormPacks packs each), or 0 when the
// row does not fit the block path (channels not a multiple of 8, or more than 8 * kNormPacks * 1024 = 32768)
constexpr int norm_threads(int channels) {
  if (channels <= 0 || channels % 8 != 0) return 0;
  const std::size_t packs = static_cast<std::size_t>(channels) / 8;
  const std::size_t threads = (ceil_div(packs, kNormPacks) + 31) / 32 * 32;
  return threads > static_cast<std::size_t>(kNormMaxThreads) ? 0 : static_cast<int>(threads);
}

// --- column sums over rows (bias and LayerNorm weight gradients), deterministic ------------------------------------
// Stage 1: blocks of (32 columns x kColumnLanes rows-lanes) each sum kRowsPerChunk consecutive rows of 32 columns
// into partial (chunks, channels); stage 2 sums the chunks of each column in order into the output. The order of
// every addition depends on rows and channels alone.
inline constexpr int kColumnTile = 32;
inline constexpr int kColumnLanes = 8;
inline constexpr int kRowsPerChunk = 64;

struct ColumnSumShape {
  unsigned column_tiles = 0;  // gridDim.x of stage 1
  unsigned chunks = 0;        // gridDim.y of stage 1 = rows of the partial sums
  std::size_t columns = 0;    // channels
  // floats of scratch for `outputs` sums per column: (outputs, chunks, columns)
  std::size_t partial_floats(int outputs) const { return static_cast<std::size_t>(outputs) * chunks * columns; }
};

inline ColumnSumShape column_sum_shape(int rows, int channels) {
  if (rows <= 0 || channels <= 0) throw std::invalid_argument("column_sum_shape: rows and channels must be positive");
  ColumnSumShape shape;
  shape.column_tiles = static_cast<unsigned>(ceil_div(static_cast<std::size_t>(channels), kColumnTile));
  const std::size_t chunks = ceil_div(static_cast<std::size_t>(rows), kRowsPerChunk);
  if (chunks > kMaxGridY) {
    throw std::invalid_argument("column_sum_shape: " + std::to_string(rows) + " rows exceed the limit of " +
                                std::to_string(kMaxGridY * kRowsPerChunk));
  }
  shape.chunks = static_cast<unsigned>(chunks);
  shape.columns = static_cast<std::size_t>(channels);
  return shape;
}

// --- embedding backward: blocks own (channel tile, vocabulary range) and scan all rows in order ---------------------
inline constexpr int kEmbeddingChannelsPerBlock = 128;  // threads per block, one channel each
inline constexpr int kEmbeddingVocabPerBlock = 1024;    // local vocabulary rows owned by one block
inline constexpr int kEmbeddingTokenTile = 1024;        // token ids staged in shared memory at a time

struct EmbeddingBackwardShape {
  unsigned channel_tiles = 0;  // gridDim.x
  unsigned vocab_ranges = 0;   // gridDim.y
};

inline EmbeddingBackwardShape embedding_backward_shape(int channels, int vocab_local) {
  if (channels <= 0 || vocab_local <= 0)
    throw std::invalid_argument("embedding_backward_shape: sizes must be positive");
  const std::size_t ranges = ceil_div(static_cast<std::size_t>(vocab_local), kEmbeddingVocabPerBlock);
  if (ranges > kMaxGridY) throw std::invalid_argument("embedding_backward_shape: vocabulary shard too large");
  return {static_cast<unsigned>(ceil_div(static_cast<std::size_t>(channels), kEmbeddingChannelsPerBlock)),
          static_cast<unsigned>(ranges)};
}

// --- full reductions to one double (squared_norm, sum): stage 1 per-block partials, stage 2 one block --------------
inline constexpr int kReduceThreads = 256;
inline constexpr std::size_t kMaxReduceBlocks = 1024;
constexpr unsigned reduce_blocks(std::size_t n) {
  return static_cast<unsigned>(std::clamp<std::size_t>(ceil_div(n, 4 * kReduceThreads), 1, kMaxReduceBlocks));
}

// --- cross-entropy: one block per row ------------------------------------------------------------------------------
inline constexpr int kCrossEntropyThreads = 512;

// --- fused attention (flash_attention.cuh): a block of 4 warps per tile, tiles of kernels/cpu/flash_attention.hpp --
inline constexpr int kFlashThreads = 128;
inline constexpr int kFlashQueryTile = 64;  // kernels::cpu::kFlashQueryTile
inline constexpr int kFlashKeyTile = 64;    // kernels::cpu::kFlashKeyTile
inline constexpr int kFlashPadding = 8;  // bf16 per shared-memory row beyond head_dim: ldmatrix rows hit 8 bank groups
constexpr int flash_backward_query_tile(int head_dim) {  // kernels::cpu::flash_backward_query_tile
  return head_dim <= 64 ? 64 : 32;
}
constexpr bool flash_supports_head_dim(int head_dim) {  // the kernels' instantiations
  return head_dim == 32 || head_dim == 64 || head_dim == 96 || head_dim == 128;
}

struct FlashShape {
  unsigned query_tiles = 0, key_tiles = 0;  // gridDim.x of the forward and dq kernels, of the dk/dv kernel
  unsigned query_heads = 0, kv_heads = 0;   // gridDim.y: batch * heads, batch * kv_heads
  std::size_t forward_smem_bytes = 0;       // Q, K and V tiles
  std::size_t dkdv_smem_bytes = 0;          // K and V tiles, a query step of Q and dout, its lse and delta
  std::size_t dq_smem_bytes = 0;            // Q, dout, K and V tiles
};

inline FlashShape flash_shape(int batch, int seq, int heads, int kv_heads, int head_dim) {
  if (batch <= 0 || seq <= 0 || heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0) {
    throw std::invalid_argument("flash_shape: batch, seq, heads > 0 and heads a multiple of kv_heads");
  }
  if (!flash_supports_head_dim(head_dim)) {
    throw std::invalid_argument("flash_shape: head_dim " + std::to_string(head_dim) + " (32, 64, 96 or 128)");
  }
  const std::size_t query_heads = static_cast<std::size_t>(batch) * heads;
  if (query_heads > kMaxGridY) throw std::invalid_argument("flash_shape: batch * heads exceeds the grid's limit");
  FlashShape shape;
  shape.query_tiles = static_cast<unsigned>(ceil_div(static_cast<std::size_t>(seq), kFlashQueryTile));
  shape.key_tiles = static_cast<unsigned>(ceil_div(static_cast<std::size_t>(seq), kFlashKeyTile));
  shape.query_heads = static_cast<unsigned>(query_heads);
  shape.kv_heads = static_cast<unsigned>(static_cast<std::size_t>(batch) * kv_heads);
  const std::size_t row_bytes = 2 * static_cast<std::size_t>(head_dim + kFlashPadding);
  const std::size_t step = static_cast<std::size_t>(flash_backward_query_tile(head_dim));
  shape.forward_smem_bytes = (kFlashQueryTile + 2 * kFlashKeyTile) * row_bytes;
  shape.dkdv_smem_bytes = (2 * kFlashKeyTile + 2 * step) * row_bytes + 2 * step * sizeof(float);
  shape.dq_smem_bytes = (2 * kFlashQueryTile + 2 * kFlashKeyTile) * row_bytes;
  return shape;
}

}  // namespace twin::kernels::cuda::launch
