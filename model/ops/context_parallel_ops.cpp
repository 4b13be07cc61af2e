#include "model/ops/context_parallel_ops.hpp"

#include "model/ops/compute_ops.hpp"

namespace twin::model {
namespace {

// One rank's keys (or values): micro_batch x seq / cp tokens x kv_heads / tp heads x head_dim (CpAttention's
// kv_tensor_bytes).
double key_value_shard_bytes(const Shapes& x) {
  return x.e * x.tokens * x.kv_heads_local * x.head_dim;
}

Op context_collective(CollectiveKind kind, Payload payload, Phase phase, double bytes) {
  Op op = tensor_collective(kind, payload, ComputeKind::AttentionCore, phase, bytes);
  op.group = Group::Context;
  return op;
}

}  // namespace

// Transformer Engine's AttnFuncWithCPAndKVAllGather (attention/dot_product_attention/context_parallel.py):
// gather_along_first_dim(k), then (v), over the CP group, in the forward and again in the backward (the gathered
// sequence is not kept). Timed as blocking the attention core: TE overlaps only the two local chunks' attention with
// each other, not with the gathers. An all-gather's bytes are the gathered tensor's (cp shards).
void gather_context_keys_values(std::vector<Op>& ops, const Shapes& x, Phase phase) {
  if (x.cp <= 1) return;
  if (x.cp_comm == CpComm::AllToAll) return ulysses_to_heads(ops, x, phase);
  const double gathered = x.cp * key_value_shard_bytes(x);
  ops.push_back(context_collective(CollectiveKind::AllGather, Payload::ContextKeys, phase, gathered));
  ops.push_back(context_collective(CollectiveKind::AllGather, Payload::ContextValues, phase, gathered));
}

// reduce_scatter_along_first_dim(dk), then (dv): the whole sequence's gradients in, each rank's shard out. A
// reduce-scatter's bytes are its input (cp shards).
void scatter_context_key_value_grads(std::vector<Op>& ops, const Shapes& x) {
  if (x.cp <= 1) return;
  if (x.cp_comm == CpComm::AllToAll) return ulysses_grads_to_tokens(ops, x);
  const double whole = x.cp * key_value_shard_bytes(x);
  ops.push_back(context_collective(CollectiveKind::ReduceScatter, Payload::ContextKeyGrads, Phase::Backward, whole));
  ops.push_back(context_collective(CollectiveKind::ReduceScatter, Payload::ContextValueGrads, Phase::Backward, whole));
}

void return_context_output(std::vector<Op>& ops, const Shapes& x, Phase phase) {
  if (x.cp > 1 && x.cp_comm == CpComm::AllToAll) ulysses_output_to_tokens(ops, x, phase);
}

}  // namespace twin::model
