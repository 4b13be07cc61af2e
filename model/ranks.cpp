#include "model/ranks.hpp"

#include <algorithm>
#include <stdexcept>

namespace twin::model {

int index_in(const std::vector<int>& members, int rank) {
  const auto it = std::find(members.begin(), members.end(), rank);
  return it == members.end() ? -1 : static_cast<int>(it - members.begin());
}

RankLayout::RankLayout(int tp, int pp, int dp) : tp_(tp), pp_(pp), dp_(dp) {
  if (tp < 1 || pp < 1 || dp < 1) throw std::invalid_argument("RankLayout: tp, pp and dp must be >= 1");
}

RankCoord RankLayout::coord_of(int rank) const {
  if (rank < 0 || rank >= world_size()) throw std::out_of_range("RankLayout::coord_of: rank out of range");
  RankCoord coord;
  coord.tp = rank % tp_;
  coord.dp = (rank / tp_) % dp_;
  coord.pp = rank / (tp_ * dp_);
  return coord;
}

std::vector<int> RankLayout::group_members(Group group, int rank) const {
  const RankCoord me = coord_of(rank);
  std::vector<int> members;
  switch (group) {
    case Group::Tensor:
      for (int tp = 0; tp < tp_; ++tp) members.push_back(rank_of({me.dp, me.pp, tp}));
      break;
    case Group::Data:
      for (int dp = 0; dp < dp_; ++dp) members.push_back(rank_of({dp, me.pp, me.tp}));
      break;
    case Group::Embedding:
      members.push_back(rank_of({me.dp, 0, me.tp}));
      if (pp_ > 1) members.push_back(rank_of({me.dp, pp_ - 1, me.tp}));
      break;
    case Group::World:
      for (int r = 0; r < world_size(); ++r) members.push_back(r);
      break;
  }
  return members;
}

int RankLayout::index_in_group(Group group, int rank) const {
  const RankCoord me = coord_of(rank);
  switch (group) {
    case Group::Tensor: return me.tp;
    case Group::Data: return me.dp;
    case Group::Embedding: return me.pp == 0 ? 0 : 1;
    case Group::World: return rank;
  }
  return 0;
}

}  // namespace twin::model
