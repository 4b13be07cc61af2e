#include "exec/cuda/staging_communicator.hpp"

#include <cuda_bf16.h>

#include <vector>

#include "exec/core/check.hpp"
#include "kernels/cpu/cast.hpp"
#include "kernels/cuda/check.cuh"

namespace twin::exec::cuda {

bool is_device_pointer(const void* p) {
  if (p == nullptr) return false;
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
    cudaGetLastError();  // not a pointer CUDA knows: host memory
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

namespace {

// Host copies of device data, on the rank's compute stream, synchronized: the data is on the host when they return.
class Staging {
 public:
  explicit Staging(DeviceContext& context) : context_(context) {}

  // every kernel issued so far on the compute stream has finished (the device data is complete)
  void settle() { TWIN_CUDA_CHECK(cudaStreamSynchronize(context_.compute())); }

  std::vector<std::byte> download(const void* device, std::size_t bytes) {
    std::vector<std::byte> host(bytes);
    if (bytes > 0) {
      TWIN_CUDA_CHECK(cudaMemcpyAsync(host.data(), device, bytes, cudaMemcpyDeviceToHost, context_.compute()));
      settle();
    }
    return host;
  }
  void upload(void* device, const void* host, std::size_t bytes) {
    if (bytes == 0) return;
    TWIN_CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, context_.compute()));
    settle();  // the host buffer is the caller's temporary
  }

  // bf16 device data widened to fp32 on the host, and back (rounded to nearest even, as kernels/cpu rounds)
  std::vector<float> download_widened(const void* device, std::size_t count) {
    std::vector<float> values(count);
    const std::vector<std::byte> bits = download(device, count * sizeof(std::uint16_t));
    kernels::cpu::cast_bf16_to_float(values.data(), reinterpret_cast<const std::uint16_t*>(bits.data()), count);
    return values;
  }
  void upload_rounded(void* device, const std::vector<float>& values) {
    std::vector<std::uint16_t> bits(values.size());
    kernels::cpu::cast_float_to_bf16(bits.data(), values.data(), values.size());
    upload(device, bits.data(), bits.size() * sizeof(std::uint16_t));
  }

 private:
  DeviceContext& context_;
};

}  // namespace

StagingCommunicator::StagingCommunicator(Communicator& host, DeviceContext& context)
    : ForwardingCommunicator(host), context_(context), name_(std::string(host.name()) + "+cuda-staging") {}

void StagingCommunicator::all_reduce(const CommGroup& group, void* data, std::size_t count, DType dtype,
                                     std::string_view label) {
  if (!is_device_pointer(data)) return host().all_reduce(group, data, count, dtype, label);
  context_.make_current();
  Staging staging(context_);
  staging.settle();
  if (dtype == DType::BF16) {
    std::vector<float> values = staging.download_widened(data, count);
    host().all_reduce(group, values.data(), count, DType::F32, label);
    staging.upload_rounded(data, values);
    return;
  }
  std::vector<std::byte> bytes = staging.download(data, count * dtype_bytes(dtype));
  host().all_reduce(group, bytes.data(), count, dtype, label);
  staging.upload(data, bytes.data(), bytes.size());
}

void StagingCommunicator::reduce_scatter(const CommGroup& group, const void* in, void* out, std::size_t count,
                                         DType dtype, std::string_view label) {
  if (!is_device_pointer(in)) return host().reduce_scatter(group, in, out, count, dtype, label);
  TWIN_EXEC_CHECK(is_device_pointer(out), "reduce_scatter {}: input on the device, output on the host", label);
  context_.make_current();
  Staging staging(context_);
  staging.settle();
  const std::size_t members = group.members.size();
  if (dtype == DType::BF16) {
    std::vector<float> values = staging.download_widened(in, members * count);
    std::vector<float> mine(count);
    host().reduce_scatter(group, values.data(), mine.data(), count, DType::F32, label);
    staging.upload_rounded(out, mine);
    return;
  }
  const std::size_t element = dtype_bytes(dtype);
  std::vector<std::byte> values = staging.download(in, members * count * element);
  std::vector<std::byte> mine(count * element);
  host().reduce_scatter(group, values.data(), mine.data(), count, dtype, label);
  staging.upload(out, mine.data(), mine.size());
}

void StagingCommunicator::all_gather(const CommGroup& group, const void* in, void* out, std::size_t count, DType dtype,
                                     std::string_view label) {
  if (!is_device_pointer(out)) return host().all_gather(group, in, out, count, dtype, label);
  context_.make_current();
  Staging staging(context_);
  staging.settle();
  const std::size_t element = dtype_bytes(dtype);  // a gather moves bytes: any dtype, bf16 included
  std::vector<std::byte> mine = staging.download(in, count * element);
  std::vector<std::byte> all(group.members.size() * count * element);
  host().all_gather(group, mine.data(), all.data(), count, dtype, label);
  staging.upload(out, all.data(), all.size());
}

void StagingCommunicator::broadcast(const CommGroup& group, void* data, std::size_t count, DType dtype, int root,
                                    std::string_view label) {
  if (!is_device_pointer(data)) return host().broadcast(group, data, count, dtype, root, label);
  context_.make_current();
  Staging staging(context_);
  staging.settle();
  std::vector<std::byte> bytes = staging.download(data, count * dtype_bytes(dtype));
  host().broadcast(group, bytes.data(), count, dtype, root, label);
  staging.upload(data, bytes.data(), bytes.size());
}

void StagingCommunicator::all_to_all(const CommGroup& group, const void* in,
                                     const std::vector<std::size_t>& send_counts, void* out,
                                     const std::vector<std::size_t>& recv_counts, DType dtype, std::string_view label) {
  if (!is_device_pointer(out)) return host().all_to_all(group, in, send_counts, out, recv_counts, dtype, label);
  const std::size_t element = dtype_bytes(dtype);
  const std::size_t send_total = chunk_offsets(group, host().rank(), send_counts, label).back();
  const std::size_t recv_total = chunk_offsets(group, host().rank(), recv_counts, label).back();
  context_.make_current();
  Staging staging(context_);
  staging.settle();
  std::vector<std::byte> mine = staging.download(in, send_total * element);
  std::vector<std::byte> received(recv_total * element);
  host().all_to_all(group, mine.data(), send_counts, received.data(), recv_counts, dtype, label);
  staging.upload(out, received.data(), received.size());
}

void StagingCommunicator::barrier(const CommGroup& group, std::string_view label) {
  context_.make_current();
  Staging(context_).settle();  // a barrier after which timing starts: this rank's work is done
  host().barrier(group, label);
}

void StagingCommunicator::send(int peer, std::uint64_t tag, const void* data, std::size_t bytes) {
  if (!is_device_pointer(data)) return host().send(peer, tag, data, bytes);
  context_.make_current();
  Staging staging(context_);
  staging.settle();
  const std::vector<std::byte> message = staging.download(data, bytes);
  host().send(peer, tag, message.data(), bytes);  // the host communicator copies it: buffered
}

void StagingCommunicator::recv(int peer, std::uint64_t tag, void* data, std::size_t bytes, std::string_view label) {
  if (!is_device_pointer(data)) return host().recv(peer, tag, data, bytes, label);
  context_.make_current();
  std::vector<std::byte> message(bytes);
  host().recv(peer, tag, message.data(), bytes, label);
  Staging(context_).upload(data, message.data(), bytes);
}

}  // namespace twin::exec::cuda
