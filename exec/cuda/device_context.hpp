// The CUDA state one rank's backend and communicator share: its device and its compute stream, where every kernel of
// the rank runs in order. A communicator orders its copies and collectives after the work already on that stream, and
// makes the stream wait for their results, so the interpreter can treat every call as if it had finished.
//
// Work on other streams that still holds the rank's memory:
//   deferred collectives  under dp_overlap the DP gradient reductions do not make the compute stream wait at once;
//                         the backend waits for them before it reads gradients (norm, optimizer) or hands data to the
//                         host (wait_deferred), and orders any other kernel touching their memory after them
//   sends                 a P2P send reads the caller's buffer on its pair's stream (no copy): a kernel that touches
//                         that memory waits for the send, and the buffer's release is put off until it has gone
// Both are event waits on the compute stream, never host synchronizations (order_touch).
//
// Failures: a communicator's watchdog (another thread) records here why the rank's communication failed; every host
// wait of the backend reports it (synchronize, throw_if_failed) instead of hanging or returning garbage.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "exec/comm/deferred_work.hpp"

namespace twin::exec::cuda {

// An event shared by whoever must wait for it; destroyed with the last owner.
using SharedEvent = std::shared_ptr<std::remove_pointer_t<cudaEvent_t>>;
SharedEvent share_event(cudaEvent_t event);

class DeviceContext {
 public:
  explicit DeviceContext(int device);  // cudaSetDevice(device) on this thread, and a new compute stream
  ~DeviceContext();
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  int device() const { return device_; }
  cudaStream_t compute() const { return compute_; }
  void make_current() const;  // cudaSetDevice(device) on the calling thread

  // An event recorded on the compute stream now (work issued so far); the caller destroys it.
  cudaEvent_t record_compute() const;
  // An event recorded on `stream` now (work issued on it so far); the caller destroys it.
  static cudaEvent_t record(cudaStream_t stream);
  // The compute stream waits for `done` before its next work; `done` is destroyed here.
  void compute_waits(cudaEvent_t done) const;

  // --- deferred collectives and sends ------------------------------------------------------------------------------
  // The compute stream waits for `done` before its next work, only at the next wait_deferred(), or before a kernel
  // touches `memory` (order_touch).
  void defer(SharedEvent done, std::string what, std::vector<ByteRange> memory);
  void wait_deferred();
  bool has_deferred() const { return !deferred_.empty(); }
  // A send reads `memory` on another stream until `sent` (the event is shared, the caller may watch it too).
  void hold(SharedEvent sent, std::string what, ByteRange memory);
  // The compute stream's next work reads or writes [data, data + bytes): it waits for the deferred collectives that
  // hold that memory (with those issued before them: they finish in order) and for the sends reading it.
  void order_touch(const void* data, std::size_t bytes) {
    if (!deferred_.empty() || !sends_.empty()) order_touch_slow(data, bytes);
  }
  // A Tensor's block (bytes) goes back to the stream-ordered pool: at once, after the compute stream's work, or once
  // the sends reading it have finished.
  void release(void* block, std::size_t bytes);

  // --- failures ------------------------------------------------------------------------------------------------------
  // Records why the rank's communication failed (the first story wins); thread-safe.
  void fail(const std::string& story);
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  // Throws CommError with the story once one is recorded.
  void throw_if_failed() const;
  // The host waits for the compute stream; a recorded failure is reported before a CUDA error (an aborted NCCL
  // kernel's stream may report one).
  void synchronize();

 private:
  void order_touch_slow(const void* data, std::size_t bytes);
  void free_finished();  // frees the put-off blocks whose sends have finished

  int device_;
  cudaStream_t compute_ = nullptr;
  DeferredWork<SharedEvent> deferred_;
  DeferredWork<SharedEvent> sends_;
  struct PutOff {
    void* block;
    std::vector<SharedEvent> sends;  // every send that read it
  };
  std::vector<PutOff> put_off_;  // blocks freed by their Tensor while a send still read them
  std::atomic<bool> failed_{false};
  mutable std::mutex failure_mutex_;
  std::string failure_;
};

}  // namespace twin::exec::cuda
