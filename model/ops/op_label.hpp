// How both engines name an op, in messages and traces: its class, then its place in the iteration.
//   "backward mlp_up layer 12 micro-batch 3"
//   "all_reduce tensor layer_output (forward attention_projection) layer 4 micro-batch 0"
//   "send forward micro-batch 10 chunk 1 to stage 2"
// The class (`twin compare` sums op times by it: "backward mlp_up", "all_reduce tensor layer_output", "send forward")
// is the label's words before the first of "(", "layer", "micro-batch", "chunk", "to" and "from".
#pragma once

#include <string>
#include <string_view>

#include "model/ops/op.hpp"

namespace twin::model {

std::string op_label(const Op& op);
// The class of an op's label (its words before the op's place); the whole label when it has no place.
std::string op_class(std::string_view label);

}  // namespace twin::model
