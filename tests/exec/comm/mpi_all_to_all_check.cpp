// Run under mpirun: the MPI communicator's all_to_all on the whole world and on the even ranks, checked element by
// element (tests/exec/comm/all_to_all_pattern.hpp). Prints "all_to_all ok" on every rank that saw the right data.
#include <cstdio>
#include <exception>

#include "exec/comm/mpi_communicator.hpp"
#include "tests/exec/comm/all_to_all_pattern.hpp"

int main() {
  using namespace twin::exec;
  try {
    auto comm = make_mpi_communicator({.timeout_s = 30});
    CommGroup world{"world", {}}, even{"data", {}};
    for (int r = 0; r < comm->world_size(); ++r) {
      world.members.push_back(r);
      if (r % 2 == 0) even.members.push_back(r);
    }
    std::string problem = testing::check_all_to_all(*comm, world);
    if (problem.empty() && comm->rank() % 2 == 0) problem = testing::check_all_to_all(*comm, even);
    if (problem.empty()) problem = testing::check_all_to_all(*comm, world);  // a second call on the same tags
    if (!problem.empty()) {
      std::fprintf(stderr, "%s\n", problem.c_str());
      return 1;
    }
    comm->barrier(world, "end");
    std::printf("rank %d: all_to_all ok\n", comm->rank());
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s\n", error.what());
    return 1;
  }
}
