#include "model/plan/ranks.hpp"

#include <algorithm>
#include <array>
#include <stdexcept>
#include <string>

namespace twin::model {

int index_in(const std::vector<int>& members, int rank) {
  const auto it = std::find(members.begin(), members.end(), rank);
  return it == members.end() ? -1 : static_cast<int>(it - members.begin());
}

namespace {

// One grid: four axis sizes and a rank's digits on them, innermost first.
struct Grid {
  std::array<int, 4> sizes;
  std::array<int, 4> digits;
};

// Axes (bits, innermost = bit 0) a group varies along.
struct GroupShape {
  bool expert_grid = false;
  unsigned axes = 0;
};

constexpr unsigned kAxis0 = 1, kAxis1 = 2, kAxis2 = 4, kAxis3 = 8;

// Dense grid: tp, cp, dp, pp. Expert grid: etp, ep, edp, pp.
GroupShape shape_of(Group group) {
  switch (group) {
    case Group::Tensor:
      return {false, kAxis0};
    case Group::Context:
      return {false, kAxis1};
    case Group::Data:
      return {false, kAxis2};
    case Group::DataWithContext:
      return {false, kAxis1 | kAxis2};
    case Group::Pipeline:
    case Group::Embedding:
    case Group::MirrorStages:
      return {false, kAxis3};
    case Group::World:
      return {false, kAxis0 | kAxis1 | kAxis2 | kAxis3};
    case Group::ExpertTensor:
      return {true, kAxis0};
    case Group::Expert:
      return {true, kAxis1};
    case Group::ExpertTensorAndExpert:
      return {true, kAxis0 | kAxis1};
    case Group::ExpertData:
      return {true, kAxis2};
  }
  throw std::invalid_argument("RankLayout: unknown group");
}

int compose(const Grid& grid) {
  int rank = 0;
  for (int axis = 3; axis >= 0; --axis) rank = rank * grid.sizes[axis] + grid.digits[axis];
  return rank;
}

Grid decompose(std::array<int, 4> sizes, int rank) {
  Grid grid{sizes, {}};
  for (int axis = 0; axis < 4; ++axis) {
    grid.digits[axis] = rank % sizes[axis];
    rank /= sizes[axis];
  }
  return grid;
}

// The ranks that share `grid`'s digits off `axes`, in increasing order: the digits along `axes` count up as one
// mixed-radix number, innermost first (Megatron's generate_masked_orthogonal_rank_groups).
std::vector<int> vary(Grid grid, unsigned axes) {
  int count = 1;
  for (int axis = 0; axis < 4; ++axis) {
    if (axes & (1u << axis)) count *= grid.sizes[axis];
  }
  std::vector<int> members;
  members.reserve(count);
  for (int index = 0; index < count; ++index) {
    int rest = index;
    for (int axis = 0; axis < 4; ++axis) {
      if (!(axes & (1u << axis))) continue;
      grid.digits[axis] = rest % grid.sizes[axis];
      rest /= grid.sizes[axis];
    }
    members.push_back(compose(grid));
  }
  return members;
}

}  // namespace

RankLayout::RankLayout(const LayoutSizes& s)
    : tp_(s.tp), pp_(s.pp), dp_(s.dp), cp_(s.cp), ep_(s.ep), etp_(s.etp), edp_(1) {
  const std::array<std::pair<const char*, int>, 6> named{
      {{"tp", s.tp}, {"pp", s.pp}, {"dp", s.dp}, {"cp", s.cp}, {"ep", s.ep}, {"etp", s.etp}}};
  for (const auto& [name, size] : named) {
    if (size < 1) throw std::invalid_argument(std::string("RankLayout: ") + name + " must be >= 1");
  }
  // Megatron-Core (parallel_state.py) derives expert-data-parallel = world / (etp * ep * pp); both grids hold the same
  // ranks per stage, so etp * ep must divide tp * cp * dp.
  const int stage_ranks = tp_ * cp_ * dp_;
  if (stage_ranks % (etp_ * ep_) != 0) {
    throw std::invalid_argument("RankLayout: ep x etp (" + std::to_string(ep_ * etp_) +
                                ") must divide the ranks of a stage, tp x cp x dp (" + std::to_string(stage_ranks) +
                                ")");
  }
  edp_ = stage_ranks / (etp_ * ep_);
}

RankCoord RankLayout::coord_of(int rank) const {
  if (rank < 0 || rank >= world_size()) throw std::out_of_range("RankLayout::coord_of: rank out of range");
  const Grid grid = decompose({tp_, cp_, dp_, pp_}, rank);
  return RankCoord{grid.digits[2], grid.digits[3], grid.digits[0], grid.digits[1]};
}

ExpertCoord RankLayout::expert_coord_of(int rank) const {
  if (rank < 0 || rank >= world_size()) throw std::out_of_range("RankLayout::expert_coord_of: rank out of range");
  const Grid grid = decompose({etp_, ep_, edp_, pp_}, rank);
  return ExpertCoord{grid.digits[2], grid.digits[3], grid.digits[0], grid.digits[1]};
}

int RankLayout::rank_on_stage(int rank, int stage) const {
  if (stage < 0 || stage >= pp_) throw std::out_of_range("RankLayout::rank_on_stage: stage out of range");
  RankCoord coord = coord_of(rank);
  coord.pp = stage;
  return rank_of(coord);
}

std::vector<int> RankLayout::group_members(Group group, int rank) const {
  if (rank < 0 || rank >= world_size()) throw std::out_of_range("RankLayout::group_members: rank out of range");
  const GroupShape shape = shape_of(group);
  const std::array<int, 4> sizes =
      shape.expert_grid ? std::array<int, 4>{etp_, ep_, edp_, pp_} : std::array<int, 4>{tp_, cp_, dp_, pp_};
  std::vector<int> members = vary(decompose(sizes, rank), shape.axes);
  if (group == Group::Embedding && members.size() > 2) members = {members.front(), members.back()};
  if (group == Group::MirrorStages) {  // members are in stage order
    const int stage = coord_of(rank).pp, mirror = pp_ - 1 - stage;
    members = stage == mirror ? std::vector<int>{rank}
                              : std::vector<int>{members[std::min(stage, mirror)], members[std::max(stage, mirror)]};
  }
  return members;
}

int RankLayout::index_in_group(Group group, int rank) const {
  const std::vector<int> members = group_members(group, rank);
  const auto it = std::find(members.begin(), members.end(), rank);
  if (it == members.end()) {
    throw std::invalid_argument("RankLayout::index_in_group: rank " + std::to_string(rank) +
                                " is not a member of its stage's embedding group");
  }
  return static_cast<int>(it - members.begin());
}

std::vector<std::vector<int>> RankLayout::groups(Group group) const {
  std::vector<std::vector<int>> all;
  std::vector<bool> seen(world_size(), false);
  for (int rank = 0; rank < world_size(); ++rank) {
    if (seen[rank]) continue;
    std::vector<int> members = group_members(group, rank);
    if (members.front() != rank) continue;  // a middle stage's Embedding group: listed from its first stage
    for (int member : members) seen[member] = true;
    all.push_back(std::move(members));
  }
  return all;
}

}  // namespace twin::model
