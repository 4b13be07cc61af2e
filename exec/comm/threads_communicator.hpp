// Ranks as threads of one process: a ThreadsWorld holds the rendezvous points and mailboxes; each rank's thread uses
// its own Communicator from world.communicator(rank).
//
// A collective is a rendezvous: the members post their buffer pointers under the group's lock; once all have arrived,
// member i computes chunk i of the result from every member's input (summing in group-index order) and writes it
// where each member wants it; nobody leaves before everyone has finished reading. No thread timing enters the
// arithmetic, so the results are deterministic.
#pragma once

#include <memory>

#include "exec/comm/communicator.hpp"

namespace twin::exec {

class ThreadsWorld {
 public:
  ThreadsWorld(int world_size, CommOptions options = {});
  ~ThreadsWorld();
  ThreadsWorld(const ThreadsWorld&) = delete;
  ThreadsWorld& operator=(const ThreadsWorld&) = delete;

  int world_size() const;
  // The communicator of `rank`, to be used by one thread.
  std::unique_ptr<Communicator> communicator(int rank);
  // Wakes every blocked rank with a PeerFailure naming `rank` and `reason` (what a failing rank's abort() does).
  void abort(int rank, std::string_view reason);

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace twin::exec
