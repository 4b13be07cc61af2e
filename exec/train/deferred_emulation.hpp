// The device path's deferred collectives, emulated on the CPU: a debug mode of the threads (or mpi) path that shows a
// race the GPU would hide.
//
// On a GPU, dp_overlap's data-parallel gradient reductions run on the NCCL stream while the backward goes on, and the
// compute stream waits for them only where CudaBackend waits (the gradient norm, the optimizer, host reads) or before
// the next communication (exec/cuda/nccl_communicator.hpp). Here the same calls (DeferralRule) are held back in the
// same way and run, for real, at those points; meanwhile every kernel's tensors are checked against the collectives
// still in flight:
//   Order   a kernel touching a deferred collective's memory first waits for it: what CudaBackend does (an event
//           wait on the compute stream), so results are right whatever the interpreter's order
//   Strict  such a touch is a bug: InternalError naming the rank, the kernel, its tensor and the collective (on the
//           GPU it would be silently wrong: nondeterministic sums)
// A deferred call runs before the rank's next communication of any kind, so every rank communicates in the Program's
// order and the emulation adds no deadlock. A read of a deferred buffer that slipped past the checks would see the
// unreduced values: parity would fail.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "exec/comm/communicator.hpp"
#include "exec/comm/deferred_work.hpp"
#include "exec/comm/forwarding_communicator.hpp"
#include "exec/core/backend.hpp"

namespace twin::exec {

enum class DeferredCheck { Order, Strict };

// The deferred collectives of one rank, shared by its DeferringCommunicator and its backend's DeferredCheckHook.
class DeferredCollectives {
 public:
  DeferredCollectives(int rank, DeferredCheck check) : rank_(rank), check_(check) {}

  void defer(std::function<void()> call, std::string what, std::vector<ByteRange> memory);
  // Runs every deferred call, in issue order (a wait point).
  void wait_all();
  // `kernel` is about to read or write `tensor` (named `tensor_name`): waits for the collectives that hold its
  // memory (Order), or throws InternalError (Strict).
  void touch(const Tensor& tensor, std::string_view kernel, std::string_view tensor_name);
  DeferredCheck check() const { return check_; }

 private:
  int rank_;
  DeferredCheck check_;
  DeferredWork<std::function<void()>> work_;
};

// A host communicator whose deferrable collectives (rule) wait in `deferred` until the rank's next wait point or
// communication; every other call runs them first (before_forward).
class DeferringCommunicator final : public ForwardingCommunicator {
 public:
  DeferringCommunicator(Communicator& host, DeferredCollectives& deferred, DeferralRule rule);

  std::string_view name() const override { return name_; }
  void all_reduce(const CommGroup& group, void* data, std::size_t count, DType dtype, std::string_view label) override;
  void reduce_scatter(const CommGroup& group, const void* in, void* out, std::size_t count, DType dtype,
                      std::string_view label) override;

 private:
  void before_forward() override { deferred_.wait_all(); }

  DeferredCollectives& deferred_;
  DeferralRule rule_;
  std::string name_;
};

// `inner`, with a kernel hook (exec/core/kernel_hook.hpp) that waits where CudaBackend waits for deferred collectives
// (its host waits) and touches every other kernel's tensors first (DeferredCollectives::touch).
std::unique_ptr<Backend> make_deferred_check_backend(std::unique_ptr<Backend> inner, DeferredCollectives& deferred);

}  // namespace twin::exec
