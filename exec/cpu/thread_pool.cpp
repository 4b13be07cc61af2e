#include "exec/cpu/thread_pool.hpp"

namespace twin::exec::cpu {

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& worker : workers_) worker.join();
}

// Runs indices of the current job until none is left; `lock` is held on entry and on return, released around fn.
void ThreadPool::drain(std::unique_lock<std::mutex>& lock) {
  while (job_ != nullptr && next_index_ < job_size_) {
    const int index = next_index_++;
    const auto* job = job_;
    lock.unlock();
    std::exception_ptr error;
    try {
      (*job)(index);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (error && !error_) error_ = error;
    if (--unfinished_ == 0) done_.notify_all();
  }
}

void ThreadPool::worker_loop() {
  std::uint64_t seen = 0;
  std::unique_lock lock(mutex_);
  while (true) {
    wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
    if (stopping_) return;
    seen = generation_;
    drain(lock);
  }
}

void ThreadPool::parallel_for(int n, const std::function<void(int)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    for (int i = 0; i < n; ++i) fn(i);
    return;
  }
  std::unique_lock lock(mutex_);
  job_ = &fn;
  job_size_ = n;
  next_index_ = 0;
  unfinished_ = n;
  error_ = nullptr;
  ++generation_;
  wake_.notify_all();
  drain(lock);
  done_.wait(lock, [&] { return unfinished_ == 0; });
  job_ = nullptr;
  if (error_) std::rethrow_exception(error_);
}

}  // namespace twin::exec::cpu
