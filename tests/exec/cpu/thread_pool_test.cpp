// The CPU backend's thread pool: every index runs once, and an exception in a task reaches the caller.
#include "exec/cpu/thread_pool.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

namespace twin::exec::cpu {
namespace {

TEST(ExecThreadPool, RunsEveryIndexOnceAndRethrows) {
  ThreadPool pool(4);
  std::vector<int> hits(1000, 0);
  pool.parallel_for(1000, [&](int i) { hits[static_cast<std::size_t>(i)] += 1; });
  EXPECT_TRUE(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
  EXPECT_THROW(pool.parallel_for(10,
                                 [](int i) {
                                   if (i == 7) throw std::runtime_error("seven");
                                 }),
               std::runtime_error);
  pool.parallel_for(3, [&](int i) { hits[static_cast<std::size_t>(i)] = 0; });  // still usable
  EXPECT_EQ(hits[0], 0);
}

}  // namespace
}  // namespace twin::exec::cpu
