// The commands of measured runs as a user types them: twin calibrate, twin sim of a cpu-host from the profile it
// wrote, twin compare's guards, twin graph --chakra; exit codes and the one-line errors.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/cli/run_twin.hpp"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::HasSubstr;

using Result = twin::testing::ShellResult;

Result twin(const std::string& arguments) {
  return twin::testing::run_shell(std::string(TWIN_BINARY) + " " + arguments + " 2>&1");
}

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("twin-measured-cli-" + std::to_string(getpid()));
  fs::create_directories(dir);
  return dir / name;
}

// A CPU run's trace: one step of GEMMs at 1 GFLOP/s (shapes of gpt-tiny's QKV and MLP) and layer norms at 2 GB/s.
json cpu_trace() {
  json events = json::array();
  double t = 0;
  auto op = [&events, &t](const std::string& name, const json& dims, double seconds) {
    events.push_back({{"ph", "X"}, {"cat", "cpu_op"}, {"name", name}, {"pid", 1}, {"tid", 1}, {"ts", t * 1e6},
                      {"dur", seconds * 1e6}, {"args", {{"Input Dims", dims}}}});
    t += seconds;
  };
  events.push_back({{"ph", "X"}, {"cat", "user_annotation"}, {"name", "ProfilerStep#1"}, {"pid", 1}, {"tid", 1},
                    {"ts", 0}, {"dur", 1e5}});
  for (const long long n : {384, 512, 128}) op("aten::mm", {{256, 128}, {128, n}}, 2.0 * 256 * 128 * n / 1e9);
  op("aten::native_layer_norm", {{256, 128}, {128}, {128}}, 4.0 * (2 * 256 * 128 + 256) / 2e9);
  return {{"traceEvents", events}};
}

#ifdef TWIN_HAVE_SIMGRID
TEST(MeasuredCli, CalibrateThenSimulateACpuHost) {
  const fs::path trace = scratch("cpu.json"), profile = scratch("host.toml"), summary = scratch("sim.json");
  std::ofstream(trace) << cpu_trace().dump();
  const Result calibrated = twin("calibrate " + trace.string() + " --out " + profile.string());
  ASSERT_EQ(calibrated.status, 0) << calibrated.output;
  EXPECT_THAT(calibrated.output, HasSubstr("GEMM"));

  // In the units of the plan's Program: the time outside its ops per kernel it launches; a scenario that is not one
  // gets one error line.
  const Result by_program =
      twin("calibrate " + trace.string() + " --scenario gpt-tiny --out " + scratch("by_program.toml").string());
  ASSERT_EQ(by_program.status, 0) << by_program.output;
  EXPECT_THAT(by_program.output, HasSubstr("outside the Program's ops, per kernel it launches (--scenario)"));
  const Result no_plan = twin("calibrate " + trace.string() + " --scenario /nonexistent/plan.toml");
  EXPECT_EQ(no_plan.status, 2);
  EXPECT_THAT(no_plan.output, HasSubstr("twin: error:"));

  const Result refused = twin("sim gpt-tiny --quiet");
  EXPECT_EQ(refused.status, 2);
  EXPECT_THAT(refused.output, HasSubstr("twin: error: twin sim of a cpu-host needs the host's measured rates"));

  const Result simulated =
      twin("sim gpt-tiny --quiet --granularity op --profile " + profile.string() + " --json " + summary.string());
  ASSERT_EQ(simulated.status, 0) << simulated.output;
  EXPECT_THAT(simulated.output, HasSubstr("host profile"));
  std::ifstream in(summary);
  const json s = json::parse(in);
  EXPECT_EQ(s["scenario"]["hardware"], "cpu-host");
  EXPECT_GT(s["iteration_time_s"].get<double>(), 0);
  EXPECT_TRUE(s.contains("host_profile"));

  // A GPU scenario takes no host profile; a profile of a GPU run is not a host's.
  EXPECT_EQ(twin("sim gpt3-175b --quiet --profile " + profile.string()).status, 2);
  std::ofstream(scratch("gpu.toml")) << "[profile]\ndevice = \"NVIDIA A100-SXM4-80GB\"\n";
  const Result gpu = twin("sim gpt-tiny --quiet --profile " + scratch("gpu.toml").string());
  EXPECT_EQ(gpu.status, 2);
  EXPECT_THAT(gpu.output, HasSubstr("profile.device is \"NVIDIA A100-SXM4-80GB\""));
  std::ofstream(scratch("bad.toml")) << "[profile]\ndevice = \"cpu\"\n[gemm]\nflops_per_s = -1\n";
  const Result bad = twin("sim gpt-tiny --quiet --profile " + scratch("bad.toml").string());
  EXPECT_EQ(bad.status, 2);
  EXPECT_THAT(bad.output, HasSubstr("gemm.flops_per_s must be a positive number"));

  // The A100 prediction of another model against this CPU prediction: refused, every difference named.
  const fs::path a100 = scratch("a100.json");
  ASSERT_EQ(twin("sim gpt3-175b --quiet --json " + a100.string()).status, 0);
  const Result guarded = twin("compare " + a100.string() + " " + summary.string());
  EXPECT_EQ(guarded.status, 2);
  EXPECT_THAT(guarded.output, HasSubstr("model is gpt-tiny in the measurement and gpt3-175b in the prediction"));
  EXPECT_THAT(guarded.output, HasSubstr("hardware is cpu-host in the measurement and dgx-a100 in the prediction"));
  const Result allowed = twin("compare " + a100.string() + " " + summary.string() + " --allow-mismatch");
  EXPECT_EQ(allowed.status, 0);
  EXPECT_THAT(allowed.output, HasSubstr("WARNING: not the same run"));
}
#endif

