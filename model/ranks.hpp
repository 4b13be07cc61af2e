// Rank coordinates in Megatron's order: tp innermost (a TP group sits inside a node), then dp, then pp.
//   global rank = tp + TP * (dp + DP * pp)
#pragma once

#include <cstdint>
#include <vector>

namespace twin::model {

struct RankCoord {
  int dp = 0;
  int pp = 0;
  int tp = 0;
  bool operator==(const RankCoord&) const = default;
};

// The communication groups a rank belongs to.
enum class Group : std::uint8_t {
  Tensor,     // same (dp, pp): the TP ranks of one stage replica
  Data,       // same (pp, tp): the DP replicas of one shard
  Embedding,  // same (dp, tp), stages 0 and pp-1: the two copies of the tied word embedding
  World,      // every rank
};

// `rank`'s index in a group's `members` (global ranks in group-index order); -1 when it is not one of them.
int index_in(const std::vector<int>& members, int rank);

class RankLayout {
 public:
  RankLayout(int tp, int pp, int dp);

  int tp() const { return tp_; }
  int pp() const { return pp_; }
  int dp() const { return dp_; }
  int world_size() const { return tp_ * pp_ * dp_; }

  int rank_of(RankCoord coord) const { return coord.tp + tp_ * (coord.dp + dp_ * coord.pp); }
  RankCoord coord_of(int rank) const;

  // Global ranks of `group` that contain `rank`, in increasing order of their index inside the group.
  std::vector<int> group_members(Group group, int rank) const;
  // This rank's index inside `group`.
  int index_in_group(Group group, int rank) const;

 private:
  int tp_, pp_, dp_;
};

}  // namespace twin::model
