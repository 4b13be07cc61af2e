#include "exec/cuda/device_context.hpp"

#include "kernels/cuda/check.cuh"

namespace twin::exec::cuda {

DeviceContext::DeviceContext(int device) : device_(device) {
  make_current();
  TWIN_CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
}

DeviceContext::~DeviceContext() {
  // destructors do not throw: errors here are left for the process's end
  cudaSetDevice(device_);
  for (auto& entry : deferred_.take_all()) cudaEventDestroy(entry.done);
  if (compute_ != nullptr) {
    cudaStreamSynchronize(compute_);
    cudaStreamDestroy(compute_);
  }
}

void DeviceContext::make_current() const {
  TWIN_CUDA_CHECK(cudaSetDevice(device_));
}

cudaEvent_t DeviceContext::record_compute() const {
  cudaEvent_t event = nullptr;
  TWIN_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  TWIN_CUDA_CHECK(cudaEventRecord(event, compute_));
  return event;
}

void DeviceContext::compute_waits(cudaEvent_t done) const {
  const cudaError_t status = cudaStreamWaitEvent(compute_, done, 0);
  cudaEventDestroy(done);  // released once the wait is enqueued
  TWIN_CUDA_CHECK(status);
}

void DeviceContext::defer(cudaEvent_t done, std::string what, std::vector<ByteRange> memory) {
  deferred_.add({done, std::move(what), std::move(memory)});
}

void DeviceContext::wait_deferred() {
  for (auto& entry : deferred_.take_all()) compute_waits(entry.done);
}

void DeviceContext::order_touch_slow(const void* data, std::size_t bytes) {
  for (auto& entry : deferred_.take_through_overlapping(data, bytes)) compute_waits(entry.done);
}

}  // namespace twin::exec::cuda