#ifdef TWIN_HAVE_SIMGRID
// A GPU's profile (as twin calibrate writes one) named by the scenario key: its rates replace the cited ones, the
// summary says whose they are; a missing file, another GPU's profile, or --gpu with it get one error line.
TEST(MeasuredCli, GpuProfileScenarioKeyTimesWithTheMeasuredRates) {
  const fs::path profile = scratch("a100.toml"), cited = scratch("cited.json"), measured = scratch("measured.json");
  std::ofstream(profile) << "[profile]\ndevice = \"NVIDIA A100-SXM4-80GB\"\n"
                            "[[gemm.shape]]\nm = 8192\nn = 8192\nk = 8192\nbatch = 1\nflops_per_s = 1.5e14\n"
                            "[memory]\nbytes_per_s = 1.2e12\n"
                            "[[collective]]\nkind = \"all_reduce\"\nranks = 8\nnodes = 1\nlatency_s = 2e-5\n"
                            "bus_bytes_per_s = 1.0e11\n[[collective.size]]\nbytes = 1e8\n";
  const std::string key = "--set 'cluster.gpu_profile=\"" + profile.string() + "\"'";
  ASSERT_EQ(twin("sim gpt3-175b --quiet --json " + cited.string()).status, 0);
  const Result r = twin("sim gpt3-175b --quiet " + key + " --json " + measured.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("GPU constants: GEMM 150.0 TFLOP/s at 8192x8192x8192 (cluster.gpu_profile)"));
  EXPECT_THAT(r.output, HasSubstr("HBM 1200 GB/s (cluster.gpu_profile)"));
  EXPECT_THAT(r.output, HasSubstr("NVLink bus 100.0 GB/s (all_reduce of 8 ranks on 1 node)"));
  std::ifstream cited_in(cited), measured_in(measured);
  const json a = json::parse(cited_in), b = json::parse(measured_in);
  EXPECT_EQ(b["gpu_constants"]["gemm_source"], "cluster.gpu_profile");
  EXPECT_NEAR(b["gpu_constants"]["gemm_tflops"].get<double>(), 150, 1e-9);
  EXPECT_EQ(a["gpu_constants"]["gemm_source"], "cited");
  // Slower GEMMs, HBM and NVLink than the cited A100's: a longer iteration.
  EXPECT_GT(b["iteration_time_s"].get<double>(), 1.05 * a["iteration_time_s"].get<double>());

  const Result missing = twin("sim gpt3-175b --quiet --set 'cluster.gpu_profile=\"/nonexistent/p.toml\"'");
  EXPECT_EQ(missing.status, 2);
  EXPECT_THAT(missing.output, HasSubstr("cluster.gpu_profile: no such file '/nonexistent/p.toml'"));
  const Result what_if = twin("sim gpt3-175b --quiet --gpu h100 " + key);
  EXPECT_EQ(what_if.status, 2);
  EXPECT_THAT(what_if.output, HasSubstr("twin: error: cluster.gpu_profile measured the scenario's GPU"));
  std::ofstream(scratch("h100.toml"))
      << "[profile]\ndevice = \"NVIDIA H100 80GB HBM3\"\n[memory]\nbytes_per_s = 3e12\n";
  const Result other = twin("sim gpt3-175b --quiet --profile " + scratch("h100.toml").string());
  EXPECT_EQ(other.status, 2);
  EXPECT_THAT(other.output, HasSubstr("measured NVIDIA H100 80GB HBM3; this scenario runs on"));
  std::ofstream(scratch("fast.toml")) << "[[collective]]\nkind = \"all_reduce\"\nranks = 8\nnodes = 1\n"
                                         "bus_bytes_per_s = 9e11\n";
  const Result fast = twin("sim gpt3-175b --quiet --profile " + scratch("fast.toml").string());
  EXPECT_EQ(fast.status, 2);
  EXPECT_THAT(fast.output, HasSubstr("twin: error: --profile"));
  EXPECT_THAT(fast.output, HasSubstr("exceeds the link's datasheet rate"));
}
#endif

