// A thread that watches work a device runs on its own (NCCL kernels waiting for peers), so that a dead or stuck peer
// ends the run within the timeout instead of hanging it: a host thread blocked in a stream synchronization cannot
// time out by itself.
//
// Each watched item is late `timeout_s` after it was issued. The first late item, or the first error `health`
// reports (polled while items are in flight), calls `on_failure` once with the story, from the watchdog's thread:
// NcclCommunicator aborts its NCCL communicators there (ncclCommAbort ends their kernels, so the blocked
// synchronization returns) and records the story for the rank's next call to throw. After a failure, items are
// released as they finish, and all of them one timeout later whatever their state.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <list>
#include <mutex>
#include <string>
#include <thread>

namespace twin::exec {

class Watchdog {
 public:
  struct Hooks {
    std::function<std::string()> health;                 // "" while healthy, else what failed
    std::function<void(const std::string&)> on_failure;  // called once
  };

  Watchdog(double timeout_s, Hooks hooks, std::chrono::microseconds poll = std::chrono::milliseconds(1));
  ~Watchdog();  // releases every item (without waiting for them) and stops the thread
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Watches one item from now: done() is true once it has finished (called from the watchdog's thread); release() is
  // called once, after done() or when given up; `what` names it in the story ("all_reduce ... on the tensor group").
  void watch(std::function<bool()> done, std::function<void()> release, std::string what);
  // Blocks until no item is in flight (each ends, or is given up one timeout after a failure, or is late and fails).
  void wait_idle();
  // The failure's story, "" while none.
  std::string failure() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Item {
    std::function<bool()> done;
    std::function<void()> release;
    std::string what;
    Clock::time_point deadline;
  };

  void run();
  void sweep(std::unique_lock<std::mutex>& lock);

  const Clock::duration timeout_;
  const std::chrono::microseconds poll_;
  Hooks hooks_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::list<Item> items_;
  std::string failure_;
  Clock::time_point give_up_ = Clock::time_point::max();  // after a failure: release whatever is left then
  bool stop_ = false;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace twin::exec
