// Device buffers over any host Communicator: what lets several ranks share one GPU (NCCL refuses two ranks of one
// communicator on the same device), with `threads` ranks in one process or `mpi` ranks on fewer GPUs than ranks.
//
// A call with host pointers goes straight to the host communicator. A call with device pointers synchronizes the
// rank's compute stream, copies the data to host memory, runs the host communicator's call, and copies the result
// back on the compute stream: the host communicator keeps its semantics (deterministic sums in group order, buffered
// sends, tag-matched receives, timeouts naming the missing ranks, abort). bf16 data is summed in fp32: every member's
// values widened exactly, summed in group order, rounded once; the same bits on every member.
//
// Slow (two PCIe copies per call) but simple and exact: it exists to run any plan on one GPU, not for speed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "exec/comm/forwarding_communicator.hpp"
#include "exec/cuda/device_context.hpp"

namespace twin::exec::cuda {

// true for device (or managed) memory, false for host memory
bool is_device_pointer(const void* p);

class StagingCommunicator final : public ForwardingCommunicator {
 public:
  StagingCommunicator(Communicator& host, DeviceContext& context);

  std::string_view name() const override { return name_; }

  void all_reduce(const CommGroup& group, void* data, std::size_t count, DType dtype, std::string_view label) override;
  void reduce_scatter(const CommGroup& group, const void* in, void* out, std::size_t count, DType dtype,
                      std::string_view label) override;
  void all_gather(const CommGroup& group, const void* in, void* out, std::size_t count, DType dtype,
                  std::string_view label) override;
  void broadcast(const CommGroup& group, void* data, std::size_t count, DType dtype, int root,
                 std::string_view label) override;
  void barrier(const CommGroup& group, std::string_view label) override;
  void all_to_all(const CommGroup& group, const void* in, const std::vector<std::size_t>& send_counts, void* out,
                  const std::vector<std::size_t>& recv_counts, DType dtype, std::string_view label) override;
  void send(int peer, std::uint64_t tag, const void* data, std::size_t bytes) override;
  void recv(int peer, std::uint64_t tag, void* data, std::size_t bytes, std::string_view label) override;

 private:
  DeviceContext& context_;
  std::string name_;
};

}  // namespace twin::exec::cuda
