// check_supported refuses, by the scenario key and the backend's name, a Program that needs a kernel capability the
// backend lacks (MoE, context parallelism, FP8), before training; a backend with the capability passes.
#include "exec/train/check_supported.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "exec/core/errors.hpp"
#include "exec/cpu/cpu_backend.hpp"
#include "exec_test_util.hpp"
#include "model/program/program.hpp"
#include "tiny_moe.hpp"

namespace twin::exec {
namespace {

// The dense core only, as a new device would start: every kernel a no-op (none runs: the refusal comes first).
class CoreOnlyBackend : public Backend {
 public:
  std::string_view name() const override { return "core-only"; }
  Device device() const override { return Device::Host; }
  DType activation_dtype() const override { return DType::F32; }
  bool keeps_master_weights() const override { return false; }
  Tensor allocate(std::size_t numel, DType dtype) override {
    Tensor t;
    t.numel = numel;
    t.dtype = dtype;
    return t;
  }

 protected:
  void do_upload_f32(const Tensor&, const float*) override {}
  void do_download_f32(float*, const Tensor&) override {}
  void do_download_i32(int*, const Tensor&) override {}
  void do_upload_i32(const Tensor&, const int*) override {}
  void do_synchronize() override {}
  void do_fill(const Tensor&, float) override {}
  void do_copy(const Tensor&, const Tensor&) override {}
  void do_accumulate(const Tensor&, const Tensor&) override {}
  void do_residual_forward(const Tensor&, const Tensor&, const Tensor&) override {}
  void do_bias_add(const Tensor&, const Tensor&, int, int) override {}
  void do_bias_backward(const Tensor&, const Tensor&, int, int) override {}
  double do_squared_norm(const Tensor&) override { return 0; }
  double do_sum(const Tensor&) override { return 0; }
  void do_embedding_forward(const Tensor&, const Tensor&, const Tensor&, int, int, int, int) override {}
  void do_embedding_backward(const Tensor&, const Tensor&, const Tensor&, int, int, int, int) override {}
  void do_position_embedding_forward(const Tensor&, const Tensor&, int, int, int) override {}
  void do_position_embedding_backward(const Tensor&, const Tensor&, int, int, int) override {}
  void do_layernorm_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                            int, int) override {}
  void do_layernorm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                             const Tensor&, const Tensor&, int, int) override {}
  void do_matmul_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int, int, int) override {}
  void do_matmul_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, int,
                          int, int) override {}
  void do_attention_forward(const Tensor&, const Tensor&, const Tensor&, int, int, int, int, int,
                            const Tensor&) override {}
  void do_attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, int, int, int,
                             int, int, const Tensor&) override {}
  void do_gelu_forward(const Tensor&, const Tensor&) override {}
  void do_gelu_backward(const Tensor&, const Tensor&, const Tensor&) override {}
  void do_rmsnorm_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int, int) override {}
  void do_rmsnorm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                           int, int) override {}
  void do_swiglu_forward(const Tensor&, const Tensor&, int, int) override {}
  void do_swiglu_backward(const Tensor&, const Tensor&, const Tensor&, int, int) override {}
  void do_rope_forward(const Tensor&, int, int, int, int, int, int) override {}
  void do_rope_backward(const Tensor&, int, int, int, int, int, int) override {}
  void do_cross_entropy_local_stats(const Tensor&, const Tensor&, const Tensor&, int, int, int, int) override {}
  void do_cross_entropy_combine(const Tensor&, const Tensor&, const Tensor&, int, int) override {}
  void do_cross_entropy_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int, int, int, int,
                                 float) override {}
  void do_adamw_update(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                       const AdamWStep&) override {}
};

// FP8 GEMMs whose backward computes dW with dX only, as the cuda backend's do (splits_fp8_backward false).
class UnsplitFp8Backend final : public CoreOnlyBackend, public Fp8Kernels {
 public:
  UnsplitFp8Backend() { provide(nullptr, nullptr, this); }
  std::string_view name() const override { return "unsplit-fp8"; }

 protected:
  Fp8Amaxes do_fp8_matmul_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int, int, int,
                                  const Fp8Operand&, const Fp8Operand&) override {
    return {};
  }
  Fp8Amaxes do_fp8_matmul_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                   const Tensor&, int, int, int, const Fp8Operand&, const Fp8Operand&,
                                   const Fp8Operand&) override {
    return {};
  }
};

// parallel.cp = 2 the all_gather way (context parallelism needs the fused attention)
const std::vector<std::string> kCp2 = {"parallel.cp=2", "framework.attention=\"flash2\"",
                                       "framework.cp_comm=\"all_gather\""};

