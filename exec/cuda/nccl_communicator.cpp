#include "exec/cuda/nccl_communicator.hpp"

#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include <fmt/core.h>

#include "exec/cuda/staging_communicator.hpp"  // is_device_pointer
#include "kernels/cuda/check.cuh"

namespace twin::exec::cuda {

struct NcclCommunicator::Channel {
  std::string name;  // "the tensor group (ranks 0, 1)", "the pair rank 2 -> rank 3"
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int size = 0, index = 0;
  std::atomic<bool> aborted{false};  // set once ncclCommAbort has freed `comm`

  Channel() = default;
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;
  ~Channel() {  // the communicator has finalized or aborted `comm` by now, and every call on the stream has ended
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

namespace {

using Clock = std::chrono::steady_clock;

struct Header {  // what a message's header says, over the host communicator
  std::uint64_t tag = 0, bytes = 0;
};

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

Clock::time_point deadline_after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// The state of a non-blocking communicator once it leaves ncclInProgress, or ncclInProgress at the deadline.
ncclResult_t await_state(ncclComm_t comm, Clock::time_point deadline) {
  while (true) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t query = ncclCommGetAsyncError(comm, &state);
    if (query != ncclSuccess) return query;
    if (state != ncclInProgress || Clock::now() >= deadline) return state;
    std::this_thread::sleep_for(std::chrono::microseconds(50));  // set-up, teardown and rare lazy connections only
  }
}

// member 0's unique id, on every member of `group` (over the host communicator)
ncclUniqueId shared_unique_id(Communicator& host, const CommGroup& group, int index) {
  static_assert(sizeof(ncclUniqueId) % sizeof(double) == 0, "the id travels as f64 words (a broadcast copies bytes)");
  ncclUniqueId id{};
  if (index == 0) TWIN_NCCL_CHECK(ncclGetUniqueId(&id));
  host.broadcast(group, &id, sizeof(id) / sizeof(double), DType::F64, 0, "NCCL unique id");
  return id;
}

std::string group_name(const CommGroup& group) {
  return fmt::format("the {} group ({})", group.kind, format_ranks(group.members));
}

}  // namespace

// --- set-up and teardown --------------------------------------------------------------------------------------------

NcclCommunicator::NcclCommunicator(Communicator& host, DeviceContext& context, NcclOptions options)
    : host_(host), context_(context), options_(std::move(options)) {
  context_.make_current();
  create_channels();
  watchdog_ = std::make_unique<Watchdog>(
      options_.timeout_s,
      Watchdog::Hooks{[this] { return health(); }, [this](const std::string& story) { abort_nccl(story); }});
}

// Every group and pair of the job in one global order; each rank joins those it belongs to. The unique-id broadcasts
// (blocking host collectives) follow that order; the non-blocking initialisations then proceed together.
void NcclCommunicator::create_channels() {
  const int me = host_.rank();
  auto start = [&](const CommGroup& group, std::string name) {
    const int index = index_in(group, me);
    auto channel = std::make_unique<Channel>();
    channel->name = std::move(name);
    channel->size = static_cast<int>(group.members.size());
    channel->index = index;
    const ncclUniqueId id = shared_unique_id(host_, group, index);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t result = ncclCommInitRankConfig(&channel->comm, channel->size, id, index, &config);
    if (result != ncclSuccess && result != ncclInProgress) {
      throw CommError(
          fmt::format("rank {}: NCCL set-up of {} failed: {}", me, channel->name, ncclGetErrorString(result)));
    }
    TWIN_CUDA_CHECK(cudaStreamCreateWithFlags(&channel->stream, cudaStreamNonBlocking));
    return channel;
  };
  for (const CommGroup& group : options_.groups) {
    if (std::find(group.members.begin(), group.members.end(), me) == group.members.end()) continue;
    auto key = std::make_pair(std::string(group.kind), group.members);
    if (groups_.count(key) == 0) groups_.emplace(std::move(key), start(group, group_name(group)));
  }
  for (const auto& [from, to] : options_.pipeline_pairs) {
    if ((me != from && me != to) || from == to || pairs_.count({from, to}) > 0) continue;
    pairs_.emplace(std::make_pair(from, to),
                   start(CommGroup{"nccl pair", {from, to}}, fmt::format("the pair rank {} -> rank {}", from, to)));
  }
  const Clock::time_point deadline = deadline_after(options_.timeout_s);
  auto await_ready = [&](Channel& c) {
    const ncclResult_t state = await_state(c.comm, deadline);
    if (state == ncclSuccess) return;
    const std::string story =
        state == ncclInProgress
            ? fmt::format("rank {}: NCCL set-up of {} did not finish within {} s (a member missing or stuck)", me,
                          c.name, options_.timeout_s)
            : fmt::format("rank {}: NCCL set-up of {} failed: {} ({})", me, c.name, ncclGetErrorString(state),
                          ncclGetLastError(c.comm));
    abort_nccl(story);
    throw CommError(story);
  };
  for (auto& [key, channel] : groups_) await_ready(*channel);
  for (auto& [key, channel] : pairs_) await_ready(*channel);
}

NcclCommunicator::~NcclCommunicator() {
  cudaSetDevice(context_.device());
  watchdog_->wait_idle();  // every NCCL call has finished, or failed and been given up
  watchdog_.reset();       // no more health queries: the communicators may go
  for (auto& [key, message] : stash_) {
    cudaEventSynchronize(message.ready.get());
    cudaFreeAsync(message.data, context_.compute());
  }
  stash_.clear();
  // A healthy communicator finalizes (flushing its work with its peers) and is destroyed; one that does not finish
  // within the timeout is aborted, as are the ones a failure aborted already.
  const Clock::time_point deadline = deadline_after(options_.timeout_s);
  auto finish = [&](Channel& c) {
    if (c.aborted.load()) return;
    const ncclResult_t result = ncclCommFinalize(c.comm);
    if ((result == ncclSuccess || result == ncclInProgress) && await_state(c.comm, deadline) == ncclSuccess) {
      ncclCommDestroy(c.comm);
    } else if (!c.aborted.exchange(true)) {
      ncclCommAbort(c.comm);
    }
  };
  for (auto& [key, channel] : groups_) finish(*channel);
  for (auto& [key, channel] : pairs_) finish(*channel);
}

void NcclCommunicator::abort_nccl(const std::string& story) {
  context_.fail(story);  // first: a host wait that returns once the kernels end must find the story
  for (auto& [key, channel] : groups_) {
    if (!channel->aborted.exchange(true)) ncclCommAbort(channel->comm);
  }
  for (auto& [key, channel] : pairs_) {
    if (!channel->aborted.exchange(true)) ncclCommAbort(channel->comm);
  }
}

std::string NcclCommunicator::health() {
  auto check = [&](Channel& c) -> std::string {
    if (c.aborted.load()) return {};
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(c.comm, &state) != ncclSuccess || state == ncclSuccess || state == ncclInProgress) {
      return {};
    }
    return fmt::format("rank {}: NCCL reports {} on {} ({})", host_.rank(), ncclGetErrorString(state), c.name,
                       ncclGetLastError(c.comm));
  };
  for (auto& [key, channel] : groups_) {
    if (std::string story = check(*channel); !story.empty()) return story;
  }
  for (auto& [key, channel] : pairs_) {
    if (std::string story = check(*channel); !story.empty()) return story;
  }
  return {};
}

NcclCommunicator::Channel& NcclCommunicator::group_channel(const CommGroup& group, std::string_view label) {
  const auto it = groups_.find(std::make_pair(std::string(group.kind), group.members));
  if (it == groups_.end()) {
    throw CommError(fmt::format("rank {}: {}: no NCCL communicator for {}: the group is not among the Program's",
                                host_.rank(), label, group_name(group)));
  }
  return *it->second;
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

void NcclCommunicator::abort(std::string_view reason) {
  abort_nccl(fmt::format("rank {} aborted: {}", host_.rank(), reason));
  host_.abort(reason);
}

// --- issuing work ---------------------------------------------------------------------------------------------------

namespace {

// An NCCL call's result on a non-blocking communicator: ncclInProgress is awaited (the call is then enqueued), an
// error throws after `on_error` (the abort) with the story.
template <class OnError>
void settle(ncclResult_t result, ncclComm_t comm, double timeout_s, const std::string& what, OnError on_error) {
  if (result == ncclInProgress) result = await_state(comm, deadline_after(timeout_s));
  if (result == ncclSuccess) return;
  const std::string story =
      result == ncclInProgress
          ? fmt::format("{}: NCCL did not accept the call within {} s", what, timeout_s)
          : fmt::format("{}: NCCL failed: {} ({})", what, ncclGetErrorString(result), ncclGetLastError(comm));
  on_error(story);
  throw CommError(story);
}

}  // namespace

#define TWIN_NCCL_ISSUE(channel, call, what) \
  settle((call), (channel).comm, options_.timeout_s, (what), [this](const std::string& story) { abort_nccl(story); })

SharedEvent NcclCommunicator::watched_event(Channel& channel, const std::string& what) {
  SharedEvent done = share_event(DeviceContext::record(channel.stream));
  watchdog_->watch([done] { return cudaEventQuery(done.get()) != cudaErrorNotReady; },
                   [done]() mutable { done.reset(); },
                   fmt::format("rank {}: {} on {}", host_.rank(), what, channel.name));
  return done;
}

template <class Enqueue>
SharedEvent NcclCommunicator::run(Channel& channel, bool defer, const std::string& what, std::vector<ByteRange> memory,
                                  Enqueue&& enqueue) {
  context_.make_current();
  context_.throw_if_failed();
  if (!defer) context_.wait_deferred();  // anything else comes after the overlapped DP reductions
  cudaEvent_t ready = context_.record_compute();
  const cudaError_t status = cudaStreamWaitEvent(channel.stream, ready, 0);
  cudaEventDestroy(ready);
  TWIN_CUDA_CHECK(status);
  enqueue(channel);
  SharedEvent done = watched_event(channel, what);
  if (defer) {
    context_.defer(done, what, std::move(memory));
  } else {
    TWIN_CUDA_CHECK(cudaStreamWaitEvent(context_.compute(), done.get(), 0));
  }
  return done;
}

// --- collectives ----------------------------------------------------------------------------------------------------

void NcclCommunicator::all_reduce(const CommGroup& group, void* data, std::size_t count, DType dtype,
                                  std::string_view label) {
  if (!is_device_pointer(data)) return host_.all_reduce(group, data, count, dtype, label);
  const std::string what = fmt::format("all_reduce {}", label);
  run(group_channel(group, label), options_.deferral.defers_reduction(group), what,
      {{data, count * dtype_bytes(dtype)}}, [&](Channel& c) {
        TWIN_NCCL_ISSUE(c, ncclAllReduce(data, data, count, nccl_type(dtype), ncclSum, c.comm, c.stream), what);
      });
}

void NcclCommunicator::reduce_scatter(const CommGroup& group, const void* in, void* out, std::size_t count, DType dtype,
                                      std::string_view label) {
  if (!is_device_pointer(in)) return host_.reduce_scatter(group, in, out, count, dtype, label);
  const std::string what = fmt::format("reduce_scatter {}", label);
  const std::size_t bytes = count * dtype_bytes(dtype);
  run(group_channel(group, label), options_.deferral.defers_reduction(group), what,
      {{in, bytes * group.members.size()}, {out, bytes}}, [&](Channel& c) {
        TWIN_NCCL_ISSUE(c, ncclReduceScatter(in, out, count, nccl_type(dtype), ncclSum, c.comm, c.stream), what);
      });
}

void NcclCommunicator::all_gather(const CommGroup& group, const void* in, void* out, std::size_t count, DType dtype,
                                  std::string_view label) {
  if (!is_device_pointer(out)) return host_.all_gather(group, in, out, count, dtype, label);
  const std::string what = fmt::format("all_gather {}", label);
  // never deferred: ZeRO-1's parameter gather feeds the next forward, which waits for nothing else
  run(group_channel(group, label), false, what, {},
      [&](Channel& c) { TWIN_NCCL_ISSUE(c, ncclAllGather(in, out, count, nccl_type(dtype), c.comm, c.stream), what); });
}

void NcclCommunicator::broadcast(const CommGroup& group, void* data, std::size_t count, DType dtype, int root,
                                 std::string_view label) {
  if (!is_device_pointer(data)) return host_.broadcast(group, data, count, dtype, root, label);
  const std::string what = fmt::format("broadcast {}", label);
  run(group_channel(group, label), false, what, {}, [&](Channel& c) {
    TWIN_NCCL_ISSUE(c, ncclBroadcast(data, data, count, nccl_type(dtype), root, c.comm, c.stream), what);
  });
}

// One ncclSend and one ncclRecv per peer between ncclGroupStart and ncclGroupEnd (NCCL's all-to-all), on the group's
// communicator, whose ranks are the group indices; this rank's own chunk is a device copy on the same stream.
void NcclCommunicator::all_to_all(const CommGroup& group, const void* in, const std::vector<std::size_t>& send_counts,
                                  void* out, const std::vector<std::size_t>& recv_counts, DType dtype,
                                  std::string_view label) {
  if (!is_device_pointer(out)) return host_.all_to_all(group, in, send_counts, out, recv_counts, dtype, label);
  const int me = index_in(group, host_.rank()), size = static_cast<int>(group.members.size());
  const std::vector<std::size_t> send_at = chunk_offsets(group, host_.rank(), send_counts, label);
  const std::vector<std::size_t> recv_at = chunk_offsets(group, host_.rank(), recv_counts, label);
  if (send_counts[me] != recv_counts[me]) {
    throw CommError(fmt::format("rank {}: all_to_all {}: it sends itself {} elements, expects {}", host_.rank(), label,
                                send_counts[me], recv_counts[me]));
  }
  const std::size_t element = dtype_bytes(dtype);
  const auto* source = static_cast<const std::byte*>(in);
  auto* target = static_cast<std::byte*>(out);
  const std::string what = fmt::format("all_to_all {}", label);
  run(group_channel(group, label), false, what, {}, [&](Channel& c) {
    TWIN_CUDA_CHECK(cudaMemcpyAsync(target + recv_at[me] * element, source + send_at[me] * element,
                                    send_counts[me] * element, cudaMemcpyDeviceToDevice, c.stream));
    TWIN_NCCL_ISSUE(c, ncclGroupStart(), what);
    for (int j = 0; j < size; ++j) {
      if (j == me) continue;
      TWIN_NCCL_ISSUE(
          c, ncclSend(source + send_at[j] * element, send_counts[j] * element, ncclUint8, j, c.comm, c.stream), what);
      TWIN_NCCL_ISSUE(
          c, ncclRecv(target + recv_at[j] * element, recv_counts[j] * element, ncclUint8, j, c.comm, c.stream), what);
    }
    TWIN_NCCL_ISSUE(c, ncclGroupEnd(), what);
  });
}

void NcclCommunicator::barrier(const CommGroup& group, std::string_view label) {
  context_.make_current();
  context_.wait_deferred();
  context_.synchronize();  // reports a failure instead of hanging: the watchdog aborts what never finishes
  host_.barrier(group, label);
}

// --- point to point -------------------------------------------------------------------------------------------------

void NcclCommunicator::send(int peer, std::uint64_t tag, const void* data, std::size_t bytes) {
  if (!is_device_pointer(data)) return host_.send(peer, tag, data, bytes);
  if (tag >= kNcclHeaderTag) {
    throw CommError(fmt::format("rank {}: send tag {} to rank {}: tags from {} on are the NCCL headers'", host_.rank(),
                                tag, peer, kNcclHeaderTag));
  }
  context_.make_current();  // no wait for deferred DP reductions: a message is an activation, never a gradient
  context_.throw_if_failed();
  Channel& c = pair_channel(host_.rank(), peer, "send");
  if (bytes > 0) {  // the caller's buffer as it is, after the kernels that wrote it
    const std::string what = fmt::format("send of tag {} to rank {}", tag, peer);
    cudaEvent_t ready = context_.record_compute();
    const cudaError_t status = cudaStreamWaitEvent(c.stream, ready, 0);
    cudaEventDestroy(ready);
    TWIN_CUDA_CHECK(status);
    TWIN_NCCL_ISSUE(c, ncclSend(data, bytes, ncclUint8, 1, c.comm, c.stream), what);
    context_.hold(watched_event(c, what), what, {data, bytes});
  }
  const Header header{tag, bytes};
  host_.send(peer, kNcclHeaderTag, &header, sizeof(header));  // after the payload's ncclSend: its order on the stream
}

void NcclCommunicator::recv(int peer, std::uint64_t tag, void* data, std::size_t bytes, std::string_view label) {
  if (!is_device_pointer(data)) return host_.recv(peer, tag, data, bytes, label);
  context_.make_current();
  context_.throw_if_failed();
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
    check_size(message.bytes);
    TWIN_CUDA_CHECK(cudaStreamWaitEvent(context_.compute(), message.ready.get(), 0));
    if (bytes > 0) {
      TWIN_CUDA_CHECK(cudaMemcpyAsync(data, message.data, bytes, cudaMemcpyDeviceToDevice, context_.compute()));
    }
    TWIN_CUDA_CHECK(cudaFreeAsync(message.data, context_.compute()));
    return;
  }
  Channel& c = pair_channel(peer, host_.rank(), label);
  while (true) {
    Header header;  // the next message of this peer, in the order it was sent (the host's timeouts apply)
    host_.recv(peer, kNcclHeaderTag, &header, sizeof(header), label);
    context_.throw_if_failed();
    const std::string what = fmt::format("recv of tag {} from rank {}", header.tag, peer);
    if (header.tag == tag) {
      check_size(static_cast<std::size_t>(header.bytes));
      if (bytes == 0) return;
      cudaEvent_t ready = context_.record_compute();  // `data` may be a fresh stream-ordered allocation
      const cudaError_t status = cudaStreamWaitEvent(c.stream, ready, 0);
      cudaEventDestroy(ready);
      TWIN_CUDA_CHECK(status);
      TWIN_NCCL_ISSUE(c, ncclRecv(data, bytes, ncclUint8, 0, c.comm, c.stream), what);
      TWIN_CUDA_CHECK(cudaStreamWaitEvent(context_.compute(), watched_event(c, what).get(), 0));
      return;
    }
    // another message of this peer came first: keep it for its own receive
    Stashed message;
    message.bytes = static_cast<std::size_t>(header.bytes);
    TWIN_CUDA_CHECK(cudaMallocAsync(&message.data, std::max<std::size_t>(message.bytes, 1), c.stream));
    if (message.bytes > 0)
      TWIN_NCCL_ISSUE(c, ncclRecv(message.data, message.bytes, ncclUint8, 0, c.comm, c.stream), what);
    message.ready = watched_event(c, what);
    stash_.emplace(std::make_pair(peer, static_cast<std::uint64_t>(header.tag)), message);
  }
}

}  // namespace twin::exec::cuda
