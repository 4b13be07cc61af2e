// Every CUDA kernel of a GPT, twins of kernels/cpu/kernels.hpp: same names, same argument order, plus the cudaStream_t
// they run on (and the Cublas handle of the GEMMs). Conventions on top of the CPU twins':
//   - bf16 (__nv_bfloat16) activations, working weights and activation gradients; fp32 parameter gradients, master
//     weights, AdamW state, LayerNorm statistics, attention lse and cross-entropy statistics; fp32 arithmetic.
//   - every call is asynchronous on its stream; a host precondition failure throws std::invalid_argument before any
//     launch (TWIN_CUDA_REQUIRE), a failed CUDA or cuBLAS call std::runtime_error with file:line (check.cuh).
//   - deterministic: same inputs, same bits (no atomics; reductions in orders fixed by the shapes).
//   - device pointers only; token ids and targets int32.
#pragma once

#include "kernels/cuda/adamw.cuh"          // adamw_update (fp32, and bf16 with an fp32 master copy)
#include "kernels/cuda/attention.cuh"      // attention_forward, attention_backward, attention_forward_gqa,
                                           // attention_backward_gqa
#include "kernels/cuda/cast.cuh"           // cast_float_to_bf16, cast_bf16_to_float, round_to_bf16
#include "kernels/cuda/check.cuh"          // TWIN_CUDA_CHECK, TWIN_CUBLAS_CHECK, TWIN_NCCL_CHECK, TWIN_MPI_CHECK
#include "kernels/cuda/cross_entropy.cuh"  // cross_entropy_local_stats, cross_entropy_combine, cross_entropy_backward
#include "kernels/cuda/elementwise.cuh"    // residual_forward, accumulate, bias_add, bias_backward, scale, copy, fill,
                                           // squared_norm, sum
#include "kernels/cuda/embedding.cuh"      // embedding_forward/backward, position_embedding_forward/backward
#include "kernels/cuda/flash_attention.cuh"  // flash_attention_forward/backward (fused), flash_attention_supports
#include "kernels/cuda/fp8_matmul.cuh"       // fp8_matmul_forward/backward; fp8.cuh: amax, quantize,
                                             // try_fp8_gemm
#include "kernels/cuda/gelu.cuh"             // gelu_forward, gelu_backward
#include "kernels/cuda/layernorm.cuh"        // layernorm_forward, residual_layernorm_forward, layernorm_backward
#include "kernels/cuda/matmul.cuh"           // Cublas, gemm, matmul_forward, matmul_forward_gelu, matmul_backward
#include "kernels/cuda/moe.cuh"              // moe_topk_softmax_forward, moe_router_*, moe_permute_*, moe_unpermute_*,
                                             // moe_sort_chunks_*, moe_grouped_matmul_*
#include "kernels/cuda/rmsnorm.cuh"          // rmsnorm_forward, rmsnorm_backward
#include "kernels/cuda/rope.cuh"             // rope_forward, rope_backward
#include "kernels/cuda/swiglu.cuh"           // swiglu_forward, swiglu_backward
