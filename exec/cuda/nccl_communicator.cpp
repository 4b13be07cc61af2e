#include "exec/cuda/nccl_communicator.hpp"

#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include <fmt/core.h>

#include "exec/cuda/staging_communicator.hpp"  // is_device_pointer
#include "kernels/cuda/check.cuh"

namespace twin::exec::cuda {

struct NcclCommunicator::Channel {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int size = 0, index = 0;
  void* header_device = nullptr;  // P2P: a (tag, bytes) header, 16 bytes on the device ...
  Header* header_host = nullptr;  // ... and in pinned host memory

  Channel() = default;
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;
  ~Channel() {  // no throw: a failure here is past mattering
    if (stream != nullptr) cudaStreamSynchronize(stream);
    if (comm != nullptr) ncclCommDestroy(comm);
    if (stream != nullptr) cudaStreamDestroy(stream);
    if (header_device != nullptr) cudaFree(header_device);
    if (header_host != nullptr) cudaFreeHost(header_host);
  }
};

namespace {

constexpr std::size_t kHeaderBytes = 16;
using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return ncclFloat32;
    case DType::BF16:
      return ncclBfloat16;
    case DType::F64:
      return ncclFloat64;
    case DType::I32:
      return ncclInt32;
  }
  throw CommError("nccl communicator: unknown dtype");
}

// An NCCL communicator of `size` ranks in which this rank is `index`, on `device`, with its own stream.
std::unique_ptr<NcclCommunicator::Channel> make_channel(const ncclUniqueId& id, int size, int index,
                                                        const DeviceContext& context) {
  auto channel = std::make_unique<NcclCommunicator::Channel>();
  context.make_current();
  channel->size = size;
  channel->index = index;
  TWIN_NCCL_CHECK(ncclCommInitRank(&channel->comm, size, id, index));
  TWIN_CUDA_CHECK(cudaStreamCreateWithFlags(&channel->stream, cudaStreamNonBlocking));
  return channel;
}

// member 0's unique id, on every member of `group` (over the host communicator)
ncclUniqueId shared_unique_id(Communicator& host, const CommGroup& group, int index) {
  static_assert(sizeof(ncclUniqueId) % sizeof(double) == 0, "the id travels as f64 words (a broadcast copies bytes)");
  ncclUniqueId id{};
  if (index == 0) TWIN_NCCL_CHECK(ncclGetUniqueId(&id));
  host.broadcast(group, &id, sizeof(id) / sizeof(double), DType::F64, 0, "NCCL unique id");
  return id;
}

}  // namespace

NcclCommunicator::NcclCommunicator(Communicator& host, DeviceContext& context, NcclOptions options)
    : host_(host), context_(context), options_(std::move(options)) {
  // Every pipeline pair of the job, in the same order on every rank: each rank joins the pairs it belongs to, so
  // the blocking two-rank inits complete one after another.
  const int me = host_.rank();
  for (const auto& [from, to] : options_.pipeline_pairs) {
    if ((me != from && me != to) || from == to || pairs_.count({from, to}) > 0) continue;
    const CommGroup pair{"nccl pair", {from, to}};
    const int index = me == from ? 0 : 1;
    auto channel = make_channel(shared_unique_id(host_, pair, index), 2, index, context_);
    TWIN_CUDA_CHECK(cudaMalloc(&channel->header_device, kHeaderBytes));
    TWIN_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&channel->header_host), sizeof(Header)));
    pairs_[{from, to}] = std::move(channel);
  }
}

NcclCommunicator::~NcclCommunicator() {
  cudaSetDevice(context_.device());
  for (auto& [key, message] : stash_) {
    cudaEventSynchronize(message.ready);
    cudaEventDestroy(message.ready);
    cudaFree(message.data);
  }
}

NcclCommunicator::Channel& NcclCommunicator::group_channel(const CommGroup& group) {
  auto key = std::make_pair(std::string(group.kind), group.members);
  auto it = groups_.find(key);
  if (it != groups_.end()) return *it->second;
  const int index = index_in(group, host_.rank());
  const int size = static_cast<int>(group.members.size());
  auto channel = make_channel(shared_unique_id(host_, group, index), size, index, context_);
  return *groups_.emplace(std::move(key), std::move(channel)).first->second;
}

NcclCommunicator::Channel& NcclCommunicator::pair_channel(int from, int to, std::string_view label) {
  const auto it = pairs_.find({from, to});
  if (it == pairs_.end()) {
    throw CommError(
        fmt::format("rank {}: {}: no NCCL channel from rank {} to rank {}: the pair is not among the "
                    "Program's pipeline pairs",
                    host_.rank(), label, from, to));
  }
  return *it->second;
}

