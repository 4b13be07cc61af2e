// ContextKernels: the context-parallel attention kernels a backend may provide (Backend::context()), all three ways
// (all_gather, p2p ring, a2a), apart from the dense core. A backend without them trains no parallel.cp > 1 plan:
// check_supported (exec/train/check_supported.hpp) refuses it by name before training. As Backend, the public methods
// check shapes and the layout (context_kernels.cpp) and call the protected do_ kernels.
#pragma once

#include "exec/core/kernel_hook.hpp"
#include "exec/core/tensor.hpp"

namespace twin::exec {

// A context-parallel rank's attention (model/ops/context_parallel.hpp, kernels/cpu/ring_attention.hpp): `cp` ranks
// share each of the `batch` sequences of `seq` tokens; rank `cp_rank` holds two chunks of seq / (2 cp) tokens of each
// (model::cp_sequence_chunk), L = seq / cp local tokens in that order. H, KV: the rank's query and key/value heads.
struct ContextShape {
  int batch = 1, seq = 0, heads = 1, kv_heads = 1, head_dim = 1;
  int cp = 1, cp_rank = 0;
};

class ContextKernels : public HookPoint {
 public:
  virtual ~ContextKernels() = default;

  // --- context parallelism, the all_gather way (kernels/cpu/ring_attention.hpp) -----------------------------------
  // qkv (B, L, (H + 2 KV) D): rotate q and k in place by their tokens' positions in the whole sequence; the backward
  // rotates dq and dk back
  void context_rope_forward(const Tensor& qkv, const ContextShape& shape, int rotary_dim);
  void context_rope_backward(const Tensor& dqkv, const ContextShape& shape, int rotary_dim);
  // keys, values (B, L, KV D) <- the key and value parts of this rank's qkv (what the all-gathers send)
  void context_split_keys_values(const Tensor& keys, const Tensor& values, const Tensor& qkv,
                                 const ContextShape& shape);
  // out (B, L, H D), lse (2, B, H, C) fp32 (per local chunk), OVERWRITTEN <- this rank's qkv against every CP rank's
  // keys and values (cp, B, L, KV D) in rank order (the all-gathers' output), causal by position in the sequence
  void context_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, const Tensor& keys,
                                 const Tensor& values, const ContextShape& shape);
  // dqkv (B, L, (H + 2 KV) D) OVERWRITTEN: dq, and zeros where the key and value gradients go; dkeys, dvalues
  // (cp, B, L, KV D) OVERWRITTEN: this rank's share of every rank's key and value gradients (to be reduce-scattered)
  // <- dout (B, L, H D), qkv, keys, values, and the forward's out and lse
  void context_attention_backward(const Tensor& dqkv, const Tensor& dkeys, const Tensor& dvalues, const Tensor& dout,
                                  const Tensor& qkv, const Tensor& keys, const Tensor& values, const Tensor& out,
                                  const Tensor& lse, const ContextShape& shape);
  // dqkv's key part (values: its value part) = grad (B, L, KV D): the reduce-scattered gradient of this rank's keys
  void context_put_key_value_grad(const Tensor& dqkv, const Tensor& grad, bool values, const ContextShape& shape);

