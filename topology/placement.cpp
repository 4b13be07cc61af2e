#include "topology/placement.hpp"

#include <stdexcept>
#include <string>

namespace twin::topology {

namespace {

std::string_view axis_name(Axis axis) {
  switch (axis) {
    case Axis::Tp:
      return "tp";
    case Axis::Dp:
      return "dp";
    case Axis::Pp:
      return "pp";
  }
  return "?";
}

}  // namespace

std::array<Axis, 3> parse_placement_order(std::string_view order) {
  const auto bad = [&] {
    return std::invalid_argument("placement order '" + std::string(order) +
                                 "' must name tp, dp and pp once each, innermost first, e.g. tp-dp-pp");
  };
  std::array<Axis, 3> axes{};
  std::size_t position = 0;
  for (int i = 0; i < 3; ++i) {
    if (position + 2 > order.size()) throw bad();
    const std::string_view word = order.substr(position, 2);
    if (word == "tp")
      axes[i] = Axis::Tp;
    else if (word == "dp")
      axes[i] = Axis::Dp;
    else if (word == "pp")
      axes[i] = Axis::Pp;
    else
      throw bad();
    position += 2;
    if (i < 2) {
      if (position >= order.size() || (order[position] != '-' && order[position] != ',')) throw bad();
      ++position;
    }
  }
  if (position != order.size()) throw bad();
  if (axes[0] == axes[1] || axes[1] == axes[2] || axes[0] == axes[2]) throw bad();
  return axes;
}

Placement::Placement(const model::RankLayout& layout, int gpus_per_node, std::string_view order)
    : layout_(layout), gpus_per_node_(gpus_per_node), order_(parse_placement_order(order)) {
  if (gpus_per_node < 1) throw std::invalid_argument("Placement: gpus_per_node must be >= 1");
  const int world = layout.world_size();
  gpu_of_rank_.assign(world, 0);
  rank_of_gpu_.assign(world, 0);
  for (int rank = 0; rank < world; ++rank) {
    const model::RankCoord coord = layout.coord_of(rank);
    // Mixed radix, innermost axis first.
    int gpu = 0;
    int stride = 1;
    for (Axis axis : order_) {
      const int digit = axis == Axis::Tp ? coord.tp : axis == Axis::Dp ? coord.dp : coord.pp;
      const int size = axis == Axis::Tp ? layout.tp() : axis == Axis::Dp ? layout.dp() : layout.pp();
      gpu += digit * stride;
      stride *= size;
    }
    gpu_of_rank_[rank] = gpu;
    rank_of_gpu_[gpu] = rank;
  }
}

std::string Placement::order() const {
  std::string text;
  for (int i = 0; i < 3; ++i) {
    if (i > 0) text += '-';
    text += axis_name(order_[i]);
  }
  return text;
}

bool Placement::tensor_groups_inside_nodes() const {
  for (int rank = 0; rank < layout_.world_size(); ++rank) {
    const model::RankCoord coord = layout_.coord_of(rank);
    if (coord.tp != 0) continue;
    const int node = node_of_rank(rank);
    for (int member : layout_.group_members(model::Group::Tensor, rank)) {
      if (node_of_rank(member) != node) return false;
    }
  }
  return true;
}

}  // namespace twin::topology
