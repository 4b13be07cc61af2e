// Every fp32 CPU kernel of a GPT (GPT-2 style: pre-LN, learned positions, tied embeddings), forward and backward, and
// those of Llama-style blocks (RMSNorm, SwiGLU, rotary positions, grouped-query attention).
// Conventions shared by all kernels (and by their CUDA twins in kernels/cuda/):
//   - arguments are (outputs..., inputs..., sizes..., scalars...); shape dimensions are int, flat counts std::size_t;
//     every tensor is dense and row-major, its shape in the comment above the function.
//   - parameter gradients ACCUMULATE (+=: gradient accumulation over micro-batches); activation gradients are
//     OVERWRITTEN, except layernorm_backward's and rmsnorm_backward's dinp, which accumulate into the residual
//     stream's gradient, and rope_backward, which rotates dq and dk in place.
//   - a violated precondition throws std::invalid_argument naming the kernel and the condition.
//   - deterministic: same inputs, same bits; single-threaded apart from the BLAS GEMM, whose bits may depend on the
//     BLAS thread count (set_blas_threads) but not on timing. Safe to call from several threads at once.
#pragma once

#include "kernels/cpu/adamw.hpp"            // adamw_update
#include "kernels/cpu/attention.hpp"        // attention_forward, attention_backward, attention_forward_gqa,
                                            // attention_backward_gqa, alibi_slopes
#include "kernels/cpu/cast.hpp"             // float_to_bf16, bf16_to_float, cast_*, round_to_bf16
#include "kernels/cpu/cross_entropy.hpp"    // cross_entropy_local_stats, cross_entropy_combine, cross_entropy_backward
#include "kernels/cpu/elementwise.hpp"      // residual_forward, accumulate, bias_add, bias_backward, scale, copy, fill,
                                            // squared_norm
#include "kernels/cpu/embedding.hpp"        // embedding_forward/backward, position_embedding_forward/backward
#include "kernels/cpu/flash_attention.hpp"  // flash_attention_forward/backward, the block functions of ring attention
#include "kernels/cpu/fp8.hpp"              // float_to_fp8, fp8_to_float, round_to_fp8, fp8_quantize_dequantize(_*),
                                            // DelayedScaling, mxfp8_quantize_dequantize
#include "kernels/cpu/fp8_matmul.hpp"       // fp8_quantize_operand, fp8_matmul_forward/backward
#include "kernels/cpu/gelu.hpp"             // gelu_forward, gelu_backward
#include "kernels/cpu/layernorm.hpp"        // layernorm_forward, layernorm_backward
#include "kernels/cpu/matmul.hpp"           // matmul_forward, matmul_backward, set_blas_threads
#include "kernels/cpu/ring_attention.hpp"   // ring_attention_*_step, all_gather_attention_*, ulysses_*, cp_*
#include "kernels/cpu/rmsnorm.hpp"          // rmsnorm_forward, rmsnorm_backward
#include "kernels/cpu/rope.hpp"             // rope_forward, rope_backward
#include "kernels/cpu/swiglu.hpp"           // swiglu_forward, swiglu_backward
