// A CPU host simulated from its profile (topology/host_profile.hpp): the unfused attention core's passes at the rate
// the profile measured for the attention core's kind, and, when the profile measured the core as one fused kernel
// (twin's CPU executor runs it so), the whole core at that kernel's rate.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "model/program/program.hpp"
#include "sim/cost_model.hpp"
#include "topology/host_profile.hpp"

namespace twin::sim {
namespace {

// bench/measured/cpu_loop.py's GPT: PyTorch's kernels (composer), fp32, one worker on a CPU host.
model::Scenario loop_scenario() {
  const auto path = std::filesystem::temp_directory_path() / ("twin-cpu-host-" + std::to_string(::getpid()) + ".toml");
  std::ofstream(path) << "[model]\nname = \"t\"\nlayers = 2\nhidden = 256\nheads = 4\nseq_len = 128\nvocab = 256\n"
                         "dtype = \"fp32\"\n[parallel]\ntp = 1\npp = 1\nmicro_batch = 8\nglobal_batch = 8\n"
                         "[cluster]\nnode = \"cpu-host\"\n[framework]\nname = \"composer\"\ndropout = false\n";
  return model::load_scenario(path);
}

topology::HostProfile profile() {
  topology::HostProfile p;
  p.device = "cpu";
  p.gemm_flops_per_s = 1e11;
  p.memory_bytes_per_s = 1e10;
  p.host_s_per_operator = 1e-5;
  return p;
}

const model::Op& attention_core(const model::Program& program, model::Phase phase) {
  for (const model::Op& op : program.ops_of_rank(0)) {
    if (op.kind == model::OpKind::Compute && op.what == model::ComputeKind::AttentionCore && op.phase == phase)
      return op;
  }
  throw std::logic_error("no attention core");
}

TEST(CpuHost, AttentionCorePassesAtTheirKindsRate) {
  const model::Scenario scenario = loop_scenario();
  const model::Program program = model::build_program(scenario, model::Granularity::Op);
  const model::Op& core = attention_core(program, model::Phase::Forward);
  double passes = 0, launches = 0;
  for (const model::Kernel& kernel : core.breakdown->kernels) {
    launches += kernel.launches;
    if (kernel.kind == model::KernelKind::AttentionPasses) passes += kernel.bytes;
  }
  ASSERT_GT(passes, 0);
  topology::HostProfile host = profile();
  const AnalyticalCostModel by_memory(topology::cpu_host_node(host, 1).gpu, host_parameters(host));
  host.memory_bytes_per_s_by_kind["attention_core"] = 2e9;
  const AnalyticalCostModel by_kind(topology::cpu_host_node(host, 1).gpu, host_parameters(host));
  // Only the passes move: from the memory rate to the kind's.
  EXPECT_NEAR(by_kind.compute_time_s(scenario, core) - by_memory.compute_time_s(scenario, core),
              passes / 2e9 - passes / 1e10, 1e-12);
  // The GEMMs: Q K^T and P V of 8 x 4 heads at the fitted rate, one launch each at the host's time per operator.
  const double gemms = 2.0 * 8 * 4 * 2 * 128 * 128 * 64 / 1e11;
  EXPECT_NEAR(by_memory.compute_time_s(scenario, core), gemms + passes / 1e10 + launches * 1e-5, 1e-12);
}

TEST(CpuHost, AMeasuredFusedAttentionTimesTheWholeCore) {
  const model::Scenario scenario = loop_scenario();
  const model::Program program = model::build_program(scenario, model::Granularity::Op);
  topology::HostProfile host = profile();
  host.attention_flops_per_s = 4e10;
  const AnalyticalCostModel cost(topology::cpu_host_node(host, 1).gpu, host_parameters(host));
  // The causal FLOPs a fused kernel computes: 2 b heads s^2 d forward, 2.5 times that backward; one launch each.
  const double forward_flops = 2.0 * 8 * 4 * 128 * 128 * 64;
  EXPECT_NEAR(cost.compute_time_s(scenario, attention_core(program, model::Phase::Forward)),
              forward_flops / 4e10 + 1e-5, 1e-12);
  EXPECT_NEAR(cost.compute_time_s(scenario, attention_core(program, model::Phase::Backward)),
              2.5 * forward_flops / 4e10 + 1e-5, 1e-12);
}

}  // namespace
}  // namespace twin::sim
