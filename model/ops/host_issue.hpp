// What the framework's host thread does around the ops it issues, for an engine with a host model
// (cluster.host_us_per_kernel): where it stops to wait for the GPU, and which ops a CUDA graph issues for it.
//
// Waits (host_waits_for):
// - the MoE dispatcher's split-size sync (model/ops/moe_host_sync.hpp);
// - Megatron-Core's pipeline exchanges outside the interleaved schedule: P2PCommunicator._communicate batches each
//   step's sends and receives into one torch.distributed.batch_isend_irecv and, with ModelParallelConfig's
//   batch_p2p_sync = True (its default), calls torch.cuda.synchronize() after waiting for them
//   (megatron/core/pipeline_parallel/p2p_communication.py). megatron/training/arguments.py sets batch_p2p_comm = not
//   overlap_p2p_comm, and overlap_p2p_comm is on only with virtual pipeline stages: the interleaved schedule posts
//   its exchanges unbatched, with no synchronize.
// The end of an iteration is a wait too (the loss and the gradient norm reach the host as Python floats), which is
// why an engine starts each iteration with the host and the GPU together.
//
// CUDA graphs (framework.cuda_graphs, cuda_graph_captures): a captured op is issued by its layer's graph launch, one
// host call per layer, micro-batch and pass (torch.cuda.CUDAGraph.replay(): one cudaGraphLaunch), not by its own
// launches. A graph holds what has static shapes: a layer's compute and its tensor- and context-parallel
// communication; with dropless routing (model.capacity_factor = 0) an MoE layer's token counts are data, so the
// permutation, the dispatch and combine all-to-alls, the experts and the unpermutation (and the host's wait before
// them) stay outside, as Megatron-Core's partial scopes (--cuda-graph-scope attn, moe_router, moe_preprocess) keep
// them. Pipeline exchanges, data-parallel gradient and parameter collectives and the optimizer run outside graphs.
#pragma once

#include "model/ops/op.hpp"
#include "model/scenario/scenario.hpp"

namespace twin::model {

// Whether the host thread, having issued `op`, waits until the GPU has run it before it issues the ops after it.
bool host_waits_for(const Scenario& s, const Op& op);

// Whether a CUDA graph issues `op` (an op-granularity op, or one part of a fused layer op) under
// framework.cuda_graphs; always false without it.
bool cuda_graph_captures(const Scenario& s, const Op& op);

// The graph an op captured by a graph belongs to: one per layer, micro-batch and pass. Two captured ops with the
// same key are issued by one graph launch.
struct CudaGraphKey {
  std::int32_t layer = -1;
  std::int32_t micro_batch = -1;
  Phase phase = Phase::Forward;
  bool operator==(const CudaGraphKey&) const = default;
};
CudaGraphKey cuda_graph_key(const Op& op);

// The Transformer Engine module whose call issues an op, under framework.transformer_engine, as Megatron-Core's TE
// layer specs build a layer (megatron/core/models/gpt/gpt_layer_specs.py, get_gpt_layer_with_transformer_engine_spec;
// the MoE experts as TEGroupedMLP, megatron/core/transformer/moe/experts.py):
// - LayerNormLinear: TELayerNormColumnParallelLinear, the QKV projection and a dense MLP's up-projection, each with
//   the layer norm before it fused in (that norm's op is FusedIntoModule: the module's call issues its kernels);
// - Linear: TERowParallelLinear, the attention projection and a dense MLP's down-projection; a shared expert's two
//   linear layers (TEColumnParallelLinear and TERowParallelLinear, no norm fused: an MoE layer's norm is a TENorm);
// - GroupedLinear: TEColumnParallelGroupedLinear and TERowParallelGroupedLinear, the local experts' up and down
//   projections, one call for every expert;
// - None: the rest (attention core, norms outside a module, activations, residuals, the router and permutation, the
//   embedding and head, the optimizer, collectives): issued kernel by kernel.
// The forward and a recompute call the module's forward, the backward its backward; a zero-bubble schedule's deferred
// weight gradient (Phase::WeightGrad) is issued kernel by kernel. None without framework.transformer_engine.
enum class TeModule : std::uint8_t { None, FusedIntoModule, LayerNormLinear, Linear, GroupedLinear };
TeModule te_module(const Scenario& s, const Op& op);

}  // namespace twin::model
