// The threads launcher: every rank a thread of this process, and a watchdog on them.
//
// A thread cannot be killed. When a rank fails, the others learn it at their next communication (a PeerFailure) and
// return; a rank that is stuck (blocked forever outside any communication, stopped by a debugger) never does. So the
// launcher does not join blindly: once the run has failed (a peer timed out waiting for the stuck rank, or a rank
// raised), every rank blocked in a communication wakes and returns at once, and a computing one at its next; a rank
// that has not returned kStuckGrace_s after the failure and has started no op for as long, or any rank still out one
// timeout after the failure, is named stuck. train_threads then throws RanksStuck without joining it:
// the caller must end the process (twin run prints the error and calls _Exit with the exit status a failed MPI job
// has, 1).
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/core.h>
#include <fmt/format.h>

#include "exec/checkpoint/checkpoint.hpp"
#include "exec/comm/threads_communicator.hpp"
#include "exec/core/clock.hpp"
#include "exec/core/errors.hpp"
#include "exec/train/trainer.hpp"

namespace twin::exec {

namespace {

// How long after a failure a rank that makes no progress is given to return (a woken rank returns in milliseconds; a
// stuck one never does): the launcher ends this long after the peers' timeout.
constexpr double kStuckGrace_s = 1.0;

// What the rank threads share with the launcher. Held by shared_ptr: a stuck thread that wakes after train_threads
// gave up on it still finds this alive.
struct Launch {
  explicit Launch(int world)
      : returned(static_cast<std::size_t>(world), false), progress(static_cast<std::size_t>(world)) {}
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<bool> returned;
  std::vector<RankProgress> progress;
  std::exception_ptr root_failure, peer_failure;
  double failed_at_s = 0;  // when the first failure was recorded
  TrainResult result;
};

std::string stuck_line(int rank, const RankProgress& progress, double now) {
  const int step = progress.step.load(std::memory_order_relaxed), op = progress.op.load(std::memory_order_relaxed);
  const double idle = now - progress.at_s.load(std::memory_order_relaxed);
  const std::string where = step < 0 ? std::string("before its first step")
                            : op < 0 ? fmt::format("at the start of step {}", step + 1)
                                     : fmt::format("in op #{} of step {}", op, step + 1);
  return fmt::format(
      "rank {} is stuck: it has not returned since the run failed and has made no progress for {:.1f} s ({}); its "
      "thread cannot be stopped, so twin exits without it",
      rank, idle, where);
}

}  // namespace

TrainResult train_threads(const model::Program& program, const TextDataset& data, const TrainOptions& options) {
  const int world = program.layout.world_size();
  auto threads_world = std::make_shared<ThreadsWorld>(world, CommOptions{options.comm_timeout_s});
  const int threads = options.threads_per_rank > 0 ? options.threads_per_rank : default_threads_per_rank(world);
  std::optional<CheckpointLock> lock;
  if (!options.checkpoint_dir.empty()) lock.emplace(options.checkpoint_dir);
  auto launch = std::make_shared<Launch>(world);
  const double start_s = now_s();
  for (RankProgress& p : launch->progress) p.at_s.store(start_s);

  std::vector<std::thread> ranks;
  for (int rank = 0; rank < world; ++rank) {
    ranks.emplace_back([&program, &data, &options, threads, launch, threads_world, rank] {
      try {
        auto comm = threads_world->communicator(rank);
        run_rank(program, data, options, *comm, threads, true, rank == 0 ? &launch->result : nullptr,
                 &launch->progress[static_cast<std::size_t>(rank)]);
      } catch (const PeerFailure&) {
        std::lock_guard lock_failures(launch->mutex);
        if (!launch->peer_failure) launch->peer_failure = std::current_exception();
      } catch (const std::exception& error) {
        {
          std::lock_guard lock_failures(launch->mutex);
          if (!launch->root_failure) launch->root_failure = std::current_exception();
          if (launch->failed_at_s == 0) launch->failed_at_s = now_s();
        }
        threads_world->abort(rank, error.what());
      }
      std::lock_guard lock_returned(launch->mutex);
      launch->returned[static_cast<std::size_t>(rank)] = true;
      if (launch->failed_at_s == 0 && (launch->root_failure || launch->peer_failure)) launch->failed_at_s = now_s();
      launch->changed.notify_all();
    });
  }

  // The watchdog: wait for every rank; after a failure, no longer than the stuck ones deserve.
  const double timeout = options.comm_timeout_s, grace = std::min(timeout, kStuckGrace_s);
  std::vector<int> stuck;
  {
    std::unique_lock lock_launch(launch->mutex);
    while (true) {
      if (std::all_of(launch->returned.begin(), launch->returned.end(), [](bool r) { return r; })) break;
      launch->changed.wait_for(lock_launch, std::chrono::milliseconds(50));
      if (launch->failed_at_s == 0) continue;
      const double now = now_s(), since_failure = now - launch->failed_at_s;
      if (since_failure < grace) continue;
      for (int r = 0; r < world; ++r) {
        const auto index = static_cast<std::size_t>(r);
        if (launch->returned[index]) continue;
        const double idle = now - launch->progress[index].at_s.load(std::memory_order_relaxed);
        if (idle >= grace || since_failure >= timeout) stuck.push_back(r);
      }
      if (!stuck.empty()) break;
    }
  }
  if (stuck.empty()) {
    for (auto& thread : ranks) thread.join();
    if (launch->root_failure) std::rethrow_exception(launch->root_failure);
    if (launch->peer_failure) std::rethrow_exception(launch->peer_failure);
    return std::move(launch->result);
  }

  // Give up on the stuck ranks: join those that returned, leave the rest (the process ends next).
  std::vector<std::string> lines;
  std::vector<bool> returned;
  {
    std::lock_guard lock_launch(launch->mutex);
    returned = launch->returned;
    try {
      if (launch->root_failure) std::rethrow_exception(launch->root_failure);
      if (launch->peer_failure) std::rethrow_exception(launch->peer_failure);
    } catch (const std::exception& error) {
      lines.emplace_back(error.what());
    }
    const double now = now_s();
    for (int r : stuck) lines.push_back(stuck_line(r, launch->progress[static_cast<std::size_t>(r)], now));
  }
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    if (returned[r]) {
      ranks[r].join();
    } else {
      ranks[r].detach();
    }
  }
  throw RanksStuck(fmt::format("{}", fmt::join(lines, "\n")), lines);
}

}  // namespace twin::exec
