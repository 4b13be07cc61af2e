// Vocab-parallel cross-entropy on the device, twin of kernels/cpu/cross_entropy.hpp (Megatron's
// VocabParallelCrossEntropy): a TP rank holds logit columns [vocab_start, vocab_start + vocab_local); global columns
// >= valid_vocab are padding and count as -inf.
//   loss[r] = log(sum_v exp(x[r, v])) - x[r, target[r]]
// in three steps with the executor's all-gather of the (rows, 3) stats over the TP group between (1) and (2):
//   (1) cross_entropy_local_stats   per row: (local max, sum of exp(x - local max), target logit or 0)
//   (2) cross_entropy_combine       per row: global max and sum, lse, loss (double, in shard order)
//   (3) cross_entropy_backward      dlogits = scale * (softmax - onehot) on this shard's columns
// Logits and their gradient are bf16 (activations); stats, lse and losses fp32. One block per row for (1) and (3).
// Targets are not range-checked on the device (the CPU twin checks them): a target outside the shard contributes no
// target logit and no -1, never an out-of-bounds access.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace twin::kernels::cuda {

inline constexpr int kCrossEntropyStats = 3;  // (local max, local sum of exp(x - local max), target logit or 0)

// stats (rows, 3) <- logits (rows, vocab_local), targets (rows). A shard with no valid column writes (-inf, 0, 0).
void cross_entropy_local_stats(float* stats, const __nv_bfloat16* logits, const int* targets, int rows, int vocab_start,
                               int vocab_local, int valid_vocab, cudaStream_t stream);

// losses (rows), log_sum_exp (rows) <- gathered_stats (shards, rows, 3), shard s's stats at [s * rows * 3].
// In double, shards in order: every TP rank gets the same bits. Overwrites both; keep log_sum_exp for the backward.
void cross_entropy_combine(float* losses, float* log_sum_exp, const float* gathered_stats, int rows, int shards,
                           cudaStream_t stream);

// dlogits (rows, vocab_local) = scale * (exp(logits - log_sum_exp) - onehot(targets)), 0 in padded columns.
// OVERWRITES dlogits; dlogits may alias logits (each element is read, then written, by the same thread).
void cross_entropy_backward(__nv_bfloat16* dlogits, const __nv_bfloat16* logits, const float* log_sum_exp,
                            const int* targets, int rows, int vocab_start, int vocab_local, int valid_vocab,
                            float scale, cudaStream_t stream);

}  // namespace twin::kernels::cuda
