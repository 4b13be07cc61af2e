// framework.moe_a2a_overlap: Megatron-Core's overlap_moe_expert_parallel_comm (--overlap-moe-expert-parallel-comm;
// Megatron-Bridge's moe_a2a_overlap), its "combined 1F1B" (megatron/core/pipeline_parallel/combined_1f1b.py,
// models/common/model_chunk_schedule_plan.py, models/gpt/fine_grained_callables.py at b0cc2706).
//
// Each steady-state 1F1B step merges one micro-batch's forward with another's backward, layer by layer: forward layer
// i with backward layer n-1-i of the two chunks (the rest alone). A layer is Megatron-Core's schedule nodes:
//   attention  attention, pre-MLP layer norm, shared experts, router, dispatch preprocess (permutation)
//   dispatch   the host's wait for the split sizes and the dispatch all-to-all (then the probabilities' one)
//   mlp        the experts (with the expert-TP gather and reduce-scatter)
//   combine    the combine all-to-all, then unpermute and the residual add
// (a dense layer: attention and mlp, split at the pre-MLP layer norm). Per merged pair
// (TransformerLayerSchedulePlan.run), Megatron-Core's streams:
//   communication: combine_bwd(B) | dispatch_fwd(F) -> dispatch_bwd(B)  | combine_fwd(F)
//   computation:   attn_fwd(F)    | mlp_bwd(B)      -> mlp_fwd(F)       | attn_bwd(B)
// and a node waits for the node before it of its own micro-batch (one CUDA event per micro-batch), so each
// micro-batch's all-to-alls run under the other one's compute. twin puts the all-to-alls (and the host wait before the
// dispatch's) on Stream::Expert and keeps every kernel on the compute stream: the combine's unpermute and residual add,
// which Megatron-Core launches on its communication stream beside the other micro-batch's attention, run after that
// attention (the simulator has no two kernels share the SMs, so two streams of kernels would both run at full speed).
// A step with only a forward or a backward (warm-up and cool-down) runs the same nodes one after the other.
#pragma once

#include <array>
#include <cstddef>
#include <vector>

#include "model/ops/op.hpp"
#include "model/plan/schedule.hpp"
#include "model/scenario/scenario.hpp"

namespace twin::model {

// CombineTail: the forward combine's compute after its all-to-all (the backward's comes before it, in Combine).
enum class LayerNode : std::uint8_t { Attention, Dispatch, Mlp, Combine, CombineTail };
inline constexpr std::size_t kLayerNodeCount = 5;

// One layer's ops in one phase, split into its nodes (indexed by LayerNode; a dense layer's dispatch and combine
// empty). A node's ops keep the layer's order; their deps are indices into the node's own list, or -1 for "the op
// before the node" (the node before it of the same micro-batch). The all-to-alls and the dispatch's host wait are on
// Stream::Expert. Concatenated in the order the phase runs them (forward: attention, dispatch, mlp, combine, combine
// tail; backward: combine, mlp, dispatch, attention) they are the layer's ops.
using LayerNodes = std::array<std::vector<Op>, kLayerNodeCount>;
LayerNodes split_layer_nodes(const std::vector<Op>& layer_ops, Phase phase);

// The forwards the combined 1F1B adds to the schedule's warm-up (schedule.hpp): 1 with the overlap, else 0.
int combined_extra_warmup(const Scenario& s);

// The steps of stage `stage`'s schedule the combined 1F1B merges with the backward after them (true at the forward):
// the steady state's pairs, forward warmup + k with backward k, with the overlap and without FSDP; none otherwise. The
// Program merges these (stage_builder.cpp) and the memory estimate counts their layers as they run (estimates.cpp).
std::vector<bool> combined_pair_forwards(const Scenario& s, const StageSchedule& schedule, int stage);

// Whether DualPipeV's F&B pairs (PipelineStep::overlapped, steps 4 and 5) run merged layer by layer into these nodes,
// as the combined 1F1B's pairs do: where the model has expert all-to-alls to hide (an MoE model at ep > 1).
// DeepSeek's DualPipeV (deepseek-ai/DualPipe at 3da1bbe, dualpipev.py, _forward_backward_compute_chunk) calls the
// module's overlapped_forward_backward when the model provides one and otherwise runs the forward, then the backward:
// a dense model has no communication of its own for the pair to hide, and twin runs its pairs one after the other.
bool overlaps_pairs(const Scenario& s);

}  // namespace twin::model
