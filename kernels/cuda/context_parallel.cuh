// Context parallelism's kernels on the device (bf16 activations, fp32 lse and delta), twins of
// kernels/cpu/ring_attention.hpp for the three ways of Megatron-Core's cp_comm_type (p2p ring, all_gather, a2a
// Ulysses). The CUDA backend (exec/cuda/cuda_backend_context.cpp) builds every context_* and ulysses_* method from
// these. The arithmetic lives in two host-and-device headers the CPU tests run: context_math.hpp (the 2 cp chunk
// layout, the lse merge, the index maps) and context_attention_rows.hpp (one query row or key row of the attention);
// the kernels here are grid-stride loops over them, one thread per row (llm.c's simple kernels: speed is not the goal,
// each thread walks the row's visible keys in fp32).
// L = seq / cp local tokens of each of B sequences, in the rank's chunk order; layouts as context_math.hpp says.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>

#include "kernels/cuda/context_attention_rows.hpp"
#include "kernels/cuda/context_math.hpp"

namespace twin::kernels::cuda {

// qkv (B, L, (H + 2 KV) D): rotates q and k of rank `rank`'s local tokens in place by their positions in the whole
// sequence (rope.cuh's rotation, context::position_of's positions); backward: by -angle (dq, dk back). rotary_dim as
// rope_forward's (0: head_dim).
void context_rope(__nv_bfloat16* qkv, const context::Layout& layout, int rank, int rotary_dim, bool backward,
                  cudaStream_t stream, float base = 10000.f);

// Pure copies by an index map (context_math.hpp), e the element of the compact side (n elements):
//   gather   compact[e] = strided[map(e)]   (keys out of qkv, a head group's block, the blocks of a sequence)
//   scatter  strided[map(e)] = compact[e]   (the inverse; elements of strided outside the map are left as they are)
void context_gather(__nv_bfloat16* compact, const __nv_bfloat16* strided, std::size_t n,
                    const context::ColumnRange& map, cudaStream_t stream);
void context_gather(__nv_bfloat16* compact, const __nv_bfloat16* strided, std::size_t n, const context::HeadGroups& map,
                    cudaStream_t stream);
void context_gather(__nv_bfloat16* compact, const __nv_bfloat16* strided, std::size_t n,
                    const context::SequenceBlocks& map, cudaStream_t stream);
void context_scatter(__nv_bfloat16* strided, const __nv_bfloat16* compact, std::size_t n,
                     const context::ColumnRange& map, cudaStream_t stream);
void context_scatter(__nv_bfloat16* strided, const __nv_bfloat16* compact, std::size_t n,
                     const context::HeadGroups& map, cudaStream_t stream);
void context_scatter(__nv_bfloat16* strided, const __nv_bfloat16* compact, std::size_t n,
                     const context::SequenceBlocks& map, cudaStream_t stream);

// out (B, L, H D), lse (2, B, H, C) <- rank `rank`'s queries (qkv) against the visible keys of the blocks `kv`: merged
// by log-sum-exp into (out, lse) when `merge` (a later ring step), else OVERWRITTEN (the first ring step; all_gather
// with every rank's blocks). out must not alias qkv or kv.
void context_attention_forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv,
                               const context::KeyBlocks<const __nv_bfloat16>& kv, int rank, bool merge,
                               const context::Layout& layout, cudaStream_t stream);

// delta (2, B, H, C) = rowsum(dout * out) of each local query row; dout, out (B, L, H D).
void context_attention_delta(float* delta, const __nv_bfloat16* dout, const __nv_bfloat16* out,
                             const context::Layout& layout, cudaStream_t stream);

// The backward against the blocks `kv`, given the final lse and delta (x): dq (rows of dq_stride, the query part at
// h D) += ; dkv (laid out as kv) += (accumulate) or OVERWRITTEN. Two kernels, each writing its gradient once (no
// atomics): query rows, then key rows.
void context_attention_backward(__nv_bfloat16* dq, std::size_t dq_stride, const context::KeyBlocks<__nv_bfloat16>& dkv,
                                bool accumulate, const context::Backward<__nv_bfloat16>& x,
                                const context::KeyBlocks<const __nv_bfloat16>& kv, const context::Layout& layout,
                                cudaStream_t stream);

}  // namespace twin::kernels::cuda
