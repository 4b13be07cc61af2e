// framework.moe_a2a_overlap: Megatron-Core's combined 1F1B step (model/program/moe_a2a_overlap.hpp), as
// TransformerModelChunkSchedulePlan.run orders it (models/common/model_chunk_schedule_plan.py at b0cc2706):
//   forward: Recv, embedding        backward: Recv, head backward
//   layer pairs (forward i with backward n-1-i), then the backward's other layers, then the forward's
//   forward: Send or head forward   backward: embedding backward or Send
#include <algorithm>
#include <utility>

#include "model/ops/layer_ops.hpp"
#include "model/program/estimates.hpp"
#include "model/program/stage_builder.hpp"

namespace twin::model {

namespace {

// `layer` granularity: a node's compute fused into one op (layer_ops.hpp fuse_layer), after the collectives that open
// it (the combine's all-to-all) and before the others; a node without compute stays as it is.
std::vector<Op> fuse_node(const std::vector<Op>& node) {
  const auto compute = [](const Op& op) { return op.kind == OpKind::Compute; };
  const auto first = std::find_if(node.begin(), node.end(), compute);
  if (first == node.end()) return node;
  std::vector<Op> out(node.begin(), first);  // an opening all-to-all has no deps
  const auto lead = static_cast<std::int32_t>(out.size());
  std::vector<Op> rest(first, node.end());
  for (Op& op : rest) {
    for (std::int32_t& dep : op.deps) dep = dep >= lead ? dep - lead : -1;
  }
  const Stream stream = first->stream;  // a node's kernels share one stream
  for (Op& op : fuse_layer(rest)) {
    for (std::int32_t& dep : op.deps) dep = dep >= 0 ? dep + lead : -1;
    if (op.kind == OpKind::Compute) op.stream = stream;
    out.push_back(std::move(op));
  }
  return out;
}

}  // namespace

const LayerNodes& StageBuilder::nodes_of(int layer, Phase phase) {
  auto [it, created] = layer_nodes_.try_emplace({layer, phase});
  if (created) {
    it->second = split_layer_nodes(layer_ops(s_, layer, phase), phase);
    if (granularity_ == Granularity::Layer) {
      for (std::vector<Op>& node : it->second) node = fuse_node(node);
    }
  }
  return it->second;
}

// A node's ops after the chain's latest: the first waits for it (and for the Recv not yet taken), deps inside the
// node point at their copies, those before it (-1) at the chain's latest.
void StageBuilder::emit_node(const std::vector<Op>& ops, const PipelineStep& step, Chain& chain) {
  const int base = static_cast<int>(ops_.size());
  for (std::size_t k = 0; k < ops.size(); ++k) {
    Op op = ops[k];
    for (std::int32_t& dep : op.deps) dep = dep >= 0 ? base + dep : chain.last;
    if (k == 0) {
      op.deps.push_back(chain.last);
      op.deps.push_back(chain.wait);
      chain.wait = -1;
    }
    std::erase_if(op.deps, [](std::int32_t dep) { return dep < 0; });
    std::sort(op.deps.begin(), op.deps.end());
    op.deps.erase(std::unique(op.deps.begin(), op.deps.end()), op.deps.end());
    op.micro_batch = step.micro_batch;
    op.chunk = step.chunk;
    emit(std::move(op));
  }
  if (!ops.empty()) chain.last = last_op();
}

void StageBuilder::forward_layer_alone(int layer, const PipelineStep& step, Chain& chain) {
  const LayerNodes& nodes = nodes_of(layer, Phase::Forward);
  for (LayerNode node :
       {LayerNode::Attention, LayerNode::Dispatch, LayerNode::Mlp, LayerNode::Combine, LayerNode::CombineTail}) {
    emit_node(nodes[static_cast<std::size_t>(node)], step, chain);
  }
}

// TransformerLayerSchedulePlan.run with both layers: each all-to-all is issued between the other micro-batch's
// compute nodes, on the expert stream.
void StageBuilder::layer_pair(int forward_layer, const PipelineStep& forward, Chain& fc, int backward_layer,
                              const PipelineStep& backward, Chain& bc, bool last_backward_of_chunk) {
  const LayerNodes& f = nodes_of(forward_layer, Phase::Forward);
  const LayerNodes& b = nodes_of(backward_layer, Phase::Backward);
  const auto at = [](const LayerNodes& nodes, LayerNode node) -> const std::vector<Op>& {
    return nodes[static_cast<std::size_t>(node)];
  };
  emit_node(at(b, LayerNode::Combine), backward, bc);   // expert stream, under ...
  emit_node(at(f, LayerNode::Attention), forward, fc);  // ... the forward's attention
  emit_node(at(b, LayerNode::Mlp), backward, bc);
  emit_node(at(f, LayerNode::Dispatch), forward, fc);   // under the backward's experts
  emit_node(at(b, LayerNode::Dispatch), backward, bc);  // under the forward's experts
  emit_node(at(f, LayerNode::Mlp), forward, fc);
  emit_node(at(f, LayerNode::Combine), forward, fc);  // under the backward's attention
  finish_backward_layer(backward_layer, backward, bc, last_backward_of_chunk);
  emit_node(at(f, LayerNode::CombineTail), forward, fc);
}

// The backward's attention node (after the selective recompute of its core), then the layer's gradient reduction.
void StageBuilder::finish_backward_layer(int layer, const PipelineStep& step, Chain& chain,
                                         bool last_backward_of_chunk) {
  emit_node(nodes_of(layer, Phase::Recompute)[static_cast<std::size_t>(LayerNode::Attention)], step, chain);
  emit_node(nodes_of(layer, Phase::Backward)[static_cast<std::size_t>(LayerNode::Attention)], step, chain);
  if (!last_backward_of_chunk) return;
  if (s_.parallel.dp_overlap) {
    synchronize_layer_gradients(layer);  // after the op just emitted, the layer's last
  } else {
    deferred_layers_.push_back(layer);
  }
}

void StageBuilder::combined_step(const PipelineStep* forward, const PipelineStep* backward,
                                 bool last_backward_of_chunk) {
  Chain fc, bc;
  int forward_vs = 0, backward_vs = 0, forward_layers = 0, backward_layers = 0;
  if (forward != nullptr) {
    forward_vs = vs_of(forward->chunk);
    forward_layers = layers_in(forward->chunk);
    fc.wait = !starts_route(forward_vs) ? recv(*forward, forward_vs - 1, Phase::Forward) : -1;
    if (starts_route(forward_vs)) emit_node(embedding_forward(x_), *forward, fc);
  }
  if (backward != nullptr) {
    backward_vs = vs_of(backward->chunk);
    backward_layers = layers_in(backward->chunk);
    bc.wait = !ends_route(backward_vs) ? recv(*backward, backward_vs + 1, Phase::Backward) : -1;
    if (ends_route(backward_vs)) {
      emit_node(head_backward(x_, recompute_model_ends(s_)), *backward, bc);
    }
  }
  const int pairs = std::min(forward_layers, backward_layers);
  const int forward_first = forward != nullptr ? first_layer(forward->chunk) : 0;
  const int backward_last = backward != nullptr ? first_layer(backward->chunk) + backward_layers - 1 : 0;
  for (int k = 0; k < pairs; ++k) {
    layer_pair(forward_first + k, *forward, fc, backward_last - k, *backward, bc, last_backward_of_chunk);
  }
  for (int k = pairs; k < backward_layers; ++k) {
    const int layer = backward_last - k;
    const LayerNodes& nodes = nodes_of(layer, Phase::Backward);
    for (LayerNode node : {LayerNode::Combine, LayerNode::Mlp, LayerNode::Dispatch}) {
      emit_node(nodes[static_cast<std::size_t>(node)], *backward, bc);
    }
    finish_backward_layer(layer, *backward, bc, last_backward_of_chunk);
  }
  for (int k = pairs; k < forward_layers; ++k) forward_layer_alone(forward_first + k, *forward, fc);
  // The step's ends: what a Send waits for is the micro-batch's latest op (or its Recv, if it ran nothing).
  const auto producer = [](const Chain& chain) { return chain.last >= 0 ? chain.last : chain.wait; };
  if (forward != nullptr) {
    reduce_fp8_amaxes(forward_layers, Phase::Forward, *forward, fc.wait);
    if (ends_route(forward_vs)) {
      emit_node(head_forward(x_), *forward, fc);
    } else {
      send(*forward, forward_vs, forward_vs + 1, Phase::Forward, producer(fc));
    }
  }
  if (backward != nullptr) {
    const int gradient_producer = producer(bc);
    reduce_fp8_amaxes(backward_layers, Phase::Backward, *backward, bc.wait);
    if (starts_route(backward_vs)) {
      if (recompute_model_ends(s_)) emit_node(embedding_forward(x_, Phase::Recompute), *backward, bc);
      emit_node(embedding_backward(x_), *backward, bc);
    } else {
      send(*backward, backward_vs, backward_vs - 1, Phase::Backward, gradient_producer);
    }
  }
}

}  // namespace twin::model
