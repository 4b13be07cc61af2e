// Context parallelism's attention on the CPU, built on flash_attention.hpp's block functions: each of `cp` ranks
// holds 1/cp of every sequence, and the ranks exchange what attention needs across them. Three ways, as
// Megatron-Core's --cp-comm-type names them (megatron/core/transformer/dot_product_attention and Transformer
// Engine's attention/dot_product_attention/context_parallel.py):
//
//   p2p         ring attention: cp steps; at step i a rank attends its queries to the keys/values of rank
//               (rank - i) mod cp, which arrive around the ring while the step before computes; the outputs of the
//               steps merge by their log-sum-exp. The backward runs the same steps, and each block's dK/dV travels
//               on around the ring back to its owner.
//   all_gather  every rank all-gathers the whole sequence's keys/values, attends its queries to what they can see,
//               and reduce-scatters their gradients in the backward.
//   a2a         DeepSpeed-Ulysses (Jacobs et al. 2023, arXiv:2309.14509): an all-to-all turns "1/cp of the tokens,
//               all heads" into "all tokens, 1/cp of the heads", attention runs whole on those heads, and a second
//               all-to-all turns the output back.
//
// The sequence split (causal load balance, Megatron-Core's get_batch_on_this_cp_rank): the sequence is cut into
// 2 cp chunks of seq / (2 cp) tokens; rank r holds chunk r then chunk 2 cp - 1 - r, so that under the causal mask
// every rank has the same work (an early chunk sees little, a late one much). A rank's "local" tensors are its
// seq / cp tokens in that order.
//
// Layouts (row-major; D = head_dim, H = heads, KV = kv_heads, L = seq / cp local tokens, C = seq / (2 cp)):
//   qkv_local  (batch, L, (H + 2 KV) D)   attention.hpp's packed layout, of this rank's tokens
//   kv block   (batch, L, 2 KV D)         one rank's keys then values: what the ring moves
//   out_local  (batch, L, H D)
//   lse, delta (2, batch, H, C)           per local chunk (the first, then the second)
#pragma once

#include <cstddef>
#include <vector>

namespace twin::kernels::cpu {

struct ContextParallelShape {
  int batch = 1, seq = 0, heads = 1, kv_heads = 1, head_dim = 1;
  int cp = 1;                           // ranks sharing each sequence; seq % (2 cp) == 0
  const float* alibi_slopes = nullptr;  // (heads): slopes of every head, or nullptr
  int local_len() const { return seq / cp; }
  int chunk_len() const { return seq / (2 * cp); }
};

// The chunk (0 .. 2 cp - 1) rank `rank` holds as its local chunk `part` (0 or 1): rank, then 2 cp - 1 - rank.
int cp_chunk_of(int rank, int part, int cp);

// local (batch, seq / cp, width) <- the rows of full (batch, seq, width) that rank `rank` holds, in local order.
void cp_take_local(float* local, const float* full, int batch, int seq, int width, int cp, int rank);
// The inverse: writes rank `rank`'s local rows into their places of full (the other rows are left as they are).
void cp_put_local(float* full, const float* local, int batch, int seq, int width, int cp, int rank);

// kv (batch, len, 2 KV D) <- the keys and values of qkv (batch, len, (H + 2 KV) D).
void cp_pack_kv(float* kv, const float* qkv, int batch, int len, int heads, int kv_heads, int head_dim);
// dqkv's key and value parts += dkv (batch, len, 2 KV D): a block's gradients back into the packed layout.
void cp_add_kv_gradient(float* dqkv, const float* dkv, int batch, int len, int heads, int kv_heads, int head_dim);

// --- p2p (ring) ---
// One ring step: rank `rank`'s queries (qkv_local) against the keys/values of rank `source` (kv_source), merged into
// out_local and lse by log-sum-exp. On the first step (source == rank) out_local and lse are OVERWRITTEN; chunk pairs
// the causal mask hides wholly are skipped.
void ring_attention_forward_step(float* out_local, float* lse, const float* qkv_local, const float* kv_source, int rank,
                                 int source, const ContextParallelShape& shape);
// delta (2, batch, H, C) = rowsum(dout * out) of each local chunk, from the final out_local.
void ring_attention_delta(float* delta, const float* dout_local, const float* out_local,
                          const ContextParallelShape& shape);
// The backward of one ring step, ACCUMULATED: dq_local (batch, L, H D) += and dkv_source (batch, L, 2 KV D) += the
// gradients of that step's block pairs, given the final lse and delta of this rank's queries.
void ring_attention_backward_step(float* dq_local, float* dkv_source, const float* dout_local, const float* qkv_local,
                                  const float* kv_source, const float* lse, const float* delta, int rank, int source,
                                  const ContextParallelShape& shape);
// Elements of one rank's kv block: what each ring step sends, batch x L x 2 KV D.
std::size_t cp_kv_block_elements(const ContextParallelShape& shape);

// --- all_gather ---
// out_local, lse (OVERWRITTEN) <- rank `rank`'s queries against kv_full (batch, seq, 2 KV D), the whole sequence's
// keys and values in sequence order (every rank's kv block, put back with cp_put_local).
void all_gather_attention_forward(float* out_local, float* lse, const float* qkv_local, const float* kv_full, int rank,
                                  const ContextParallelShape& shape);
// dq_local (batch, L, H D) += and dkv_full (batch, seq, 2 KV D) += this rank's share (to be reduce-scattered).
void all_gather_attention_backward(float* dq_local, float* dkv_full, const float* dout_local, const float* qkv_local,
                                   const float* kv_full, const float* lse, const float* delta, int rank,
                                   const ContextParallelShape& shape);

// --- a2a (Ulysses) ---
// A token row made of sections of heads (qkv: H, KV, KV; out: H), each cut into cp groups of its heads / cp heads:
// send (cp, batch, L, row / cp) <- local (batch, L, row): block d holds head group d of every section (for rank d).
void ulysses_split_heads(float* send, const float* local, int batch, int len, const std::vector<int>& section_heads,
                         int head_dim, int cp);
// The inverse: local (batch, L, row) <- recv (cp, batch, L, row / cp), block d being head group d.
void ulysses_join_heads(float* local, const float* recv, int batch, int len, const std::vector<int>& section_heads,
                        int head_dim, int cp);
// full (batch, seq, width) <- blocks (cp, batch, L, width), block s being rank s's local tokens (its two chunks).
void cp_blocks_to_sequence(float* full, const float* blocks, int batch, int seq, int width, int cp);
// The inverse: blocks (cp, batch, L, width) <- full (batch, seq, width).
void cp_sequence_to_blocks(float* blocks, const float* full, int batch, int seq, int width, int cp);

}  // namespace twin::kernels::cpu
