// twin calibrate --scenario: a CPU run's rates in the units of the plan's Program (measured/program_work.hpp). Made-up
// traces whose operators take known times against a made-up Program's work: the rates are recovered exactly, and the
// time no Program op stands for becomes a time per Program kernel.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <tuple>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "measured/calibrate.hpp"
#include "measured/kineto.hpp"
#include "measured/measured_run.hpp"
#include "measured/program_work.hpp"
#include "model/program/program.hpp"

namespace twin::measured {
namespace {

using nlohmann::json;

std::string temporary_path(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("twin-program-calibrate-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

json cpu_op(const std::string& name, double start_us, double duration_us, const json& dims = nullptr) {
  json e = {{"ph", "X"}, {"cat", "cpu_op"}, {"name", name},      {"pid", 1},
            {"tid", 1},  {"ts", start_us},  {"dur", duration_us}};
  if (!dims.is_null()) e["args"] = {{"Input Dims", dims}};
  return e;
}

KinetoTrace read(const json& events, const std::string& name) {
  const std::string path = temporary_path(name);
  std::ofstream(path) << json{{"traceEvents", events}}.dump();
  return read_kineto_trace(path);
}

// The loop's GPT (bench/measured/cpu_loop.py): PyTorch's kernels (composer), fp32, one worker on a CPU host.
model::Program loop_program(int layers, int batch) {
  const std::string path = temporary_path("plan.toml");
  std::ofstream(path) << "[model]\nname = \"t\"\nlayers = " << layers
                      << "\nhidden = 256\nheads = 4\nseq_len = 128\nvocab = 256\ndtype = \"fp32\"\n"
                         "[parallel]\ntp = 1\npp = 1\nmicro_batch = "
                      << batch << "\nglobal_batch = " << batch
                      << "\n[cluster]\nnode = \"cpu-host\"\n[framework]\nname = \"composer\"\ndropout = false\n";
  return model::build_program(model::load_scenario(path), model::Granularity::Op);
}

TEST(ProgramWork, BytesByClassLaunchesAndGemmShapes) {
  const model::Program program = loop_program(2, 8);
  const ProgramWork work = program_work(program);
  // The elementwise and norm ops are streams alone: their class's bytes are their ops' bytes.
  double elementwise = 0, norm = 0, ops = 0;
  for (const model::Op& op : program.ops_of_rank(0)) {
    if (op.kind != model::OpKind::Compute) continue;
    ops += 1;
    if (class_of(op.what) == KernelClass::Elementwise) elementwise += op.bytes;
    if (class_of(op.what) == KernelClass::Norm) norm += op.bytes;
  }
  EXPECT_GT(elementwise, 0);
  EXPECT_NEAR(work.stream_bytes.at(KernelClass::Elementwise), elementwise, 1e-6 * elementwise);
  EXPECT_NEAR(work.stream_bytes.at(KernelClass::Norm), norm, 1e-6 * norm);
  EXPECT_GT(work.stream_bytes.at(KernelClass::Attention), 0);  // the unfused core's passes
  EXPECT_GT(work.kernel_launches, ops);                        // a backward GEMM op launches two
  // The MLP's up projection: 8 x 128 tokens, 4 x 256 wide, from 256.
  const model::GemmShape up = work.gemm_shape_by_op_class.at("forward mlp_up");
  EXPECT_EQ(up.m, 8 * 128);
  EXPECT_EQ(up.n, 1024);
  EXPECT_EQ(up.k, 256);
  // Composer's nn.Linear sums its bias gradient in the backward GEMM op: e per output element.
  EXPECT_DOUBLE_EQ(work.gemm_pass_bytes_by_op_class.at("backward mlp_up"), 4.0 * 8 * 128 * 1024);
  EXPECT_FALSE(work.gemm_pass_bytes_by_op_class.contains("forward mlp_up"));
}

// One PyTorch step of 10 ms: a GEMM whose bias copy runs inside it, a layer norm, a GELU, a copy of its own, gaps.
json torch_step() {
  json events = json::array();
  events.push_back({{"ph", "X"},
                    {"cat", "user_annotation"},
                    {"name", "ProfilerStep#1"},
                    {"pid", 1},
                    {"tid", 1},
                    {"ts", 0},
                    {"dur", 10000}});
  events.push_back(cpu_op("aten::addmm", 0, 4000, json{{256}, {128, 64}, {64, 256}}));
  events.push_back(cpu_op("aten::copy_", 100, 500, json{{128, 256}, {128, 256}}));  // the bias, into the output
  events.push_back(cpu_op("aten::native_layer_norm", 4100, 1000, json{{128, 256}, {256}, {256}}));
  events.push_back(cpu_op("aten::gelu", 5200, 2000, json{{128, 256}}));
  events.push_back(cpu_op("aten::copy_", 7300, 700, json{{128, 256}, {128, 256}}));  // no Program op's
  return events;
}

TEST(Calibrate, PerProgramByteAndPerProgramKernel) {
  const KinetoTrace trace = read(torch_step(), "torch.json");
  // The bias copy inside aten::addmm is the GEMM's work; the copy on its own is no Program op's.
  ASSERT_EQ(trace.kernels.size(), 5u);
  EXPECT_EQ(trace.kernels[0].kind.kind, KernelClass::Gemm);  // the copy inside addmm (closed first)
  EXPECT_EQ(trace.kernels[1].kind.kind, KernelClass::Gemm);  // addmm's own 3.5 ms
  EXPECT_EQ(trace.kernels[4].kind.kind, KernelClass::Copy);
  ProgramWork work;
  work.stream_bytes = {{KernelClass::Gemm, 1e6}, {KernelClass::Norm, 4e6}, {KernelClass::Elementwise, 6e6}};
  work.kernel_launches = 50;
  const HardwareProfile without = calibrate({trace});
  const HardwareProfile profile = calibrate({trace}, CalibrateOptions{8, work});
  // Each class's time per byte its Program ops stream: the norm 1 ms, the GELU 2 ms, the GEMM's copy 0.5 ms.
  EXPECT_NEAR(profile.memory_bytes_per_s_by_kind.at("layernorm_mlp"), 4e6 / 1e-3, 1);
  EXPECT_NEAR(profile.memory_bytes_per_s_by_kind.at("final_layernorm"), 4e6 / 1e-3, 1);
  EXPECT_NEAR(profile.memory_bytes_per_s_by_kind.at("gelu"), 6e6 / 2e-3, 1);
  EXPECT_NEAR(profile.memory_bytes_per_s_by_kind.at("mlp_up"), 1e6 / 0.5e-3, 1);
  // Outside the modelled classes: the own copy's 0.7 ms and the 2.3 ms between operators, over 50 kernels.
  EXPECT_NEAR(profile.host_s_per_operator, (0.7e-3 + 2.3e-3) / 50, 1e-12);
  EXPECT_TRUE(profile.host_per_program_kernel);
  EXPECT_NE(profile_to_toml(profile).find("per kernel it launches"), std::string::npos);
  // The GEMM shape's rate is the addmm's own time, its bias copy not included.
  EXPECT_NEAR(profile.gemm_shapes.front().flops_per_s, 2.0 * 256 * 128 * 64 / 3.5e-3, 1);
  EXPECT_EQ(profile.gemm_shapes.front().flops_per_s, without.gemm_shapes.front().flops_per_s);
  // Without the Program: the time between operators per PyTorch operator, no per-byte kind rates for GEMMs.
  EXPECT_NEAR(without.host_s_per_operator, 2.3e-3 / 5, 1e-12);
  EXPECT_FALSE(without.host_per_program_kernel);
  EXPECT_FALSE(without.memory_bytes_per_s_by_kind.contains("mlp_up"));
}

// twin compare --fastest-step: the iteration and the kernel times by class both of the fastest step.
TEST(MeasuredRun, FastestStepMeasuresItsOwnClasses) {
  json events = torch_step();
  for (const json& e : torch_step()) {
    json slow = e;
    slow["ts"] = 20000 + 2 * e["ts"].get<double>();
    slow["dur"] = 2 * e["dur"].get<double>();
    if (e["name"] == "ProfilerStep#1") slow["name"] = "ProfilerStep#2";
    events.push_back(slow);
  }
  const std::string path = temporary_path("two_steps.json");
  std::ofstream(path) << json{{"traceEvents", events}}.dump();
  const RankMeasurement mean = read_measured(path).ranks.at(0);
  const RankMeasurement fastest = read_measured(path, 0, true).ranks.at(0);
  EXPECT_NEAR(mean.iteration_time_s, 15e-3, 1e-12);
  EXPECT_NEAR(fastest.iteration_time_s, 10e-3, 1e-12);
  const auto gelu = static_cast<std::size_t>(KernelClass::Elementwise);
  EXPECT_NEAR(mean.class_s[gelu], 3e-3, 1e-12);
  EXPECT_NEAR(fastest.class_s[gelu], 2e-3, 1e-12);
}

json twin_op(const std::string& name, double start_us, double duration_us, double flops, double bytes) {
  return {{"name", name + " layer 0 micro-batch 0"},
          {"cat", "compute"},
          {"ph", "X"},
          {"pid", 0},
          {"tid", 0},
          {"ts", start_us},
          {"dur", duration_us},
          {"args", {{"bytes", bytes}, {"flops", flops}}}};
}

TEST(Calibrate, TwinsOwnGemmsByTheirProgramShapes) {
  const double m = 1024, n = 1024, k = 256, flops = 2 * m * n * k;
  json events = json::array();
  events.push_back(twin_op("forward mlp_up", 0, 4000, flops, 0));
  events.push_back(twin_op("forward mlp_residual", 4000, 1000, 0, 4e6));  // 4 GB/s
  events.push_back(twin_op("backward mlp_up", 5000, 9000, 2 * flops, 0));
  events.push_back(twin_op("forward attention_core", 14000, 2000, 4e7, 1e6));
  events.push_back(twin_op("backward attention_core", 16000, 3000, 8e7, 1e6));
  const std::string path = temporary_path("twin.json");
  std::ofstream(path) << json{{"otherData", {{"engine", "exec"}}}, {"traceEvents", events}}.dump();
  const KinetoTrace trace = read_kineto_trace(path);
  ProgramWork work;
  work.gemm_shape_by_op_class = {{"forward mlp_up", {1024, 1024, 256, 1}}, {"backward mlp_up", {1024, 1024, 256, 1}}};
  work.gemm_pass_bytes_by_op_class = {{"backward mlp_up", 4e6}};  // its bias gradient: 1 ms at the residual's rate
  work.kernel_launches = 10;
  const HardwareProfile profile = calibrate({trace}, CalibrateOptions{8, work});
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t>, double> rates;
  for (const ShapeRate& s : profile.gemm_shapes) rates[{s.shape.m, s.shape.n, s.shape.k}] = s.flops_per_s;
  ASSERT_EQ(rates.size(), 3u);
  EXPECT_NEAR(rates.at({1024, 1024, 256}), flops / 4e-3, 1);  // forward [m, k] x [k, n]
  // Backward: 9 ms less the bias gradient's 1 ms, half to dX [m, n] x [n, k], half to dW [k, m] x [m, n].
  EXPECT_NEAR(rates.at({1024, 256, 1024}), flops / 4e-3, 1);
  EXPECT_NEAR(rates.at({256, 1024, 1024}), flops / 4e-3, 1);
  EXPECT_NEAR(profile.memory_bytes_per_s_by_kind.at("mlp_up"), 4e9, 1);
  // The attention core's rate: its FLOPs over its time, forward and backward together (as a fused kernel counts
  // them: the causal half forward, 5/8 backward), no intercept.
  EXPECT_NEAR(profile.attention.rate_per_s, (0.5 * 4e7 + 5.0 / 8 * 8e7) / 5e-3, 1);
  EXPECT_EQ(profile.attention.overhead_s, 0);
}

}  // namespace
}  // namespace twin::measured
