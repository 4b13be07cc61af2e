// A KernelHook set on a backend runs before every kernel of its core and of each capability (MoE, context
// parallelism, FP8), with the kernel's name and its tensors, and before each host wait; removed, it runs no more.
#include "exec/core/kernel_hook.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "exec/cpu/cpu_backend.hpp"

namespace twin::exec {
namespace {

// "kernel: tensor tensor ..." or "wait: call", one line per call
class RecordingHook final : public KernelHook {
 public:
  explicit RecordingHook(std::vector<std::string>& calls) : calls_(calls) {}
  void before_kernel(std::string_view kernel, std::initializer_list<Operand> operands) override {
    std::string line = std::string(kernel) + ":";
    for (const Operand& operand : operands) line += std::string(" ") + operand.name;
    calls_.push_back(line);
  }
  void before_host_wait(std::string_view call) override { calls_.push_back("wait: " + std::string(call)); }

 private:
  std::vector<std::string>& calls_;
};

TEST(ExecKernelHook, RunsBeforeTheCoreAndEveryCapabilityAndEachHostWait) {
  cpu::CpuBackend backend;
  std::vector<std::string> calls;
  backend.set_kernel_hook(std::make_unique<RecordingHook>(calls));
  const int tokens = 2, experts = 3;
  const Tensor logits = backend.zeros(tokens * experts, DType::F32);  // the hook sees its fill
  const Tensor scores = backend.allocate(tokens * experts, DType::F32);
  backend.moe_kernels().moe_router_scores_forward(scores, logits, tokens, experts);
  ContextShape shape;
  shape.seq = 4, shape.cp = 2;  // one sequence of 4 tokens over 2 CP ranks: 2 local tokens, 1 head of 1
  const Tensor delta = backend.allocate(2, DType::F32), dout = backend.zeros(2, DType::F32);
  backend.context_kernels().context_ring_delta(delta, dout, dout, shape);
  const Tensor weight = backend.zeros(4, DType::F32), inp = backend.zeros(4, DType::F32);
  const Tensor out = backend.allocate(4, DType::F32);
  backend.fp8_kernels().fp8_matmul_forward(out, inp, weight, Tensor{}, 2, 2, 2, Fp8Operand{}, Fp8Operand{});
  // each token's softmax over the experts sums to 1, up to fp32 rounding of three terms (a few 1e-7)
  EXPECT_NEAR(backend.sum(scores), 2.0, 1e-6);
  const std::vector<std::string> expected = {"fill: x",
                                             "moe_router_scores_forward: scores logits",
                                             "fill: x",
                                             "context_ring_delta: delta dout out",
                                             "fill: x",
                                             "fill: x",
                                             "fp8_matmul_forward: out inp weight bias",
                                             "wait: sum"};
  EXPECT_EQ(calls, expected);

  backend.set_kernel_hook(nullptr);
  backend.moe_kernels().moe_router_scores_forward(scores, logits, tokens, experts);
  EXPECT_EQ(calls.size(), expected.size()) << "a removed hook still ran";
}

}  // namespace
}  // namespace twin::exec
