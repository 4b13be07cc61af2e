#include "topology/placement.hpp"

#include <algorithm>
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
    case Axis::Cp:
      return "cp";
  }
  return "?";
}

int digit_of(const model::RankCoord& coord, Axis axis) {
  switch (axis) {
    case Axis::Tp:
      return coord.tp;
    case Axis::Dp:
      return coord.dp;
    case Axis::Pp:
      return coord.pp;
    case Axis::Cp:
      return coord.cp;
  }
  return 0;
}

int size_of(const model::RankLayout& layout, Axis axis) {
  switch (axis) {
    case Axis::Tp:
      return layout.tp();
    case Axis::Dp:
      return layout.dp();
    case Axis::Pp:
      return layout.pp();
    case Axis::Cp:
      return layout.cp();
  }
  return 1;
}

// The named axes with cp right outside tp when they leave it out.
std::array<Axis, 4> every_axis(const std::vector<Axis>& named) {
  std::vector<Axis> axes = named;
  if (std::find(axes.begin(), axes.end(), Axis::Cp) == axes.end()) {
    axes.insert(std::find(axes.begin(), axes.end(), Axis::Tp) + 1, Axis::Cp);
  }
  return {axes[0], axes[1], axes[2], axes[3]};
}

}  // namespace

std::vector<Axis> parse_placement_order(std::string_view order) {
  const auto bad = [&] {
    return std::invalid_argument("placement order '" + std::string(order) +
                                 "' must name tp, dp and pp once each (cp at most once), innermost first, e.g. "
                                 "tp-dp-pp");
  };
  std::vector<Axis> axes;
  std::size_t position = 0;
  while (true) {
    if (position + 2 > order.size()) throw bad();
    const std::string_view word = order.substr(position, 2);
    if (word == "tp")
      axes.push_back(Axis::Tp);
    else if (word == "dp")
      axes.push_back(Axis::Dp);
    else if (word == "pp")
      axes.push_back(Axis::Pp);
    else if (word == "cp")
      axes.push_back(Axis::Cp);
    else
      throw bad();
    position += 2;
    if (position == order.size()) break;
    if (order[position] != '-' && order[position] != ',') throw bad();
    ++position;
  }
  for (Axis axis : {Axis::Tp, Axis::Dp, Axis::Pp, Axis::Cp}) {
    const auto count = std::count(axes.begin(), axes.end(), axis);
    if (count > 1 || (count == 0 && axis != Axis::Cp)) throw bad();
  }
  return axes;
}

Placement::Placement(const model::RankLayout& layout, int gpus_per_node, std::string_view order)
    : layout_(layout), gpus_per_node_(gpus_per_node), named_(parse_placement_order(order)), order_(every_axis(named_)) {
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
      gpu += digit_of(coord, axis) * stride;
      stride *= size_of(layout, axis);
    }
    gpu_of_rank_[rank] = gpu;
    rank_of_gpu_[gpu] = rank;
  }
}

std::string Placement::order() const {
  std::string text;
  for (Axis axis : named_) {
    if (!text.empty()) text += '-';
    text += axis_name(axis);
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
