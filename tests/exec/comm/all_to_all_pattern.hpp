// A content check of Communicator::all_to_all shared by the threads test and the MPI check program: every member sends
// every other chunks of its own size (zero included), with values that name sender, receiver and position.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "exec/comm/communicator.hpp"

namespace twin::exec::testing {

// Elements member `from` sends member `to` (of n): uneven, and zero for some pairs.
inline std::size_t a2a_count(int from, int to, int n) {
  return static_cast<std::size_t>((from * 3 + to * 5 + n) % 4);
}
inline float a2a_value(int from, int to, std::size_t k) {
  return 1000.0f * static_cast<float>(from) + 10.0f * static_cast<float>(to) + static_cast<float>(k);
}

// Runs one all_to_all on `group` from this rank; returns "" when every received element is the one its sender meant.
inline std::string check_all_to_all(Communicator& comm, const CommGroup& group) {
  const int n = static_cast<int>(group.members.size());
  const int me = index_in(group, comm.rank());
  std::vector<std::size_t> send_counts(n), recv_counts(n);
  std::vector<float> in;
  for (int j = 0; j < n; ++j) {
    send_counts[j] = a2a_count(me, j, n);
    recv_counts[j] = a2a_count(j, me, n);
    for (std::size_t k = 0; k < send_counts[j]; ++k) in.push_back(a2a_value(me, j, k));
  }
  std::vector<float> out(chunk_offsets(group, comm.rank(), recv_counts, "test").back(), -1.0f);
  comm.all_to_all(group, in.data(), send_counts, out.data(), recv_counts, DType::F32, "test");
  std::size_t at = 0;
  for (int j = 0; j < n; ++j) {
    for (std::size_t k = 0; k < recv_counts[j]; ++k, ++at) {
      if (out[at] != a2a_value(j, me, k)) {
        return fmt::format("rank {}: element {} of the chunk from member {} is {}, expected {}", comm.rank(), k, j,
                           out[at], a2a_value(j, me, k));
      }
    }
  }
  return {};
}

}  // namespace twin::exec::testing