model::Program program_of(const std::string& toml, const std::vector<std::string>& sets = {}) {
  return model::build_program(testing::scenario(toml, sets), model::Granularity::Op);
}

// The one error line check_supported throws for `program` on `backend`, or "" when it accepts.
std::string refusal(const model::Program& program, const Backend& backend) {
  try {
    check_supported(program, backend);
  } catch (const RunError& error) {
    return error.what();
  }
  return "";
}

TEST(ExecCheckSupported, RefusesEachMissingCapabilityByKeyAndBackend) {
  const CoreOnlyBackend core;
  EXPECT_EQ(core.moe(), nullptr);
  EXPECT_EQ(core.context(), nullptr);
  EXPECT_EQ(core.fp8(), nullptr);
  EXPECT_EQ(refusal(program_of(testing::small_toml()), core), "");  // a dense plan needs the core only

  const std::string moe = refusal(program_of(testing::tiny_moe_toml()), core);
  EXPECT_NE(moe.find("model.experts = 4: the core-only backend does not run Mixture-of-Experts layers"),
            std::string::npos)
      << moe;
  const std::string cp = refusal(program_of(testing::parity_toml(), kCp2), core);
  EXPECT_NE(cp.find("parallel.cp = 2: the core-only backend does not run context parallelism"), std::string::npos)
      << cp;
  const std::string fp8 =
      refusal(program_of(testing::parity_toml(), {"model.dtype=\"bf16\"", "model.fp8=\"hybrid\""}), core);
  EXPECT_NE(fp8.find("model.fp8 = hybrid: the core-only backend runs no FP8 GEMMs"), std::string::npos) << fp8;
  // the error is one line: the user's
  for (const std::string& line : {moe, cp, fp8}) EXPECT_EQ(line.find('\n'), std::string::npos) << line;
}

TEST(ExecCheckSupported, TheCpuBackendHasEveryCapability) {
  cpu::CpuBackend cpu;
  EXPECT_NE(cpu.moe(), nullptr);
  EXPECT_NE(cpu.context(), nullptr);
  EXPECT_NE(cpu.fp8(), nullptr);
  EXPECT_EQ(refusal(program_of(testing::tiny_moe_toml()), cpu), "");
  EXPECT_EQ(refusal(program_of(testing::parity_toml(), kCp2), cpu), "");
  // what the executor does not run of MoE on any backend is still refused, by its key
  const std::string tp = refusal(program_of(testing::tiny_moe_toml(), {"parallel.tp=2"}), cpu);
  EXPECT_NE(tp.find("parallel.sequence_parallel"), std::string::npos) << tp;
}

// The schedules that split the backward defer an FP8 layer's dW to its W: a backend whose FP8 backward cannot leave
// dW out is refused by the schedule's key and its name; the same plan in 1F1B, and the cpu backend, pass.
TEST(ExecCheckSupported, RefusesFp8ZeroBubbleOnABackendThatCannotDeferTheFp8WeightGradient) {
  const UnsplitFp8Backend unsplit;
  cpu::CpuBackend cpu;
  EXPECT_FALSE(unsplit.fp8()->splits_fp8_backward());
  EXPECT_TRUE(cpu.fp8()->splits_fp8_backward());
  const std::vector<std::string> fp8 = {"model.dtype=\"bf16\"", "model.fp8=\"hybrid\"", "parallel.pp=2"};
  std::vector<std::string> zb = fp8;
  zb.push_back("parallel.schedule=\"zb-h1\"");
  EXPECT_EQ(refusal(program_of(testing::parity_toml(), fp8), unsplit), "");
  EXPECT_EQ(refusal(program_of(testing::parity_toml(), zb), cpu), "");
  const std::string refused = refusal(program_of(testing::parity_toml(), zb), unsplit);
  EXPECT_NE(refused.find("parallel.schedule = \"zb-h1\" with model.fp8 = hybrid: the unsplit-fp8 backend's FP8 GEMMs"),
            std::string::npos)
      << refused;
  EXPECT_EQ(refused.find('\n'), std::string::npos) << refused;
}

TEST(ExecCheckSupported, ACapabilityCallOnABackendWithoutItNamesTheBackend) {
  const CoreOnlyBackend core;
  EXPECT_THROW(core.moe_kernels(), RunError);
  EXPECT_THROW(core.context_kernels(), RunError);
  EXPECT_THROW(core.fp8_kernels(), RunError);
}

}  // namespace
}  // namespace twin::exec