  // --- context parallelism, the p2p ring (kernels/cpu/ring_attention.hpp's ring steps) -----------------------------
  // A K/V block (B, L, 2 KV D): one rank's keys then values per token, what the ring moves.
  // kv <- the key and value parts of this rank's qkv (B, L, (H + 2 KV) D)
  void context_ring_pack_kv(const Tensor& kv, const Tensor& qkv, const ContextShape& shape);
  // out (B, L, H D), lse (2, B, H, C) <- merged with this rank's queries against CP rank `source`'s block kv
  // (OVERWRITTEN when source is this rank: the first step)
  void context_ring_forward_step(const Tensor& out, const Tensor& lse, const Tensor& qkv, const Tensor& kv, int source,
                                 const ContextShape& shape);
  // delta (2, B, H, C) fp32 <- rowsum(dout * out) of each local chunk
  void context_ring_delta(const Tensor& delta, const Tensor& dout, const Tensor& out, const ContextShape& shape);
  // dq (B, L, H D) += and dkv (B, L, 2 KV D) += the gradients of one step's block pairs (source's block kv)
  void context_ring_backward_step(const Tensor& dq, const Tensor& dkv, const Tensor& dout, const Tensor& qkv,
                                  const Tensor& kv, const Tensor& lse, const Tensor& delta, int source,
                                  const ContextShape& shape);
  // dqkv (B, L, (H + 2 KV) D) OVERWRITTEN <- dq in its query part, dkv (this rank's own block's) in the rest
  void context_ring_put_grads(const Tensor& dqkv, const Tensor& dq, const Tensor& dkv, const ContextShape& shape);
  // --- context parallelism, the a2a way (DeepSpeed-Ulysses; exec/interpreter/context_a2a.cpp) ----------------------
  // A column range of a token-major tensor cut into the CP group's all-to-all blocks and back. L = seq / cp local
  // tokens (the rank's two chunks of each sequence), shape.seq the whole sequence; `heads` the range's heads of this
  // TP rank, `column` its first element of a row of `width`.
  // send (cp, B, L, heads / cp D) <- the range of local (B, L, width): block d is head group d (for CP rank d)
  void ulysses_split_heads(const Tensor& send, const Tensor& local, int width, int column, int heads,
                           const ContextShape& shape);
  // The range of local (B, L, width) <- recv (cp, B, L, heads / cp D), block d being head group d
  void ulysses_join_heads(const Tensor& local, const Tensor& recv, int width, int column, int heads,
                          const ContextShape& shape);
  // The range of full (B, seq, width), in sequence order <- blocks (cp, B, L, heads D), block r being CP rank r's
  // tokens
  void ulysses_blocks_to_sequence(const Tensor& full, const Tensor& blocks, int width, int column, int heads,
                                  const ContextShape& shape);
  // blocks (cp, B, L, heads D) <- the range of full (B, seq, width): block r is CP rank r's tokens
  void ulysses_sequence_to_blocks(const Tensor& blocks, const Tensor& full, int width, int column, int heads,
                                  const ContextShape& shape);

 protected:
  virtual void do_context_rope_forward(const Tensor& qkv, const ContextShape& shape, int rotary_dim) = 0;
  virtual void do_context_rope_backward(const Tensor& dqkv, const ContextShape& shape, int rotary_dim) = 0;
  virtual void do_context_split_keys_values(const Tensor& keys, const Tensor& values, const Tensor& qkv,
                                            const ContextShape& shape) = 0;
  virtual void do_context_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, const Tensor& keys,
                                            const Tensor& values, const ContextShape& shape) = 0;
  virtual void do_context_attention_backward(const Tensor& dqkv, const Tensor& dkeys, const Tensor& dvalues,
                                             const Tensor& dout, const Tensor& qkv, const Tensor& keys,
                                             const Tensor& values, const Tensor& out, const Tensor& lse,
                                             const ContextShape& shape) = 0;
  virtual void do_context_put_key_value_grad(const Tensor& dqkv, const Tensor& grad, bool values,
                                             const ContextShape& shape) = 0;
  virtual void do_context_ring_pack_kv(const Tensor& kv, const Tensor& qkv, const ContextShape& shape) = 0;
  virtual void do_context_ring_forward_step(const Tensor& out, const Tensor& lse, const Tensor& qkv, const Tensor& kv,
                                            int source, const ContextShape& shape) = 0;
  virtual void do_context_ring_delta(const Tensor& delta, const Tensor& dout, const Tensor& out,
                                     const ContextShape& shape) = 0;
  virtual void do_context_ring_backward_step(const Tensor& dq, const Tensor& dkv, const Tensor& dout, const Tensor& qkv,
                                             const Tensor& kv, const Tensor& lse, const Tensor& delta, int source,
                                             const ContextShape& shape) = 0;
  virtual void do_context_ring_put_grads(const Tensor& dqkv, const Tensor& dq, const Tensor& dkv,
                                         const ContextShape& shape) = 0;
  virtual void do_ulysses_split_heads(const Tensor& send, const Tensor& local, int width, int column, int heads,
                                      const ContextShape& shape) = 0;
  virtual void do_ulysses_join_heads(const Tensor& local, const Tensor& recv, int width, int column, int heads,
                                     const ContextShape& shape) = 0;
  virtual void do_ulysses_blocks_to_sequence(const Tensor& full, const Tensor& blocks, int width, int column, int heads,
                                             const ContextShape& shape) = 0;
  virtual void do_ulysses_sequence_to_blocks(const Tensor& blocks, const Tensor& full, int width, int column, int heads,
                                             const ContextShape& shape) = 0;
};

}  // namespace twin::exec
