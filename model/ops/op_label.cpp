#include "model/ops/op_label.hpp"

#include <fmt/format.h>

namespace twin::model {

std::string op_label(const Op& op) {
  std::string label;
  switch (op.kind) {
    case OpKind::Compute:
      label = fmt::format("{} {}", to_string(op.phase), to_string(op.what));
      break;
    case OpKind::Collective:
      label = fmt::format("{} {} {} ({} {})", to_string(op.collective), to_string(op.group), to_string(op.payload),
                          to_string(op.phase), to_string(op.what));
      break;
    case OpKind::Send:
    case OpKind::Recv:
      label = fmt::format("{} {}", to_string(op.kind), to_string(op.phase));
      break;
  }
  if (op.layer >= 0) label += fmt::format(" layer {}", op.layer);
  if (op.micro_batch >= 0) label += fmt::format(" micro-batch {}", op.micro_batch);
  if (op.chunk > 0) label += fmt::format(" chunk {}", op.chunk);
  if (op.cp_ring_step >= 0) label += fmt::format(" ring step {}", op.cp_ring_step);
  if (op.kind == OpKind::Send) {
    label += op.group == Group::Context ? " to cp rank + 1" : fmt::format(" to stage {}", op.peer_stage);
  }
  if (op.kind == OpKind::Recv) {
    label += op.group == Group::Context ? " from cp rank - 1" : fmt::format(" from stage {}", op.peer_stage);
  }
  return label;
}

std::string op_class(std::string_view label) {
  std::string out;
  std::size_t position = 0;
  while (position < label.size()) {
    const std::size_t end = std::min(label.find(' ', position), label.size());
    const std::string_view word = label.substr(position, end - position);
    position = end + 1;
    if (word.empty()) continue;
    if (word.front() == '(' || word == "layer" || word == "micro-batch" || word == "chunk" || word == "ring" ||
        word == "to" || word == "from") {
      break;
    }
    if (!out.empty()) out += ' ';
    out += word;
  }
  return out;
}

}  // namespace twin::model
