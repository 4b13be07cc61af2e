// Context parallelism (CP): `cp` ranks share each sequence, each holding seq / cp of its tokens (two chunks of
// seq / (2 cp): rank r the r-th and the (2 cp - 1 - r)-th, so that the causal mask gives every rank the same work;
// Megatron-Core's get_batch_on_this_cp_rank). Everything but the attention core is per token and needs no exchange;
// the attention core exchanges keys and values across the CP group in one of three ways (framework.cp_comm, Megatron-
// Core's --cp-comm-type), as Transformer Engine's attention/dot_product_attention/context_parallel.py runs them:
//
//   p2p         ring attention (AttnFuncWithCPAndKVP2P): cp steps; step i computes the local queries against the
//               keys/values of rank - i while the next block travels one hop (send to rank + 1, receive from
//               rank - 1). Forward: cp - 1 K/V blocks sent. Backward: the K/V blocks go around again (steps 0 .. cp-2)
//               and each block's dK/dV follows one step behind, in the same dtype, cp - 1 hops back to its owner:
//               2 (cp - 1) blocks (model/ops/context_parallel_ring.hpp has the messages).
//   all_gather  (AttnFuncWithCPAndKVAllGather; the Llama 3 paper's, section 3.3.2): all-gather K and all-gather V
//               before the forward; in the backward K and V again, then reduce-scatter dK and dV.
//   a2a         DeepSpeed-Ulysses (AttnFuncWithCPAndQKVOA2A): all-to-all Q, K and V (tokens -> heads), one of the
//               output back; backward the output's gradient, then dQ, dK and dV.
//
// A K/V block is one rank's keys or values: micro_batch x seq / cp tokens x kv_heads / tp heads x head_dim, in the
// model dtype (with TP each rank holds kv_heads / tp key/value heads and exchanges only those).
// Gradients of everything outside attention reduce over DP x CP (the "dp-cp" group): each CP rank saw a different
// part of the same sequences.
#pragma once

#include <cstdint>

#include "model/scenario/cp_comm.hpp"

namespace twin::model {

// One transformer layer's attention as a CP rank sees it.
struct CpAttention {
  std::int64_t micro_batch = 1, seq = 0;  // the whole sequence
  std::int64_t heads = 1, kv_heads = 1, head_dim = 1;
  std::int64_t tp = 1, cp = 1;
  int element_bytes = 2;
  std::int64_t local_tokens() const { return seq / cp; }
  // Bytes of this rank's keys (or of its values): micro_batch x seq / cp x kv_heads / tp x head_dim x element.
  double kv_tensor_bytes() const;
  // Bytes of this rank's queries (or of its output): heads / tp instead of kv_heads / tp.
  double q_tensor_bytes() const;
};

// What one CP rank sends for one layer's attention in one micro-batch, by kind of exchange (0 when cp == 1).
struct CpTraffic {
  int point_to_point = 0;  // p2p: ring messages sent (each rank also receives as many)
  double point_to_point_bytes = 0;
  int all_gathers = 0;  // collectives over the CP group
  int reduce_scatters = 0;
  int all_to_alls = 0;
  // Bytes each rank puts into those collectives, summed: its shard for an all-gather, its whole input (cp shards)
  // for a reduce-scatter, its whole local tensor for an all-to-all (of which (cp - 1) / cp leaves the rank).
  double collective_input_bytes = 0;
};
CpTraffic cp_forward_traffic(const CpAttention& attention, CpComm comm);
CpTraffic cp_backward_traffic(const CpAttention& attention, CpComm comm);

// The chunk of the sequence (0 .. 2 cp - 1, each seq / (2 cp) tokens) that CP rank `cp_rank` holds as its local chunk
// `part` (0 or 1): chunk cp_rank, then chunk 2 cp - 1 - cp_rank (Megatron-Core's get_batch_on_this_cp_rank). A rank's
// tokens are its two chunks of every sequence, in that order.
int cp_sequence_chunk(int cp_rank, int part, int cp);

// Query-key pairs one CP rank's queries attend to under the causal mask: the whole sequence's s (s + 1) / 2 per head
// and sequence, split evenly over the cp ranks by the 2 cp chunk layout (each rank: c (c + 1) + 2 c^2 (cp - 1) + c^2
// pairs with c = seq / (2 cp)).
double cp_causal_pairs_per_rank(std::int64_t seq, std::int64_t cp);

}  // namespace twin::model
