#include "exec/comm/watchdog.hpp"

#include <fmt/core.h>

#include <utility>
#include <vector>

namespace twin::exec {

Watchdog::Watchdog(double timeout_s, Hooks hooks, std::chrono::microseconds poll)
    : timeout_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s))),
      poll_(poll),
      hooks_(std::move(hooks)),
      thread_([this] { run(); }) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();
  for (Item& item : items_) item.release();  // CUDA releases an event's resources once it completes
}

void Watchdog::watch(std::function<bool()> done, std::function<void()> release, std::string what) {
  {
    std::lock_guard lock(mutex_);
    items_.push_back({std::move(done), std::move(release), std::move(what), Clock::now() + timeout_});
  }
  changed_.notify_all();
}

void Watchdog::wait_idle() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return items_.empty(); });
}

std::string Watchdog::failure() const {
  std::lock_guard lock(mutex_);
  return failure_;
}

void Watchdog::run() {
  std::unique_lock lock(mutex_);
  while (!stop_) {
    if (items_.empty()) {
      changed_.wait(lock, [&] { return stop_ || !items_.empty(); });
      continue;
    }
    sweep(lock);
    changed_.wait_for(lock, poll_);
  }
}

// One pass over the items in flight, under `lock` (released around the hooks and the items' calls, which may take
// time: a query of the device, an abort).
void Watchdog::sweep(std::unique_lock<std::mutex>& lock) {
  const Clock::time_point now = Clock::now();
  std::vector<std::function<void()>> finished;
  std::string story;
  for (auto it = items_.begin(); it != items_.end();) {
    if (it->done() || now >= give_up_) {
      finished.push_back(std::move(it->release));
      it = items_.erase(it);
      continue;
    }
    if (failure_.empty() && story.empty() && now >= it->deadline) {
      story = fmt::format("{} did not finish within {} s (a peer dead, stuck or out of step)", it->what,
                          std::chrono::duration<double>(timeout_).count());
    }
    ++it;
  }
  const bool check_health = failure_.empty() && story.empty() && !items_.empty() && hooks_.health;
  lock.unlock();
  for (auto& release : finished) release();
  if (check_health) story = hooks_.health();
  lock.lock();
  if (!story.empty() && failure_.empty()) {
    failure_ = story;
    give_up_ = Clock::now() + timeout_;
    lock.unlock();
    if (hooks_.on_failure) hooks_.on_failure(story);
    lock.lock();
  }
  if (!finished.empty() && items_.empty()) changed_.notify_all();
}

}  // namespace twin::exec
