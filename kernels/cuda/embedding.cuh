// Token and position embeddings on the device, twins of kernels/cpu/embedding.hpp (GPT-2: x = wte[token] + wpe[t]).
// The word embedding is vocab-parallel: a TP rank holds rows [vocab_start, vocab_start + vocab_local) of wte and writes
// zeros for the other tokens; the executor sums the TP ranks' outputs. Weights and activations bf16, gradients fp32.
// Token ids are not range-checked on the device (the data loader guarantees them; the CPU twin checks): a token
// outside the shard, negative ones included, is simply not this shard's, never an out-of-bounds access.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace twin::kernels::cuda {

// out (rows, channels) = wte_local[tokens[r] - vocab_start] if the token is in the shard, else 0.  Overwrites out.
void embedding_forward(__nv_bfloat16* out, const int* tokens, const __nv_bfloat16* wte_local, int rows, int channels,
                       int vocab_start, int vocab_local, cudaStream_t stream);

// dwte_local (vocab_local, channels) += scatter of dout (rows, channels) to the shard's rows of tokens (rows).
// ACCUMULATES, fp32. Deterministic without atomics: each block owns a range of vocabulary rows and a tile of
// channels and scans every row in order, so each element adds its rows in the CPU twin's order (same bits).
void embedding_backward(float* dwte_local, const __nv_bfloat16* dout, const int* tokens, int rows, int channels,
                        int vocab_start, int vocab_local, cudaStream_t stream);

// out (batch, seq, channels) += wpe (>= seq, channels) broadcast over batch
void position_embedding_forward(__nv_bfloat16* out, const __nv_bfloat16* wpe, int batch, int seq, int channels,
                                cudaStream_t stream);

// dwpe (>= seq, channels) += sum over batch, in order, of dout (batch, seq, channels). ACCUMULATES, fp32.
void position_embedding_backward(float* dwpe, const __nv_bfloat16* dout, int batch, int seq, int channels,
                                 cudaStream_t stream);

}  // namespace twin::kernels::cuda
