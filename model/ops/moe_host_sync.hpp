// The host synchronization of Megatron-Core's all-to-all token dispatcher, once per MoE layer and forward pass
// (megatron/core/transformer/moe/token_dispatcher.py, MoEAlltoAllTokenDispatcher). Dropless routing makes the split
// sizes of the dispatch all-to-all data on the GPU (tokens per expert, computed by the router), but NCCL's all-to-all
// and the grouped expert GEMMs take them as host integers: preprocess() computes the counts on the GPU,
// _maybe_dtoh_and_synchronize copies them to the host on a side stream at "before_permutation_1" (after the router and
// the counts' gather) and waits for that copy (event.synchronize) at the cuda_sync_point: "before_ep_alltoall" when
// ep or the expert TP is above 1, else "before_finish" (after the permutation), or "before_permutation_1" when a
// capacity factor makes the permuted size itself data. The host has then caught up with the GPU: the GPU runs out of
// queued work while the copy lands and the host returns from the wait, and the first kernel after it reaches the GPU
// one launch later. Only moe_pad_expert_input_to_capacity (model.pad_to_capacity: every size known on the host)
// skips it, and the counts' gather with it (model/ops/moe_ops.cpp). The backward needs no new sizes (the all-to-all's
// autograd reuses them): no sync there.
#pragma once

#include "model/ops/op.hpp"
#include "model/scenario/scenario.hpp"

namespace twin::model {

// The GPU commands the sync exposes, each costing the cost model's launch gap: the device-to-host copies
// (_maybe_dtoh_and_synchronize calls maybe_move_tensor_to_cpu, one non-blocking .to("cpu") each, on the dispatcher's
// side stream: tokens_per_expert always; input_splits, output_splits and output_splits_tp when ep or the expert TP is
// above 1, else None; num_global_tokens_per_local_expert only without permute fusion, which Megatron-Bridge's recipes
// turn on; num_out_tokens is a host integer in dropless routing: token_dispatcher.py at b0cc2706 lines 862-895) and
// the first kernel the host launches once it returns.
int expert_splits_sync_launches(const Scenario& s);

// Whether the sync comes before the token permutation (a capacity factor: the permuted size is data) rather than
// after it.
bool splits_sync_before_permutation(const Scenario& s);

// The sync as an op of phase `phase` (Forward or Recompute: a recomputed MoE layer dispatches again): a streaming
// op of expert_splits_sync_launches(s) launches whose bytes are the int64 counts the dispatcher copies (tokens per local
// expert; the input, output and expert-TP splits; the counts each EP and expert-TP peer sends each local expert).
Op expert_splits_sync(const Scenario& s, Phase phase);

// preprocess()'s gather of every member's tokens per expert over the expert-TP x EP group
// (gather_from_sequence_parallel_region over tp_ep_group, int64 counts, `experts` per member), from which the
// dispatcher derives the split sizes it then copies to the host; only when ep or the expert TP is above 1. `bytes`
// is the gathered buffer.
Op expert_counts_gather(const Scenario& s, Phase phase);

// Whether the host thread, having issued `op`, waits until the GPU has run it before it issues the ops after it (the
// sync above; a fused layer op whose last part is that sync): what an engine with a host model asks of the Program.
bool host_waits_for(const Op& op);

}  // namespace twin::model
