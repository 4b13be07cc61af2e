#include "exec/comm/communicator.hpp"

#include <fmt/format.h>

#include "model/ranks.hpp"

namespace twin::exec {

std::string format_ranks(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "));
}

int index_in(const CommGroup& group, int rank) {
  const int index = model::index_in(group.members, rank);
  if (index < 0) {
    throw CommError(
        fmt::format("rank {} is not a member of the {} group ({})", rank, group.kind, format_ranks(group.members)));
  }
  return index;
}

}  // namespace twin::exec
