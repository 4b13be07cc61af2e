// The CUDA state one rank's backend and communicator share: its device and its compute stream, where every kernel of
// the rank runs in order. A communicator orders its copies and collectives after the work already on that stream, and
// makes the stream wait for their results, so the interpreter can treat every call as if it had finished.
//
// Deferred waits: a collective that may overlap compute (DP gradient reduction under dp_overlap) does not make the
// compute stream wait at once; its completion event is deferred here with the memory it holds. The backend waits for
// every deferred event before it reads gradients (norm, optimizer) or hands data to the host, and orders any other
// kernel that touches that memory after the collective (an event wait on the compute stream, no host
// synchronization): the interpreter may treat every call as finished.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "exec/comm/deferred_work.hpp"

namespace twin::exec::cuda {

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
  // The compute stream waits for `done` before its next work; `done` is destroyed here.
  void compute_waits(cudaEvent_t done) const;
  // As compute_waits, but only at the next wait_deferred(), or before a kernel touches `memory` (order_touch).
  void defer(cudaEvent_t done, std::string what, std::vector<ByteRange> memory);
  void wait_deferred();
  bool has_deferred() const { return !deferred_.empty(); }
  // The compute stream's next work reads or writes [data, data + bytes): it waits for the deferred collectives that
  // hold that memory (and those issued before them).
  void order_touch(const void* data, std::size_t bytes) {
    if (!deferred_.empty()) order_touch_slow(data, bytes);
  }

 private:
  void order_touch_slow(const void* data, std::size_t bytes);

  int device_;
  cudaStream_t compute_ = nullptr;
  DeferredWork<cudaEvent_t> deferred_;
};

}  // namespace twin::exec::cuda
