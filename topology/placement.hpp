// Placement: which GPU runs which rank.
//
// Ranks are numbered as Megatron numbers them (model::RankLayout: tp innermost, then cp, dp, pp outermost). GPUs are
// numbered node by node: GPU g sits in node g / gpus_per_node. The default order "tp-dp-pp" puts rank r on GPU r, so
// a TP group of 8 fills one DGX node, as Megatron-LM and DeepSpeed do. Other orders (innermost first) are what-if
// studies: "tp-pp-dp" packs pipeline neighbours together, "dp-tp-pp" spreads TP groups across nodes. An order that
// leaves out cp keeps it right outside tp, as in the rank order. The expert grid numbers the same ranks, so it
// needs no axes of its own here.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "model/plan/ranks.hpp"

namespace twin::topology {

enum class Axis : unsigned char { Tp, Dp, Pp, Cp };

class Placement {
 public:
  // `order`: the axes innermost first, e.g. "tp-dp-pp" or "tp-cp-dp-pp"; throws std::invalid_argument when malformed.
  Placement(const model::RankLayout& layout, int gpus_per_node, std::string_view order = "tp-dp-pp");

  int gpu_of(int rank) const { return gpu_of_rank_[rank]; }
  int rank_of(int gpu) const { return rank_of_gpu_[gpu]; }
  int node_of_rank(int rank) const { return gpu_of(rank) / gpus_per_node_; }
  int local_index_of_rank(int rank) const { return gpu_of(rank) % gpus_per_node_; }
  int gpus() const { return static_cast<int>(gpu_of_rank_.size()); }
  int nodes() const { return (gpus() + gpus_per_node_ - 1) / gpus_per_node_; }
  int gpus_per_node() const { return gpus_per_node_; }
  const model::RankLayout& layout() const { return layout_; }
  std::string order() const;

  // True when every TP group lies inside one node (what `group` fidelity needs).
  bool tensor_groups_inside_nodes() const;

 private:
  model::RankLayout layout_;
  int gpus_per_node_;
  std::vector<Axis> named_;    // the axes as `order` names them (for order())
  std::array<Axis, 4> order_;  // every axis, cp placed when `order` leaves it out
  std::vector<int> gpu_of_rank_;
  std::vector<int> rank_of_gpu_;
};

// "tp-dp-pp" -> {Tp, Dp, Pp}; throws std::invalid_argument unless it names tp, dp and pp once each and cp at most
// once.
std::vector<Axis> parse_placement_order(std::string_view order);

}  // namespace twin::topology
