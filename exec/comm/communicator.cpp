#include "exec/comm/communicator.hpp"

#include <fmt/format.h>

#include "model/plan/ranks.hpp"

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

std::vector<std::size_t> chunk_offsets(const CommGroup& group, int rank, const std::vector<std::size_t>& counts,
                                       std::string_view label) {
  if (counts.size() != group.members.size()) {
    throw CommError(fmt::format("rank {}: all_to_all {} on the {} group ({}): {} chunk counts for {} members", rank,
                                label, group.kind, format_ranks(group.members), counts.size(), group.members.size()));
  }
  std::vector<std::size_t> offsets(counts.size() + 1, 0);
  for (std::size_t j = 0; j < counts.size(); ++j) offsets[j + 1] = offsets[j] + counts[j];
  return offsets;
}

}  // namespace twin::exec
