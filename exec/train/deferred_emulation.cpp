#include "exec/train/deferred_emulation.hpp"

#include <algorithm>
#include <initializer_list>
#include <string_view>
#include <utility>

#include <fmt/core.h>

#include "exec/core/check.hpp"

namespace twin::exec {

// --- the deferred calls of one rank ---------------------------------------------------------------------------------

void DeferredCollectives::defer(std::function<void()> call, std::string what, std::vector<ByteRange> memory) {
  work_.add({std::move(call), std::move(what), std::move(memory)});
}

void DeferredCollectives::wait_all() {
  for (auto& entry : work_.take_all()) entry.done();
}

void DeferredCollectives::touch(const Tensor& tensor, std::string_view kernel, std::string_view tensor_name) {
  if (work_.empty() || tensor.empty()) return;
  if (check_ == DeferredCheck::Strict) {
    const auto* entry = work_.find_overlapping(tensor.data, tensor.bytes());
    TWIN_EXEC_CHECK(entry == nullptr,
                    "rank {}: {} touches its {} ({} elements) while the deferred {} still holds that memory: on a GPU "
                    "the two race (nothing orders the compute stream after the NCCL stream before the wait)",
                    rank_, kernel, tensor_name, tensor.numel, entry->what);
    return;
  }
  for (auto& entry : work_.take_through_overlapping(tensor.data, tensor.bytes())) entry.done();
}

// --- the communicator -----------------------------------------------------------------------------------------------

namespace {

// "reduce_scatter <label> on the data group (ranks 0, 2)"; the call is left out when the label already names it
std::string describe(std::string_view call, std::string_view label, const CommGroup& group) {
  const bool named = label.find(call) != std::string_view::npos;
  return fmt::format("{}{}{} on the {} group ({})", named ? "" : call, named ? "" : " ", label, group.kind,
                     format_ranks(group.members));
}

}  // namespace

DeferringCommunicator::DeferringCommunicator(Communicator& host, DeferredCollectives& deferred, DeferralRule rule)
    : ForwardingCommunicator(host),
      deferred_(deferred),
      rule_(rule),
      name_(std::string(host.name()) + "+deferred-emulation") {}

void DeferringCommunicator::all_reduce(const CommGroup& group, void* data, std::size_t count, DType dtype,
                                       std::string_view label) {
  if (!rule_.defers_reduction(group)) return ForwardingCommunicator::all_reduce(group, data, count, dtype, label);
  // the call keeps copies of the group and label: the caller's may be gone when it runs
  deferred_.defer([this, group, data, count, dtype,
                   label = std::string(label)] { host().all_reduce(group, data, count, dtype, label); },
                  describe("all_reduce", label, group), {{data, count * dtype_bytes(dtype)}});
}

void DeferringCommunicator::reduce_scatter(const CommGroup& group, const void* in, void* out, std::size_t count,
                                           DType dtype, std::string_view label) {
  if (!rule_.defers_reduction(group)) {
    return ForwardingCommunicator::reduce_scatter(group, in, out, count, dtype, label);
  }
  const std::size_t bytes = count * dtype_bytes(dtype);
  deferred_.defer([this, group, in, out, count, dtype,
                   label = std::string(label)] { host().reduce_scatter(group, in, out, count, dtype, label); },
                  describe("reduce_scatter", label, group), {{in, bytes * group.members.size()}, {out, bytes}});
}

// --- the backend's hook --------------------------------------------------------------------------------------------

namespace {

// Waits where CudaBackend calls DeviceContext::wait_deferred (synchronize, host reads, the gradient norm, AdamW: the
// backend's host waits); every other kernel touches each of its tensors first, as CudaBackend orders them after the
// deferred collectives.
class DeferredCheckHook final : public KernelHook {
 public:
  explicit DeferredCheckHook(DeferredCollectives& deferred) : deferred_(deferred) {}

  void before_kernel(std::string_view kernel, std::initializer_list<Operand> operands) override {
    for (const Operand& operand : operands) deferred_.touch(operand.tensor, kernel, operand.name);
  }
  void before_host_wait(std::string_view) override { deferred_.wait_all(); }

 private:
  DeferredCollectives& deferred_;
};

}  // namespace

std::unique_ptr<Backend> make_deferred_check_backend(std::unique_ptr<Backend> inner, DeferredCollectives& deferred) {
  inner->set_kernel_hook(std::make_unique<DeferredCheckHook>(deferred));
  return inner;
}

}  // namespace twin::exec
