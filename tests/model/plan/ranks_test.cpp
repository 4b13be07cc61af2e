// RankLayout against tables written by hand from Megatron-Core's rule (megatron/core/parallel_state.py,
// RankGenerator with order "tp-cp-ep-dp-pp": dense grid tp-cp-dp-pp, expert grid etp-ep-edp-pp).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "model/plan/ranks.hpp"

namespace twin::model {
namespace {

using Table = std::vector<std::vector<int>>;

constexpr Group kEveryGroup[] = {
    Group::Tensor,          Group::Data,     Group::Embedding, Group::World,        Group::Context,
    Group::DataWithContext, Group::Pipeline, Group::Expert,    Group::ExpertTensor, Group::ExpertTensorAndExpert,
    Group::ExpertData,      Group::MirrorStages};
static_assert(std::size(kEveryGroup) == kGroupCount);

Table singletons(int world) {
  Table table;
  for (int rank = 0; rank < world; ++rank) table.push_back({rank});
  return table;
}

TEST(RankLayout, TensorContextDataPipelineTable) {
  // tp 2, cp 2, dp 2, pp 2: rank = tp + 2 (cp + 2 (dp + 2 pp)).
  const RankLayout layout(LayoutSizes{.tp = 2, .pp = 2, .dp = 2, .cp = 2});
  EXPECT_EQ(layout.world_size(), 16);
  EXPECT_EQ(layout.groups(Group::Tensor),
            (Table{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(layout.groups(Group::Context),
            (Table{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(layout.groups(Group::Data), (Table{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(layout.groups(Group::DataWithContext),
            (Table{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(layout.groups(Group::Pipeline),
            (Table{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
  EXPECT_EQ(layout.groups(Group::Embedding), layout.groups(Group::Pipeline));  // two stages: first and last
  // No experts split: every rank of a stage holds every expert, so expert gradients reduce over the whole stage.
  EXPECT_EQ(layout.edp(), 8);
  EXPECT_EQ(layout.groups(Group::Expert), singletons(16));
  EXPECT_EQ(layout.groups(Group::ExpertData), (Table{{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}}));
  EXPECT_EQ(layout.coord_of(13), (RankCoord{.dp = 1, .pp = 1, .tp = 1, .cp = 0}));
  EXPECT_EQ(layout.coord_of(7), (RankCoord{.dp = 1, .pp = 0, .tp = 1, .cp = 1}));
  EXPECT_EQ(layout.index_in_group(Group::DataWithContext, 6), 3);
  EXPECT_EQ(layout.index_in_group(Group::Context, 6), 1);
  EXPECT_EQ(layout.rank_on_stage(7, 1), 15);
}

TEST(RankLayout, ExpertParallelAcrossDataParallelTable) {
  // tp 2, dp 4, pp 2, ep 4, etp 1: each stage's 8 ranks form 2 EP groups of 4 consecutive ranks (spanning the TP
  // pairs), and the 2 replicas of an expert shard are 4 ranks apart.
  const RankLayout layout(LayoutSizes{.tp = 2, .pp = 2, .dp = 4, .ep = 4, .etp = 1});
  EXPECT_EQ(layout.edp(), 2);
  EXPECT_EQ(layout.groups(Group::Data), (Table{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(layout.groups(Group::Expert), (Table{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}));
  EXPECT_EQ(layout.groups(Group::ExpertTensor), singletons(16));
  EXPECT_EQ(layout.groups(Group::ExpertTensorAndExpert), layout.groups(Group::Expert));
  EXPECT_EQ(layout.groups(Group::ExpertData),
            (Table{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(layout.expert_coord_of(14), (ExpertCoord{.edp = 1, .pp = 1, .etp = 0, .ep = 2}));
  EXPECT_EQ(layout.rank_of_expert(ExpertCoord{.edp = 1, .pp = 1, .etp = 0, .ep = 2}), 14);
  EXPECT_EQ(layout.index_in_group(Group::Expert, 14), 2);
  EXPECT_EQ(layout.index_in_group(Group::ExpertData, 14), 1);
}

TEST(RankLayout, ExpertTensorParallelTable) {
  // tp 4, dp 2, ep 2, etp 2: an expert is split over 2 ranks, its EP peers are 2 apart.
  const RankLayout layout(LayoutSizes{.tp = 4, .pp = 1, .dp = 2, .ep = 2, .etp = 2});
  EXPECT_EQ(layout.groups(Group::Tensor), (Table{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(layout.groups(Group::ExpertTensor), (Table{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(layout.groups(Group::Expert), (Table{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(layout.groups(Group::ExpertTensorAndExpert), (Table{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(layout.groups(Group::ExpertData), (Table{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(layout.expert_coord_of(5), (ExpertCoord{.edp = 1, .pp = 0, .etp = 1, .ep = 0}));
}

TEST(RankLayout, ExpertParallelFoldsContextParallel) {
  // tp 1, cp 2, dp 2, ep 2: Megatron's expert grid has no cp axis, so EP groups span the CP ranks.
  const RankLayout layout(LayoutSizes{.tp = 1, .pp = 1, .dp = 2, .cp = 2, .ep = 2});
  EXPECT_EQ(layout.groups(Group::Context), (Table{{0, 1}, {2, 3}}));
  EXPECT_EQ(layout.groups(Group::Data), (Table{{0, 2}, {1, 3}}));
  EXPECT_EQ(layout.groups(Group::DataWithContext), (Table{{0, 1, 2, 3}}));
  EXPECT_EQ(layout.groups(Group::Expert), (Table{{0, 1}, {2, 3}}));
  EXPECT_EQ(layout.groups(Group::ExpertData), (Table{{0, 2}, {1, 3}}));
}

TEST(RankLayout, EmbeddingGroupJoinsFirstAndLastStage) {
  const RankLayout layout(2, 4, 2);  // 16 ranks, stages of 4
  EXPECT_EQ(layout.groups(Group::Embedding), (Table{{0, 12}, {1, 13}, {2, 14}, {3, 15}}));
  EXPECT_EQ(layout.group_members(Group::Embedding, 5), (std::vector<int>{1, 13}));  // a middle stage: not a member
  EXPECT_EQ(layout.index_in_group(Group::Embedding, 13), 1);
  EXPECT_THROW(layout.index_in_group(Group::Embedding, 5), std::invalid_argument);
  EXPECT_EQ(RankLayout(2, 1, 2).groups(Group::Embedding), (Table{{0}, {1}, {2}, {3}}));
}

// DualPipe's pairs: stage s with stage pp - 1 - s, every rank in exactly one (its tp, cp and dp kept).
TEST(RankLayout, MirrorStagesPairStageSWithItsMirror) {
  const RankLayout layout(2, 4, 2);  // 16 ranks, stages of 4: stage 1 is ranks 4..7, stage 2 ranks 8..11
  EXPECT_EQ(layout.groups(Group::MirrorStages),
            (Table{{0, 12}, {1, 13}, {2, 14}, {3, 15}, {4, 8}, {5, 9}, {6, 10}, {7, 11}}));
  EXPECT_EQ(layout.group_members(Group::MirrorStages, 9), (std::vector<int>{5, 9}));
  EXPECT_EQ(layout.index_in_group(Group::MirrorStages, 9), 1);
  EXPECT_EQ(RankLayout(1, 1, 2).groups(Group::MirrorStages), (Table{{0}, {1}}));  // one stage: its own mirror
}

// Without CP and experts every rank, group and index is what the tp-dp-pp layout gave (written out as it was).
TEST(RankLayout, WithoutContextOrExpertsItIsTheTensorDataPipelineLayout) {
  struct Sizes {
    int tp, pp, dp;
  };
  for (const auto [tp, pp, dp] : {Sizes{1, 1, 1}, Sizes{2, 3, 4}, Sizes{8, 2, 3}, Sizes{4, 1, 8}, Sizes{1, 5, 2}}) {
    const RankLayout layout(tp, pp, dp);
    ASSERT_EQ(layout.world_size(), tp * pp * dp);
    for (int rank = 0; rank < layout.world_size(); ++rank) {
      const RankCoord coord{rank / tp % dp, rank / (tp * dp), rank % tp, 0};
      ASSERT_EQ(layout.coord_of(rank), coord);
      ASSERT_EQ(layout.rank_of(coord), rank);
      std::vector<int> tensor, data, embedding{coord.tp + tp * coord.dp};
      for (int t = 0; t < tp; ++t) tensor.push_back(t + tp * (coord.dp + dp * coord.pp));
      for (int d = 0; d < dp; ++d) data.push_back(coord.tp + tp * (d + dp * coord.pp));
      if (pp > 1) embedding.push_back(coord.tp + tp * (coord.dp + dp * (pp - 1)));
      EXPECT_EQ(layout.group_members(Group::Tensor, rank), tensor);
      EXPECT_EQ(layout.group_members(Group::Data, rank), data);
      EXPECT_EQ(layout.group_members(Group::DataWithContext, rank), data);
      EXPECT_EQ(layout.group_members(Group::Context, rank), std::vector<int>{rank});
      EXPECT_EQ(layout.group_members(Group::Embedding, rank), embedding);
      EXPECT_EQ(layout.index_in_group(Group::Tensor, rank), coord.tp);
      EXPECT_EQ(layout.index_in_group(Group::Data, rank), coord.dp);
      EXPECT_EQ(layout.group_members(Group::World, rank).size(), static_cast<std::size_t>(tp * pp * dp));
    }
  }
}

// Whatever the sizes: each kind of group partitions the ranks (the embedding's: its first and last stages), a rank's
// index is its position, and both grids agree on the stages.
TEST(RankLayout, GroupsPartitionTheRanks) {
  const LayoutSizes layouts[] = {{.tp = 2, .pp = 3, .dp = 2, .cp = 2, .ep = 4, .etp = 2},
                                 {.tp = 4, .pp = 2, .dp = 4, .cp = 1, .ep = 8, .etp = 1},
                                 {.tp = 1, .pp = 2, .dp = 3, .cp = 4, .ep = 6, .etp = 2}};
  for (const LayoutSizes& sizes : layouts) {
    const RankLayout layout(sizes);
    for (Group group : kEveryGroup) {
      std::multiset<int> covered;
      for (const auto& members : layout.groups(group)) {
        EXPECT_TRUE(std::is_sorted(members.begin(), members.end()));
        covered.insert(members.begin(), members.end());
        for (std::size_t i = 0; i < members.size(); ++i) {
          EXPECT_EQ(layout.index_in_group(group, members[i]), static_cast<int>(i));
          EXPECT_EQ(layout.group_members(group, members[i]), members);
        }
      }
      const int covering =
          group == Group::Embedding && layout.pp() > 2 ? 2 * layout.world_size() / layout.pp() : layout.world_size();
      EXPECT_EQ(covered.size(), static_cast<std::size_t>(covering)) << static_cast<int>(group);
      EXPECT_EQ(std::set<int>(covered.begin(), covered.end()).size(), covered.size()) << static_cast<int>(group);
    }
    for (int rank = 0; rank < layout.world_size(); ++rank) {
      EXPECT_EQ(layout.coord_of(rank).pp, layout.expert_coord_of(rank).pp);
      EXPECT_EQ(layout.rank_of_expert(layout.expert_coord_of(rank)), rank);
      EXPECT_EQ(layout.group_members(Group::ExpertTensorAndExpert, rank).size(),
                static_cast<std::size_t>(sizes.ep * sizes.etp));
    }
  }
}

TEST(RankLayout, RefusesSizesMegatronRefuses) {
  EXPECT_THROW(RankLayout(0, 1, 1), std::invalid_argument);
  EXPECT_THROW(RankLayout(LayoutSizes{.cp = 0}), std::invalid_argument);
  // ep x etp must divide tp x cp x dp (Megatron: world % (etp * ep * pp) == 0).
  EXPECT_THROW(RankLayout(LayoutSizes{.tp = 2, .dp = 2, .ep = 8}), std::invalid_argument);
  EXPECT_THROW(RankLayout(LayoutSizes{.tp = 2, .dp = 3, .ep = 2, .etp = 2}), std::invalid_argument);
  EXPECT_NO_THROW(RankLayout(LayoutSizes{.tp = 2, .dp = 3, .ep = 3, .etp = 2}));
}

}  // namespace
}  // namespace twin::model
