// KernelHook: code run before each of a backend's kernels and host waits, installed on any backend
// (Backend::set_kernel_hook) instead of a wrapper backend restating its methods. The debug mode that emulates the GPU's
// deferred collectives on the CPU (exec/train/deferred_emulation.hpp) is one: it checks every kernel's tensors
// against the collectives still in flight, and runs them where the host would wait for the device.
#pragma once

#include <initializer_list>
#include <string_view>

#include "exec/core/tensor.hpp"

namespace twin::exec {

// A tensor a kernel reads or writes, named as the kernel's parameter.
struct Operand {
  const Tensor& tensor;
  const char* name;
};

class KernelHook {
 public:
  virtual ~KernelHook() = default;
  // `kernel` (a Backend method's name) is about to run on `operands` (its tensors, empty ones included)
  virtual void before_kernel(std::string_view kernel, std::initializer_list<Operand> operands) = 0;
  // `call` is about to make the host wait for the device: synchronize, a host read (download_f32, download_i32, the
  // reductions to the host, the MoE loss), or the optimizer (where the CUDA backend waits for deferred collectives)
  virtual void before_host_wait(std::string_view call) = 0;
};

// Where a hook is called: a base of Backend and of each capability (MoeKernels, ContextKernels, Fp8Kernels), whose
// public methods call before_kernel / before_host_wait ahead of their do_ kernels. Not owning: Backend owns the hook.
class HookPoint {
 public:
  void attach_kernel_hook(KernelHook* hook) { hook_ = hook; }

 protected:
  ~HookPoint() = default;
  void before_kernel(std::string_view kernel, std::initializer_list<Operand> operands) const {
    if (hook_ != nullptr) hook_->before_kernel(kernel, operands);
  }
  void before_host_wait(std::string_view call) const {
    if (hook_ != nullptr) hook_->before_host_wait(call);
  }

 private:
  KernelHook* hook_ = nullptr;
};

}  // namespace twin::exec
