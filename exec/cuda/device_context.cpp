#include "exec/cuda/device_context.hpp"

#include <algorithm>

#include "exec/core/errors.hpp"
#include "kernels/cuda/check.cuh"

namespace twin::exec::cuda {

SharedEvent share_event(cudaEvent_t event) {
  return SharedEvent(event, [](cudaEvent_t e) { cudaEventDestroy(e); });
}

DeviceContext::DeviceContext(int device) : device_(device) {
  make_current();
  TWIN_CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
}

DeviceContext::~DeviceContext() {
  // destructors do not throw: errors here are left for the process's end
  cudaSetDevice(device_);
  deferred_.take_all();
  sends_.take_all();
  for (PutOff& p : put_off_) {
    for (const SharedEvent& sent : p.sends) cudaEventSynchronize(sent.get());
    cudaFreeAsync(p.block, compute_);
  }
  put_off_.clear();
  if (compute_ != nullptr) {
    cudaStreamSynchronize(compute_);
    cudaStreamDestroy(compute_);
  }
}

void DeviceContext::make_current() const {
  TWIN_CUDA_CHECK(cudaSetDevice(device_));
}

cudaEvent_t DeviceContext::record(cudaStream_t stream) {
  cudaEvent_t event = nullptr;
  TWIN_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  const cudaError_t status = cudaEventRecord(event, stream);
  if (status != cudaSuccess) cudaEventDestroy(event);
  TWIN_CUDA_CHECK(status);
  return event;
}

cudaEvent_t DeviceContext::record_compute() const {
  return record(compute_);
}

void DeviceContext::compute_waits(cudaEvent_t done) const {
  const cudaError_t status = cudaStreamWaitEvent(compute_, done, 0);
  cudaEventDestroy(done);  // released once the wait is enqueued
  TWIN_CUDA_CHECK(status);
}

void DeviceContext::defer(SharedEvent done, std::string what, std::vector<ByteRange> memory) {
  deferred_.add({done, std::move(what), std::move(memory)});
}

void DeviceContext::wait_deferred() {
  for (auto& entry : deferred_.take_all()) TWIN_CUDA_CHECK(cudaStreamWaitEvent(compute_, entry.done.get(), 0));
}

void DeviceContext::hold(SharedEvent sent, std::string what, ByteRange memory) {
  sends_.add({std::move(sent), std::move(what), {memory}});
}

void DeviceContext::order_touch_slow(const void* data, std::size_t bytes) {
  for (auto& entry : deferred_.take_through_overlapping(data, bytes)) {
    TWIN_CUDA_CHECK(cudaStreamWaitEvent(compute_, entry.done.get(), 0));
  }
  for (auto& entry : sends_.take_overlapping(data, bytes)) {
    TWIN_CUDA_CHECK(cudaStreamWaitEvent(compute_, entry.done.get(), 0));
  }
}

void DeviceContext::release(void* block, std::size_t bytes) {
  free_finished();
  PutOff put_off{block, {}};
  for (auto& entry : sends_.take_overlapping(block, bytes)) put_off.sends.push_back(std::move(entry.done));
  if (put_off.sends.empty()) {
    cudaFreeAsync(block, compute_);  // stream-ordered: after every kernel already issued that may use it
  } else {
    put_off_.push_back(std::move(put_off));
  }
}

void DeviceContext::free_finished() {
  const auto end = std::remove_if(put_off_.begin(), put_off_.end(), [&](const PutOff& p) {
    for (const SharedEvent& sent : p.sends) {
      if (cudaEventQuery(sent.get()) != cudaSuccess) return false;
    }
    cudaFreeAsync(p.block, compute_);
    return true;
  });
  put_off_.erase(end, put_off_.end());
}

void DeviceContext::fail(const std::string& story) {
  std::lock_guard lock(failure_mutex_);
  if (failed_.load(std::memory_order_relaxed)) return;
  failure_ = story;
  failed_.store(true, std::memory_order_release);
}

void DeviceContext::throw_if_failed() const {
  if (!failed()) return;
  std::lock_guard lock(failure_mutex_);
  throw CommError(failure_);
}

void DeviceContext::synchronize() {
  const cudaError_t status = cudaStreamSynchronize(compute_);
  throw_if_failed();
  TWIN_CUDA_CHECK(status);
}

}  // namespace twin::exec::cuda
