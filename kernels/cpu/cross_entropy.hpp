// Vocab-parallel cross-entropy (Megatron's VocabParallelCrossEntropy). Logits are sharded by columns: a TP rank holds
// columns [vocab_start, vocab_start + vocab_local) of the padded vocabulary. Columns whose global index is
// >= valid_vocab are padding (the vocabulary is padded to a multiple of 128 * tp) and count as -inf: the loss and its
// gradient do not depend on the padding.
//   loss[r] = log(sum_v exp(x[r, v])) - x[r, target[r]]
// in three steps, with one collective (done by the executor) between (1) and (2):
//   (1) cross_entropy_local_stats      each shard: per row (local max, sum of exp(x - local max), target logit or 0)
//       all-gather the (rows, 3) stats over the TP group -> (shards, rows, 3)
//   (2) cross_entropy_combine          every shard: global max, global sum, lse and loss per row
//   (3) cross_entropy_backward         each shard: its columns of dlogits = scale * (softmax - onehot)
// With one shard (no TP), step (2) takes the stats of step (1) with shards = 1.
#pragma once

namespace twin::kernels::cpu {

// Columns of one row of stats: (local max, local sum of exp(x - local max), target logit if local else 0).
inline constexpr int kCrossEntropyStats = 3;

// stats (rows, 3) <- logits (rows, vocab_local), targets (rows) in [0, valid_vocab)
// A shard with no valid column writes (-inf, 0, 0). Overwrites stats.
void cross_entropy_local_stats(float* stats, const float* logits, const int* targets, int rows, int vocab_start,
                               int vocab_local, int valid_vocab);

// losses (rows), log_sum_exp (rows) <- gathered_stats (shards, rows, 3), shard s's stats at [s * rows * 3]
//   max = max_s max_s,  sum = sum_s sum_s exp(max_s - max),  lse = max + log(sum),  loss = lse - sum_s target_s
// (exactly one shard holds each target). Computed in double, in shard order: every TP rank gets the same bits.
// Overwrites both outputs; keep log_sum_exp for the backward.
void cross_entropy_combine(float* losses, float* log_sum_exp, const float* gathered_stats, int rows, int shards);

// dlogits (rows, vocab_local) = scale * (exp(logits - log_sum_exp) - onehot(targets)), 0 in padded columns.
// scale is dL/dloss[r], e.g. 1 / (rows * micro-batches) for a mean over tokens and gradient accumulation steps.
// OVERWRITES dlogits; dlogits may alias logits (the logits are then consumed).
void cross_entropy_backward(float* dlogits, const float* logits, const float* log_sum_exp, const int* targets, int rows,
                            int vocab_start, int vocab_local, int valid_vocab, float scale);

}  // namespace twin::kernels::cpu