bool NcclCommunicator::deferred(const CommGroup& group) const {
  return options_.overlap_data_parallel && group.kind == "data";
}

template <class Enqueue>
void NcclCommunicator::run(Channel& channel, bool defer, Enqueue&& enqueue) {
  context_.make_current();
  if (!defer) context_.wait_deferred();  // anything else comes after the overlapped DP reductions
  cudaEvent_t ready = context_.record_compute();
  const cudaError_t status = cudaStreamWaitEvent(channel.stream, ready, 0);
  cudaEventDestroy(ready);
  TWIN_CUDA_CHECK(status);
  enqueue(channel);
  cudaEvent_t done = nullptr;
  TWIN_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  TWIN_CUDA_CHECK(cudaEventRecord(done, channel.stream));
  if (defer) {
    context_.defer(done);
  } else {
    context_.compute_waits(done);
  }
}

// --- collectives
// -------------------------------------------------------------------------------------------------------

void NcclCommunicator::all_reduce(const CommGroup& group, void* data, std::size_t count, DType dtype,
                                  std::string_view label) {
  if (!is_device_pointer(data)) return host_.all_reduce(group, data, count, dtype, label);
  run(group_channel(group), deferred(group), [&](Channel& c) {
    TWIN_NCCL_CHECK(ncclAllReduce(data, data, count, nccl_type(dtype), ncclSum, c.comm, c.stream));
  });
}

void NcclCommunicator::reduce_scatter(const CommGroup& group, const void* in, void* out, std::size_t count, DType dtype,
                                      std::string_view label) {
  if (!is_device_pointer(in)) return host_.reduce_scatter(group, in, out, count, dtype, label);
  run(group_channel(group), deferred(group), [&](Channel& c) {
    TWIN_NCCL_CHECK(ncclReduceScatter(in, out, count, nccl_type(dtype), ncclSum, c.comm, c.stream));
  });
}

void NcclCommunicator::all_gather(const CommGroup& group, const void* in, void* out, std::size_t count, DType dtype,
                                  std::string_view label) {
  if (!is_device_pointer(out)) return host_.all_gather(group, in, out, count, dtype, label);
  // never deferred: ZeRO-1's parameter gather feeds the next forward, which waits for nothing else
  run(group_channel(group), false,
      [&](Channel& c) { TWIN_NCCL_CHECK(ncclAllGather(in, out, count, nccl_type(dtype), c.comm, c.stream)); });
}

void NcclCommunicator::broadcast(const CommGroup& group, void* data, std::size_t count, DType dtype, int root,
                                 std::string_view label) {
  if (!is_device_pointer(data)) return host_.broadcast(group, data, count, dtype, root, label);
  run(group_channel(group), false,
      [&](Channel& c) { TWIN_NCCL_CHECK(ncclBroadcast(data, data, count, nccl_type(dtype), root, c.comm, c.stream)); });
}

void NcclCommunicator::barrier(const CommGroup& group, std::string_view label) {
  context_.make_current();
  context_.wait_deferred();
  TWIN_CUDA_CHECK(cudaStreamSynchronize(context_.compute()));
  host_.barrier(group, label);
}

void NcclCommunicator::abort(std::string_view reason) {
  host_.abort(reason);
}

// --- point to point
// ----------------------------------------------------------------------------------------------------

void NcclCommunicator::send(int peer, std::uint64_t tag, const void* data, std::size_t bytes) {
  if (!is_device_pointer(data)) return host_.send(peer, tag, data, bytes);
  Channel& c = pair_channel(host_.rank(), peer, "send");
  context_.make_current();  // no wait for deferred DP reductions: a message is an activation, never a gradient
  // the message, copied on the compute stream (after the kernels that wrote it): [header | payload]
  std::byte* message = nullptr;
  TWIN_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&message), kHeaderBytes + bytes, context_.compute()));
  const Header header{tag, bytes};
  // from pageable memory: returns once `header` is staged
  TWIN_CUDA_CHECK(cudaMemcpyAsync(message, &header, sizeof(header), cudaMemcpyHostToDevice, context_.compute()));
  if (bytes > 0) {
    TWIN_CUDA_CHECK(cudaMemcpyAsync(message + kHeaderBytes, data, bytes, cudaMemcpyDeviceToDevice, context_.compute()));
  }
  cudaEvent_t ready = context_.record_compute();
  const cudaError_t status = cudaStreamWaitEvent(c.stream, ready, 0);
  cudaEventDestroy(ready);
  TWIN_CUDA_CHECK(status);
  TWIN_NCCL_CHECK(ncclGroupStart());
  TWIN_NCCL_CHECK(ncclSend(message, kHeaderBytes, ncclUint8, 1, c.comm, c.stream));
  if (bytes > 0) TWIN_NCCL_CHECK(ncclSend(message + kHeaderBytes, bytes, ncclUint8, 1, c.comm, c.stream));
  TWIN_NCCL_CHECK(ncclGroupEnd());
  TWIN_CUDA_CHECK(cudaFreeAsync(message, c.stream));  // once sent; the compute stream never waits for it
}

