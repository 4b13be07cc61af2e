// The threads communicator: deterministic sums in group order, in-place variants, matching by tag, and failures
// that name the ranks (timeouts, a failed peer, mismatched calls).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "exec/comm/threads_communicator.hpp"
#include "tests/exec/comm/all_to_all_pattern.hpp"
#include "tests/exec/exec_test_util.hpp"

namespace twin::exec {
namespace {

// Runs fn(rank, comm) on `world` threads; returns each rank's error message ("" if none).
std::vector<std::string> run_ranks(ThreadsWorld& world, const std::function<void(int, Communicator&)>& fn) {
  std::vector<std::string> errors(static_cast<std::size_t>(world.world_size()));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world.world_size(); ++rank) {
    threads.emplace_back([&, rank] {
      auto comm = world.communicator(rank);
      try {
        fn(rank, *comm);
      } catch (const std::exception& error) {
        errors[static_cast<std::size_t>(rank)] = error.what();
        if (dynamic_cast<const PeerFailure*>(&error) == nullptr) world.abort(rank, error.what());
      }
    });
  }
  for (auto& thread : threads) thread.join();
  return errors;
}

CommGroup everyone(int n) {
  CommGroup g{"world", {}};
  for (int r = 0; r < n; ++r) g.members.push_back(r);
  return g;
}

// Values whose float sum depends on the order: 1e8, 1, -1e8, ...
float value(int rank, int k) {
  return (rank % 3 == 0 ? 1e8f : rank % 3 == 1 ? 1.0f + k : -1e8f) * (k % 2 ? 1 : -1);
}

TEST(ExecThreadsCommunicator, AllReduceSumsInGroupOrderWhateverTheTiming) {
  const int n = 5, count = 37;
  std::vector<float> expected(count);
  for (int k = 0; k < count; ++k) {
    float sum = value(0, k);
    for (int r = 1; r < n; ++r) sum += value(r, k);
    expected[static_cast<std::size_t>(k)] = sum;
  }
  for (int trial = 0; trial < 5; ++trial) {
    ThreadsWorld world(n);
    std::vector<std::vector<float>> results(n);
    const auto errors = run_ranks(world, [&](int rank, Communicator& comm) {
      std::this_thread::sleep_for(std::chrono::microseconds((rank * 7919 + trial * 104729) % 3000));
      std::vector<float> data(count);
      for (int k = 0; k < count; ++k) data[static_cast<std::size_t>(k)] = value(rank, k);
      comm.all_reduce(everyone(n), data.data(), count, DType::F32, "test");
      results[static_cast<std::size_t>(rank)] = data;
    });
    for (int rank = 0; rank < n; ++rank) {
      EXPECT_EQ(errors[static_cast<std::size_t>(rank)], "");
      EXPECT_EQ(results[static_cast<std::size_t>(rank)], expected) << "rank " << rank << " trial " << trial;
    }
  }
}

TEST(ExecThreadsCommunicator, ReduceScatterAndAllGatherInPlace) {
  const int n = 3, count = 4;  // per rank
  ThreadsWorld world(n);
  std::vector<std::vector<double>> scattered(n), gathered(n);
  const auto errors = run_ranks(world, [&](int rank, Communicator& comm) {
    std::vector<double> data(n * count);
    for (int i = 0; i < n * count; ++i) data[static_cast<std::size_t>(i)] = 100.0 * rank + i;
    // reduce-scatter in place: my chunk of the sum lands in my chunk of the input
    comm.reduce_scatter(everyone(n), data.data(), data.data() + rank * count, count, DType::F64, "rs");
    scattered[static_cast<std::size_t>(rank)].assign(data.begin() + rank * count, data.begin() + (rank + 1) * count);
    // all-gather in place from my chunk
    comm.all_gather(everyone(n), data.data() + rank * count, data.data(), count, DType::F64, "ag");
    gathered[static_cast<std::size_t>(rank)] = data;
  });
  for (int rank = 0; rank < n; ++rank) {
    ASSERT_EQ(errors[static_cast<std::size_t>(rank)], "");
    for (int k = 0; k < count; ++k) {
      const int i = rank * count + k;
      EXPECT_EQ(scattered[static_cast<std::size_t>(rank)][static_cast<std::size_t>(k)], 0.0 + 100.0 + 200.0 + 3.0 * i);
    }
    // the concatenation of every rank's reduced chunk, in group order (not only the same on every rank)
    std::vector<double> concatenation;
    for (int member = 0; member < n; ++member) {
      for (int k = 0; k < count; ++k) concatenation.push_back(300.0 + 3.0 * (member * count + k));
    }
    EXPECT_EQ(gathered[static_cast<std::size_t>(rank)], concatenation) << "rank " << rank;
  }
}

// Out of place, on a group whose order is not the ranks' (as a DP group of a TP x DP plan lists its members): chunk i
// of the result is member i's input, whatever that member's rank.
TEST(ExecThreadsCommunicator, AllGatherConcatenatesInGroupOrder) {
  const CommGroup group{"data", {3, 0, 2}};
  const int count = 3;
  ThreadsWorld world(4);
  std::vector<std::vector<float>> gathered(4);
  const auto errors = run_ranks(world, [&](int rank, Communicator& comm) {
    if (rank == 1) return;  // not a member
    std::vector<float> mine(count), all(3 * count, -1.0f);
    for (int k = 0; k < count; ++k) mine[static_cast<std::size_t>(k)] = 10.0f * static_cast<float>(rank) + k;
    comm.all_gather(group, mine.data(), all.data(), count, DType::F32, "ag");
    gathered[static_cast<std::size_t>(rank)] = all;
  });
  const std::vector<float> expected = {30, 31, 32, 0, 1, 2, 20, 21, 22};
  for (int rank : {0, 2, 3}) {
    EXPECT_EQ(errors[static_cast<std::size_t>(rank)], "");
    EXPECT_EQ(gathered[static_cast<std::size_t>(rank)], expected) << "rank " << rank;
  }
}

TEST(ExecThreadsCommunicator, BroadcastBarrierAndSubgroups) {
  ThreadsWorld world(4);
  std::vector<int> seen(4, 0);
  const auto errors = run_ranks(world, [&](int rank, Communicator& comm) {
    int data = rank == 2 ? 42 : -1;
    comm.broadcast(everyone(4), &data, 1, DType::I32, 2, "bcast");
    CommGroup pair{"tensor", {rank & ~1, rank | 1}};  // {0,1} and {2,3}
    float x = static_cast<float>(rank);
    comm.all_reduce(pair, &x, 1, DType::F32, "pair");
    comm.barrier(everyone(4), "barrier");
    seen[static_cast<std::size_t>(rank)] = data * 100 + static_cast<int>(x);
  });
  EXPECT_EQ(seen, (std::vector<int>{4201, 4201, 4205, 4205}));
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(ExecCommunicators, ARankOutsideItsGroupIsNamedWithTheGroup) {
  // One index_in for every communicator (threads, MPI, NCCL): the rank's place in group order, or a CommError.
  const CommGroup data{"data", {3, 11, 19}};
  EXPECT_EQ(index_in(data, 3), 0);
  EXPECT_EQ(index_in(data, 19), 2);
  try {
    index_in(data, 4);
    FAIL() << "no error";
  } catch (const CommError& error) {
    EXPECT_EQ(std::string(error.what()), "rank 4 is not a member of the data group (ranks 3, 11, 19)");
  }
  // A collective called on a group without the caller fails the same way.
  ThreadsWorld world(2);
  const auto errors = run_ranks(world, [&](int rank, Communicator& comm) {
    float x = 1;
    comm.all_reduce(CommGroup{"tensor", {1 - rank}}, &x, 1, DType::F32, "stranger");
  });
  EXPECT_EQ(errors[0], "rank 0 is not a member of the tensor group (rank 1)");
}

TEST(ExecThreadsCommunicator, MessagesMatchByTagNotOrder) {
  ThreadsWorld world(2);
  std::vector<int> got;
  const auto errors = run_ranks(world, [&](int rank, Communicator& comm) {
    if (rank == 0) {
      for (int tag : {3, 1, 2}) comm.send(1, static_cast<std::uint64_t>(tag), &tag, sizeof(tag));
    } else {
      for (int tag : {1, 2, 3}) {
        int value = 0;
        comm.recv(0, static_cast<std::uint64_t>(tag), &value, sizeof(value), "recv");
        got.push_back(value);
      }
    }
  });
  EXPECT_EQ(got, (std::vector<int>{1, 2, 3}));
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(ExecThreadsCommunicator, ACollectiveTimesOutNamingTheMissingRanks) {
  ThreadsWorld world(4, CommOptions{0.3});
  const auto start = std::chrono::steady_clock::now();
  const auto errors = run_ranks(world, [&](int rank, Communicator& comm) {
    if (rank == 1 || rank == 3) return;  // dead ranks: never arrive
    float x = 1;
    comm.all_reduce(everyone(4), &x, 1, DType::F32, "all_reduce gradients (layer 3)");
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 5.0);
  const std::string& e = errors[0].empty() ? errors[2] : errors[0];
  EXPECT_NE(e.find("timed out after 0.3 s"), std::string::npos) << e;
  EXPECT_NE(e.find("ranks 1, 3 did not arrive"), std::string::npos) << e;
  EXPECT_NE(e.find("all_reduce gradients (layer 3) on the world group"), std::string::npos) << e;
}

TEST(ExecThreadsCommunicator, ARecvTimesOutNamingTheSender) {
  ThreadsWorld world(2, CommOptions{0.2});
  const auto errors = run_ranks(world, [&](int rank, Communicator& comm) {
    if (rank == 0) return;
    float x;
    comm.recv(0, 7, &x, sizeof(x), "recv forward activation");
  });
  EXPECT_NE(errors[1].find("rank 1: recv recv forward activation from rank 0 timed out"), std::string::npos)
      << errors[1];
  EXPECT_NE(errors[1].find("rank 0 never sent it"), std::string::npos) << errors[1];
}

TEST(ExecThreadsCommunicator, ATimeoutFollowsTheChainOfBlockedRanksToTheDeadOne) {
  // Rank 2 is dead; rank 1 waits for it; rank 0 waits for rank 1 and times out first: its message must lead to rank 2,
  // not stop at rank 1, which is only a victim.
  ThreadsWorld world(3, CommOptions{2.0});
  const auto errors = run_ranks(world, [&](int rank, Communicator& comm) {
    float x;
    if (rank == 0) comm.recv(1, 7, &x, sizeof(x), "recv backward gradient");
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));  // rank 0's deadline comes first
      comm.recv(2, 7, &x, sizeof(x), "recv backward gradient");
    }
  });
  EXPECT_NE(errors[0].find("rank 1 never sent it"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("rank 1 is blocked in turn, on a chain that ends at rank 2 (in no communication"),
            std::string::npos)
      << errors[0];
  // A collective names its missing member's chain too.
  ThreadsWorld collective_world(3, CommOptions{2.0});
  const auto collective_errors = run_ranks(collective_world, [&](int rank, Communicator& comm) {
    float x = 1;
    if (rank == 0) comm.all_reduce(CommGroup{"pair", {0, 1}}, &x, 1, DType::F32, "all_reduce");
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      comm.recv(2, 7, &x, sizeof(x), "recv forward activation");
    }
  });
  EXPECT_NE(collective_errors[0].find("rank 1 did not arrive; rank 1 is blocked in turn, on a chain that ends at "
                                      "rank 2"),
            std::string::npos)
      << collective_errors[0];
}

TEST(ExecThreadsCommunicator, AVictimThatTimesOutFirstIsTheStoryItsWaitersTell) {
  // Rank 2 is dead; rank 1 waits for it and times out first; rank 0 waits for rank 1 and would time out 0.5 s later.
  // Rank 1 is slow to report (nobody calls abort for it here): its timeout alone must tell rank 0 why rank 1 never
  // sent, rather than leave rank 0 to time out on a rank that, no longer waiting, would look merely slow.
  ThreadsWorld world(3, CommOptions{1.0});
  std::string errors[2];
  std::thread victim([&] {
    auto comm = world.communicator(1);
    float x;
    try {
      comm->recv(2, 7, &x, sizeof(x), "recv backward gradient");
    } catch (const std::exception& error) {
      errors[1] = error.what();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  });
  std::thread waiter([&] {
    auto comm = world.communicator(0);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    float x;
    try {
      comm->recv(1, 7, &x, sizeof(x), "recv backward gradient");
    } catch (const PeerFailure& error) {
      errors[0] = std::string("abandoned: ") + error.what();
    } catch (const std::exception& error) {
      errors[0] = error.what();
    }
  });
  victim.join();
  waiter.join();
  EXPECT_NE(errors[1].find("rank 1: recv recv backward gradient from rank 2 timed out after 1 s"), std::string::npos)
      << errors[1];
  EXPECT_EQ(errors[0].rfind("abandoned: rank 0: ", 0), 0u) << errors[0];
  EXPECT_NE(errors[0].find("rank 1 failed: rank 1: recv recv backward gradient from rank 2 timed out"),
            std::string::npos)
      << errors[0];
}

TEST(ExecThreadsCommunicator, AFailedRankMakesItsPeersFailFast) {
  ThreadsWorld world(3, CommOptions{60});
  const auto start = std::chrono::steady_clock::now();
  const auto errors = run_ranks(world, [&](int rank, Communicator& comm) {
    if (rank == 2) throw std::runtime_error("out of memory in the MLP");
    float x = 1;
    comm.all_reduce(everyone(3), &x, 1, DType::F32, "all_reduce");
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 5.0);  // not the 60 s timeout
  EXPECT_NE(errors[0].find("rank 2 failed: out of memory in the MLP"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("rank 2 failed"), std::string::npos) << errors[1];
}

TEST(ExecThreadsCommunicator, MismatchedCollectivesAreReported) {
  ThreadsWorld world(2, CommOptions{5});
  const auto errors = run_ranks(world, [&](int rank, Communicator& comm) {
    float x[4] = {};
    if (rank == 0) {
      comm.all_reduce(everyone(2), x, 4, DType::F32, "a");
    } else {
      comm.all_gather(everyone(2), x, x, 2, DType::F32, "b");
    }
  });
  const std::string both = errors[0] + errors[1];
  EXPECT_NE(both.find("where another member called"), std::string::npos) << both;
}

// Uneven chunks (some empty) reach the right member in the right place, on the world and on a subgroup, twice.
TEST(ExecThreadsCommunicator, AllToAllDeliversEachPeerItsOwnChunk) {
  for (int n : {1, 2, 3, 5}) {
    ThreadsWorld world(n);
    const auto errors = run_ranks(world, [&](int rank, Communicator& comm) {
      std::string problem = testing::check_all_to_all(comm, everyone(n));
      CommGroup odd{"expert", {}};
      for (int r = 1; r < n; r += 2) odd.members.push_back(r);
      if (problem.empty() && rank % 2 == 1) problem = testing::check_all_to_all(comm, odd);
      if (problem.empty()) problem = testing::check_all_to_all(comm, everyone(n));
      if (!problem.empty()) throw CommError(problem);
    });
    for (int rank = 0; rank < n; ++rank) EXPECT_EQ(errors[static_cast<std::size_t>(rank)], "") << "n " << n;
  }
}

// A receiver that expects another size than its sender sends, or counts of the wrong length, fail naming the ranks.
TEST(ExecThreadsCommunicator, AllToAllSizesThatDisagreeAreReported) {
  ThreadsWorld world(2);
  const auto errors = run_ranks(world, [&](int rank, Communicator& comm) {
    std::vector<float> in(4, 1.0f), out(8, 0.0f);
    const std::vector<std::size_t> send = {1, 2},
                                   recv = rank == 1 ? std::vector<std::size_t>{3, 1} : std::vector<std::size_t>{1, 2};
    comm.all_to_all(everyone(2), in.data(), send, out.data(), recv, DType::F32, "dispatch");
  });
  EXPECT_NE(errors[1].find("rank 1: all_to_all on the world group (ranks 0, 1): rank 0 sends it 2 elements, it "
                           "expects 3"),
            std::string::npos)
      << errors[1];

  ThreadsWorld other(2);
  const auto short_counts = run_ranks(other, [&](int, Communicator& comm) {
    float x = 0;
    comm.all_to_all(everyone(2), &x, {1}, &x, {1, 0}, DType::F32, "combine");
  });
  EXPECT_NE(short_counts[0].find("all_to_all combine on the world group (ranks 0, 1): 1 chunk counts for 2 members"),
            std::string::npos)
      << short_counts[0];
}

#ifdef TWIN_MPI_ALL_TO_ALL_CHECK
// The MPI communicator's all_to_all on 3 processes (tests/exec/comm/mpi_all_to_all_check.cpp).
TEST(ExecMpiCommunicator, AllToAllDeliversEachPeerItsOwnChunk) {
  if (!testing::on_path("mpirun"))
    GTEST_SKIP() << "mpirun not found (apt install openmpi-bin): the MPI all_to_all not tested";
  std::vector<std::string> args = {"mpirun", "-np", "3", "--oversubscribe", "--bind-to", "none"};
  if (geteuid() == 0) args.emplace_back("--allow-run-as-root");
  args.emplace_back(TWIN_MPI_ALL_TO_ALL_CHECK);
  const std::string log = ::testing::TempDir() + "/mpi_all_to_all.log";
  ASSERT_EQ(testing::run_command(args, log), 0) << testing::read_text(log);
  const std::string text = testing::read_text(log);
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_NE(text.find("rank " + std::to_string(rank) + ": all_to_all ok"), std::string::npos) << text;
  }
}
#endif

}  // namespace
}  // namespace twin::exec
