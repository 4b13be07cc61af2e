// The attention core under context parallelism (parallel.cp > 1): one class per way of framework.cp_comm, each holding
// what it keeps between ops (gathered or travelling keys and values, their gradients, the head groups' tensors):
//   all_gather  AllGatherAttention (all_gather_attention.hpp): Transformer Engine's AttnFuncWithCPAndKVAllGather
//   p2p         RingAttention (ring_attention.hpp): the ring of K/V blocks
//   a2a         UlyssesAttention (ulysses_attention.hpp): DeepSpeed-Ulysses, all-to-alls to and from head groups
// Each CP rank holds two chunks of every sequence (model::cp_sequence_chunk). A way reads the layer's qkv and writes
// its attention output and statistics (LayerStash::qkv, attn, attn_lse); its backward reads the output gradient and
// writes the qkv gradient (BackwardWork::d_attn, d_qkv). Everything else of the layer runs in the interpreter on the
// rank's chunks alone.
#pragma once

#include <memory>

#include "exec/interpreter/rank_context.hpp"
#include "model/ops/op.hpp"

namespace twin::exec {

class ContextAttention {
 public:
  virtual ~ContextAttention() = default;
  // The attention core of op's layer: forward or recompute, and backward.
  virtual void forward(const model::Op& op) = 0;
  virtual void backward(const model::Op& op) = 0;
  // One of the way's exchanges: a collective over the Context group, or a Send / Recv of the ring.
  virtual void exchange(const model::Op& op) = 0;
  // The layer's forward is done and its recompute mode keeps no attention core output: what the way kept of it for
  // the backward goes (its recompute rebuilds it).
  virtual void drop_forward(const StashKey& key) = 0;
  // A new iteration, or the end of a (micro-batch, chunk): the state kept for it goes.
  virtual void begin_iteration() = 0;
  virtual void release(int micro_batch, int chunk) = 0;
};

// The way framework.cp_comm names, for parallel.cp > 1.
std::unique_ptr<ContextAttention> make_context_attention(RankContext& ctx);

// The context kernels' view of the rank's attention: its heads, and the whole sequence of which it holds two chunks.
ContextShape context_shape(const Dims& dims);

// The learned position embedding of this rank's tokens (its two chunks of each sequence): x += wpe, or the backward's
// dwpe += x.
void context_position_embedding(RankContext& ctx, const Tensor& x, bool backward);

}  // namespace twin::exec