NcclCommunicator::Header NcclCommunicator::next_header(Channel& c, int peer, std::uint64_t wanted_tag,
                                                       std::string_view label) {
  TWIN_NCCL_CHECK(ncclRecv(c.header_device, kHeaderBytes, ncclUint8, 0, c.comm, c.stream));
  TWIN_CUDA_CHECK(cudaMemcpyAsync(c.header_host, c.header_device, sizeof(Header), cudaMemcpyDeviceToHost, c.stream));
  cudaEvent_t arrived = nullptr;
  TWIN_CUDA_CHECK(cudaEventCreateWithFlags(&arrived, cudaEventDisableTiming));
  TWIN_CUDA_CHECK(cudaEventRecord(arrived, c.stream));
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options_.timeout_s));
  while (true) {
    const cudaError_t status = cudaEventQuery(arrived);
    if (status == cudaSuccess) break;
    if (status != cudaErrorNotReady) {
      cudaEventDestroy(arrived);
      TWIN_CUDA_CHECK(status);
    }
    if (Clock::now() > deadline) {
      cudaEventDestroy(arrived);
      throw CommError(
          fmt::format("rank {}: recv {} (tag {}) from rank {} timed out after {} s: rank {} never sent it "
                      "(dead, stuck or out of step)",
                      host_.rank(), label, wanted_tag, peer, options_.timeout_s, peer));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  cudaEventDestroy(arrived);
  return *c.header_host;
}

void NcclCommunicator::recv(int peer, std::uint64_t tag, void* data, std::size_t bytes, std::string_view label) {
  if (!is_device_pointer(data)) return host_.recv(peer, tag, data, bytes, label);
  context_.make_current();
  auto check_size = [&](std::size_t got) {
    if (got != bytes) {
      throw CommError(fmt::format("rank {}: recv {} from rank {}: the message has {} bytes, expected {}", host_.rank(),
                                  label, peer, got, bytes));
    }
  };
  // a message of this tag that arrived while an earlier receive was looking for another
  const auto key = std::make_pair(peer, tag);
  if (auto it = stash_.lower_bound(key); it != stash_.end() && it->first == key) {
    const Stashed message = it->second;
    stash_.erase(it);
    context_.compute_waits(message.ready);
    check_size(message.bytes);
    if (bytes > 0) {
      TWIN_CUDA_CHECK(cudaMemcpyAsync(data, message.data, bytes, cudaMemcpyDeviceToDevice, context_.compute()));
    }
    TWIN_CUDA_CHECK(cudaFreeAsync(message.data, context_.compute()));
    return;
  }
  Channel& c = pair_channel(peer, host_.rank(), label);
  while (true) {
    const Header header = next_header(c, peer, tag, label);
    if (header.tag == tag) {
      check_size(header.bytes);
      if (bytes == 0) return;
      cudaEvent_t ready = context_.record_compute();  // `data` may be a fresh stream-ordered allocation
      const cudaError_t status = cudaStreamWaitEvent(c.stream, ready, 0);
      cudaEventDestroy(ready);
      TWIN_CUDA_CHECK(status);
      TWIN_NCCL_CHECK(ncclRecv(data, bytes, ncclUint8, 0, c.comm, c.stream));
      cudaEvent_t done = nullptr;
      TWIN_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
      TWIN_CUDA_CHECK(cudaEventRecord(done, c.stream));
      context_.compute_waits(done);
      return;
    }
    // another message of this peer came first: keep it for its own receive
    Stashed message;
    message.bytes = static_cast<std::size_t>(header.bytes);
    TWIN_CUDA_CHECK(cudaMallocAsync(&message.data, std::max<std::size_t>(message.bytes, 1), c.stream));
    if (message.bytes > 0) TWIN_NCCL_CHECK(ncclRecv(message.data, message.bytes, ncclUint8, 0, c.comm, c.stream));
    TWIN_CUDA_CHECK(cudaEventCreateWithFlags(&message.ready, cudaEventDisableTiming));
    TWIN_CUDA_CHECK(cudaEventRecord(message.ready, c.stream));
    stash_.emplace(std::make_pair(peer, static_cast<std::uint64_t>(header.tag)), message);
  }
}

}  // namespace twin::exec::cuda