#ifdef TWIN_HAVE_SIMGRID
// bench/gpu twin_gemm_peak's printout -> twin calibrate -> the scenario's cluster.gpu_profile: the H200's measured GEMM
// and HBM rates time the simulation; --check has no plan to check on such a profile.
TEST(MeasuredCli, GemmPeakPrintoutCalibratesTheSimulatedGpu) {
  const fs::path printout = scratch("h200.txt"), profile = scratch("h200.toml");
  std::ofstream(printout) << "device NVIDIA H200, 132 SMs, 143771 MiB\n"
                             "gemm bf16 m 8192 n 8192 k 8192: median 1.570 ms (min 1.560), 700.3 TFLOP/s\n"
                             "hbm scale fp32 4096 MiB in place: median 2.100 ms, 4090 GB/s read + write\n";
  const Result calibrated = twin("calibrate " + printout.string() + " --out " + profile.string());
  ASSERT_EQ(calibrated.status, 0) << calibrated.output;
  EXPECT_THAT(calibrated.output, HasSubstr("profile of NVIDIA H200"));
  const Result r = twin("sim gpt-350m-h200 --quiet --set 'cluster.gpu_profile=\"" + profile.string() + "\"'");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("GEMM 700.3 TFLOP/s at 8192x8192x8192 (cluster.gpu_profile), HBM 4090 GB/s "
                                  "(cluster.gpu_profile)"));
  const Result check = twin("calibrate " + printout.string() + " --check " + printout.string());
  EXPECT_EQ(check.status, 2);
  EXPECT_THAT(check.output, HasSubstr("a microbenchmark's profile has no plan"));
}
#endif

#ifdef TWIN_HAVE_SIMGRID
// The README's example, word for word: the prediction of gpt3-175b against docs/examples/megatron-gpt3-175b.log.
TEST(MeasuredCli, TheReadmesMegatronLogExample) {
  const fs::path predicted = scratch("readme_predicted.json");
  ASSERT_EQ(twin("sim gpt3-175b --json " + predicted.string() + " --quiet").status, 0);
  const std::string log = TWIN_SOURCE_ROOT "/docs/examples/megatron-gpt3-175b.log";
  const Result r = twin("compare " + predicted.string() + " " + log);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("  measured:  megatron-lm log"));
  EXPECT_THAT(r.output, HasSubstr("  iteration time (s)              31.8441        32.0753     -0.7%"));
  EXPECT_THAT(r.output, HasSubstr("  model TFLOP/s per GPU          138.3378       138.0000     +0.2%"));
}
#endif

TEST(MeasuredCli, BadMeasuredFilesGetOneErrorLine) {
  const fs::path predicted = scratch("predicted.json");
  std::ofstream(predicted) << R"({"scenario": {"tp": 1, "pp": 1, "dp": 1, "micro_batches": 1}, "engine": "sim",
                                  "iteration_time_s": 1.0, "tflops_per_gpu": 1.0, "stages": []})";
  const fs::path log = scratch("empty.log");
  std::ofstream(log) << "nothing here\n";
  const Result r = twin("compare " + predicted.string() + " " + log.string());
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.output, HasSubstr("twin: error:"));
  EXPECT_THAT(r.output, HasSubstr("neither a PyTorch profiler trace nor a training log"));
  const fs::path broken = scratch("broken.json.gz");
  std::ofstream(broken) << "\x1f\x8b\x08\x00garbage";
  const Result gz = twin("compare " + predicted.string() + " " + broken.string());
  EXPECT_EQ(gz.status, 2);
  EXPECT_THAT(gz.output, HasSubstr("twin: error:"));
  const Result calibrate = twin("calibrate " + log.string());
  EXPECT_EQ(calibrate.status, 2);
  EXPECT_THAT(calibrate.output, HasSubstr("twin: error:"));
}

#ifdef TWIN_HAVE_CHAKRA
TEST(MeasuredCli, GraphWritesChakraTraces) {
  const fs::path dir = scratch("chakra");
  const Result r = twin("graph gpt-tiny --set parallel.pp=2 --chakra " + dir.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(fs::exists(dir / "twin.0.et"));
  EXPECT_TRUE(fs::exists(dir / "twin.1.et"));
  EXPECT_TRUE(fs::exists(dir / "twin.comm_groups.json"));
}
#endif

}  // namespace
