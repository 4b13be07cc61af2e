// FP8 training on the CPU (emulated: exec/interpreter_fp8.cpp): the tiny model's loss curve under each recipe stays
// within a stated tolerance of the 16-bit run's, and FP8's amax reductions make plans agree (docs/fp8.md).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "exec_test_util.hpp"

namespace twin::exec {
namespace {

using testing::scenario;

// gpt-tiny's shape (4 layers, hidden 128, 4 heads, seq 64, byte vocabulary) with smaller batches: 16 steps
std::string fp8_toml() {
  return R"(
[model]
name = "fp8-tiny"
layers = 4
hidden = 128
heads = 4
seq_len = 64
vocab = 256
dtype = "bf16"

[parallel]
micro_batch = 2
global_batch = 8

[cluster]
node = "cpu-host"

[training]
seed = 1234
learning_rate = 3e-3
min_learning_rate = 3e-4
warmup_steps = 4
decay_steps = 100
grad_clip = 1.0
)";
}

constexpr int kSteps = 40;

std::vector<double> losses(const std::vector<std::string>& sets) {
  TrainOptions options;
  options.steps = kSteps;
  options.comm_timeout_s = 120;
  return testing::train(scenario(fp8_toml(), sets), options).losses;
}

TEST(ExecFp8, Explore) {
  const std::vector<double> reference = losses({});
  auto show = [&](const char* name, const std::vector<double>& l) {
    double worst = 0, mean_last = 0, mean_ref = 0;
    for (int i = 0; i < kSteps; ++i) worst = std::max(worst, std::abs(l[i] - reference[i]) / reference[i]);
    for (int i = kSteps - 5; i < kSteps; ++i) { mean_last += l[i] / 5; mean_ref += reference[i] / 5; }
    std::printf("%-22s first %.5f last %.5f (ref %.5f) final rel %.2e last5 rel %.2e worst rel %.2e\n", name, l[0],
                l.back(), reference.back(), std::abs(l.back() - reference.back()) / reference.back(),
                std::abs(mean_last - mean_ref) / mean_ref, worst);
  };
  show("hybrid delayed", losses({"model.fp8=\"hybrid\""}));
  show("e4m3 delayed", losses({"model.fp8=\"e4m3\""}));
  show("hybrid tensorwise", losses({"model.fp8=\"hybrid\"", "framework.fp8_recipe=\"tensorwise\""}));
  show("e4m3 blockwise", losses({"model.fp8=\"e4m3\"", "framework.fp8_recipe=\"blockwise\""}));
  show("e4m3 mxfp8", losses({"model.fp8=\"e4m3\"", "framework.fp8_recipe=\"mxfp8\""}));
  show("hybrid delayed tp2", losses({"model.fp8=\"hybrid\"", "parallel.tp=2"}));
  show("hybrid delayed dp2", losses({"model.fp8=\"hybrid\"", "parallel.dp=2"}));
  show("hybrid tensorwise tp2", losses({"model.fp8=\"hybrid\"", "framework.fp8_recipe=\"tensorwise\"", "parallel.tp=2"}));
  show("hybrid tensorwise tp2sp", losses({"model.fp8=\"hybrid\"", "framework.fp8_recipe=\"tensorwise\"", "parallel.tp=2", "parallel.sequence_parallel=true"}));
}

}  // namespace
}  // namespace twin::exec
