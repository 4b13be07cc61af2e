// Context parallelism's a2a way (framework.cp_comm = "a2a", DeepSpeed-Ulysses: Jacobs et al. 2023, arXiv:2309.14509)
// as Transformer Engine's AttnFuncWithCPAndQKVOA2A runs it (attention/dot_product_attention/context_parallel.py):
//
//   forward, recompute   A2A q, A2A k, A2A v (tokens -> heads)  ->  attention core over the whole sequence for
//                        heads / (tp cp) heads  ->  A2A out (heads -> tokens)
//   backward             A2A dout (tokens -> heads)  ->  attention core backward  ->  A2A dq, A2A dk, A2A dv
//                        (heads -> tokens)
//
// TE issues one flash_attn_a2a_communicate per tensor, on the compute stream before and after the attention kernel:
// nothing overlaps them, so each is a blocking collective of the Context group. A selective recompute reruns the whole
// checkpointed attention, its all-to-alls included. An all-to-all's bytes are the rank's whole input tensor, of which
// (cp - 1) / cp leaves the rank (CpTraffic's count, sim/all_to_all.cpp's split).
#include "model/ops/compute_ops.hpp"
#include "model/ops/context_parallel_ops.hpp"

namespace twin::model {
namespace {

// One rank's queries (or output, or their gradients): micro_batch x seq / cp tokens x heads / tp x head_dim
// (CpAttention's q_tensor_bytes).
double query_bytes(const Shapes& x) {
  return x.e * x.tokens * x.heads_local * x.head_dim;
}

// One rank's keys (or values, or their gradients): kv_heads / tp heads (CpAttention's kv_tensor_bytes).
double key_value_bytes(const Shapes& x) {
  return x.e * x.tokens * x.kv_heads_local * x.head_dim;
}

Op ulysses_all_to_all(Payload payload, Phase phase, double bytes) {
  Op op = tensor_collective(CollectiveKind::AllToAll, payload, ComputeKind::AttentionCore, phase, bytes);
  op.group = Group::Context;
  return op;
}

}  // namespace

void ulysses_to_heads(std::vector<Op>& ops, const Shapes& x, Phase phase) {
  if (phase == Phase::Backward) {
    ops.push_back(ulysses_all_to_all(Payload::UlyssesOutputGrad, phase, query_bytes(x)));
    return;
  }
  ops.push_back(ulysses_all_to_all(Payload::UlyssesQueries, phase, query_bytes(x)));
  ops.push_back(ulysses_all_to_all(Payload::UlyssesKeys, phase, key_value_bytes(x)));
  ops.push_back(ulysses_all_to_all(Payload::UlyssesValues, phase, key_value_bytes(x)));
}

void ulysses_output_to_tokens(std::vector<Op>& ops, const Shapes& x, Phase phase) {
  ops.push_back(ulysses_all_to_all(Payload::UlyssesOutput, phase, query_bytes(x)));
}

void ulysses_grads_to_tokens(std::vector<Op>& ops, const Shapes& x) {
  ops.push_back(ulysses_all_to_all(Payload::UlyssesQueryGrads, Phase::Backward, query_bytes(x)));
  ops.push_back(ulysses_all_to_all(Payload::UlyssesKeyGrads, Phase::Backward, key_value_bytes(x)));
  ops.push_back(ulysses_all_to_all(Payload::UlyssesValueGrads, Phase::Backward, key_value_bytes(x)));
}

Shapes ulysses_core_shapes(const Shapes& x) {
  Shapes core = x;
  core.tokens = x.tokens * x.cp;
  core.seq_local = x.seq;
  core.heads_local = x.heads_local / x.cp;
  core.kv_heads_local = x.kv_heads_local / x.cp;
  core.qkv_local = x.qkv_local / x.cp;
  core.cp = 1;
  return core;
}

}  // namespace twin::model
