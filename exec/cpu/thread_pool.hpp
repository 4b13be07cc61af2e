// A small fixed pool for the CPU backend's row-independent kernels (attention heads, GELU, layernorm rows): the calling
// thread plus threads-1 workers share the indices of one parallel_for. Each index writes its own outputs, so results do
// not depend on the number of threads or on timing.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace twin::exec::cpu {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  // fn(i) for every i in [0, n); returns when all have run; rethrows the first exception.
  void parallel_for(int n, const std::function<void(int)>& fn);

 private:
  void worker_loop();
  void drain(std::unique_lock<std::mutex>& lock);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* job_ = nullptr;
  int job_size_ = 0;
  int next_index_ = 0;
  int unfinished_ = 0;  // indices not finished yet
  std::uint64_t generation_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
};

}  // namespace twin::exec::cpu
