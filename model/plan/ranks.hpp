// RankLayout: which global rank holds which slice of the model, and the communication groups that follow.
//
// Megatron-Core's order (megatron/core/parallel_state.py, RankGenerator, order "tp-cp-ep-dp-pp"), innermost first.
// Two grids number the same ranks:
//   dense layers   (tp, cp, dp, pp):    rank = tp + TP * (cp + CP * (dp + DP * pp))
//   expert layers  (etp, ep, edp, pp):  rank = etp + ETP * (ep + EP * (edp + EDP * pp))
// with EDP = TP * CP * DP / (ETP * EP).
// tp is innermost, so a TP group sits inside a node; pp is outermost in both, so both grids agree on the stages.
// A group is every rank that differs from a given rank only along some axes of one grid (Megatron's masked
// orthogonal groups); its members are in increasing rank order, which is their index inside the group.
// docs/parallelism.md draws the layout and the groups.
#pragma once

#include <cstdint>
#include <vector>

namespace twin::model {

// A rank's coordinates on the dense grid (members in this order so {dp, pp, tp} still reads as before CP).
struct RankCoord {
  int dp = 0;
  int pp = 0;
  int tp = 0;
  int cp = 0;
  bool operator==(const RankCoord&) const = default;
};

// A rank's coordinates on the expert grid.
struct ExpertCoord {
  int edp = 0;
  int pp = 0;
  int etp = 0;
  int ep = 0;
  bool operator==(const ExpertCoord&) const = default;
};

// `rank`'s index in a group's `members` (global ranks in group-index order); -1 when it is not one of them.
int index_in(const std::vector<int>& members, int rank);

// The parallel sizes a layout is built from; edp follows from them.
struct LayoutSizes {
  int tp = 1;
  int pp = 1;
  int dp = 1;
  int cp = 1;   // context parallel: the ranks that split one sequence
  int ep = 1;   // expert parallel: the ranks that split a layer's experts
  int etp = 1;  // expert tensor parallel: the ranks that split one expert's weights
};

// The communication groups a rank belongs to (the first four keep their values: messages and tags use them).
enum class Group : std::uint8_t {
  Tensor,           // dense grid, along tp: the TP ranks of one stage replica
  Data,             // dense grid, along dp: the DP replicas of one shard (Megatron's data-parallel group without CP)
  Embedding,        // the pipeline group's first and last stage: the two copies of the tied word embedding
  World,            // every rank
  Context,          // dense grid, along cp: the ranks that split one sequence
  DataWithContext,  // dense grid, along cp and dp: what dense gradients reduce over (Megatron's "dp-cp")
  Pipeline,         // dense grid, along pp: the stages of one pipeline
  Expert,           // expert grid, along ep: the ranks that exchange tokens (all-to-all dispatch and combine)
  ExpertTensor,     // expert grid, along etp: the ranks that split one expert's weights
  ExpertTensorAndExpert,  // expert grid, along etp and ep (Megatron's "tp-ep")
  ExpertData,             // expert grid, along edp: the replicas of one expert shard; expert gradients reduce over it
  MirrorStages,           // dense grid, along pp: stage s and stage pp - 1 - s, DualPipe's two copies of each block
};
inline constexpr int kGroupCount = 12;

class RankLayout {
 public:
  explicit RankLayout(const LayoutSizes& sizes);  // throws std::invalid_argument naming a bad size
  RankLayout(int tp, int pp, int dp) : RankLayout(LayoutSizes{tp, pp, dp}) {}

  int tp() const { return tp_; }
  int pp() const { return pp_; }
  int dp() const { return dp_; }
  int cp() const { return cp_; }
  int ep() const { return ep_; }
  int etp() const { return etp_; }
  int edp() const { return edp_; }
  int world_size() const { return tp_ * cp_ * dp_ * pp_; }

  int rank_of(RankCoord coord) const { return coord.tp + tp_ * (coord.cp + cp_ * (coord.dp + dp_ * coord.pp)); }
  int rank_of_expert(ExpertCoord coord) const {
    return coord.etp + etp_ * (coord.ep + ep_ * (coord.edp + edp_ * coord.pp));
  }
  RankCoord coord_of(int rank) const;
  ExpertCoord expert_coord_of(int rank) const;
  // The rank with `rank`'s coordinates on pipeline stage `stage` (its pipeline peer there).
  int rank_on_stage(int rank, int stage) const;

  // Global ranks of `group` that contain `rank`, in increasing order (= their index inside the group). The
  // Embedding group of a middle stage is that of its pipeline's first and last stage, which it is not a member of.
  std::vector<int> group_members(Group group, int rank) const;
  // This rank's index inside `group` (its position in group_members); throws std::invalid_argument when the rank is
  // not a member (the Embedding group of a middle stage).
  int index_in_group(Group group, int rank) const;
  // Every group of a kind, each in increasing order, ordered by their first member (Megatron's get_ranks).
  std::vector<std::vector<int>> groups(Group group) const;

 private:
  int tp_, pp_, dp_, cp_, ep_, etp_, edp_;
};

}  // namespace twin::model
