// Causal multi-head attention with GEMMs: the contract of kernels/cpu/attention.hpp (same layouts, same saved
// log-sum-exp, overwrite semantics), computed per (batch, head) as
//   forward:  S = Q K^T (T, T);  P = causal softmax(S / sqrt(D));  O = P V            2 GEMMs
//   backward: S = Q K^T;  P = exp(S / sqrt(D) - lse);  dP = dO V^T;  dS = P (dP - rowsum(P dP)) / sqrt(D);
//             dQ = dS K;  dK = dS^T Q;  dV = P^T dO                                  5 GEMMs
// through kernels::cpu::matmul_forward/backward (OpenBLAS). kernels/cpu's scalar loops are the reference (a test
// compares both); this version exists because at seq 256 the attention core dominated a training step on the CPU.
// (batch, head) pairs run in parallel on `pool` when given; each writes only its own outputs.
#pragma once

namespace twin::exec::cpu {

class ThreadPool;

// out (B, T, H*D), lse (B, H, T) <- qkv (B, T, 3*H*D). Overwrites out and lse.
void attention_forward_gemm(float* out, float* lse, const float* qkv, int batch, int seq, int heads, int head_dim,
                            ThreadPool* pool);

// dqkv (B, T, 3*H*D) <- dout (B, T, H*D), qkv, lse (B, H, T). OVERWRITES dqkv.
void attention_backward_gemm(float* dqkv, const float* dout, const float* qkv, const float* lse, int batch, int seq,
                             int heads, int head_dim, ThreadPool* pool);

}  // namespace twin::exec::cpu
