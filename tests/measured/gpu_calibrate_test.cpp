// twin calibrate on GPU runs: generated PyTorch profiler traces whose kernels take known times (GEMMs, memory-bound
// kernels, fused attention, NCCL collectives within and across nodes) give back those rates; a profile fitted on one
// plan is checked on another plan's trace (the out-of-sample error); twin's microbenchmark outputs are profiles too;
// and the HolisticTraceAnalysis sample, a real trace, gives what it holds.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "measured/calibrate.hpp"
#include "measured/kineto.hpp"
#include "measured/microbenchmarks.hpp"
#include "measured/op_args.hpp"

namespace twin::measured {
namespace {

using nlohmann::json;
using testing::HasSubstr;

std::string temporary(const std::string& name, const std::string& text) {
  const auto dir = std::filesystem::temp_directory_path() / ("twin-gpu-calibrate-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / name) << text;
  return (dir / name).string();
}

// The rates the generated traces' kernels run at.
constexpr double kGemmFlopsPerS = 2.5e14;
constexpr double kHbmBytesPerS = 1.6e12, kHbmOverheadS = 3e-6;
constexpr double kAttentionFlopsPerS = 3e14, kAttentionOverheadS = 5e-6;
constexpr double kNvlinkBusBytesPerS = 1.5e11, kNvlinkLatencyS = 1e-5;
constexpr double kNetworkBusBytesPerS = 2e10, kNetworkLatencyS = 3e-5;

// One rank's trace of one profiled step: each operator on the host thread launches its kernel (same correlation);
// the kernels run back to back on stream 7, the collectives on stream 20.
class GpuTrace {
 public:
  void launch(const std::string& op, const json& args, const std::string& kernel, double kernel_s,
              const json& kernel_args = json::object()) {
    const int id = next_correlation_++;
    events_.push_back(event("cpu_op", op, 1, 1, host_us_, 8, args));
    events_.push_back(event("cuda_runtime", "cudaLaunchKernel", 1, 1, host_us_ + 2, 4, {{"correlation", id}}));
    json k_args = kernel_args;
    const bool nccl = kernel.rfind("nccl", 0) == 0;
    k_args["stream"] = nccl ? 20 : 7;
    k_args["correlation"] = id;
    double& clock = nccl ? comm_us_ : compute_us_;
    clock = std::max(clock, host_us_ + 10);
    events_.push_back(event("kernel", kernel, 0, nccl ? 20 : 7, clock, kernel_s * 1e6, k_args));
    clock += kernel_s * 1e6;
    host_us_ += 10;
  }

  json document() const {
    json events = events_;
    events.push_back(event("user_annotation", "ProfilerStep#3", 1, 1, 0, host_us_ + 1, json::object()));
    return {{"schemaVersion", 1},
            {"deviceProperties", {{{"id", 0}, {"name", "NVIDIA A100-SXM4-80GB"}, {"totalGlobalMem", 85899345920.0}}}},
            {"distributedInfo", {{"backend", "nccl"}, {"rank", 0}, {"world_size", 16}}},
            {"traceEvents", events}};
  }

 private:
  static json event(const char* category, const std::string& name, int pid, int tid, double ts_us, double dur_us,
                    const json& args) {
    return {{"ph", "X"},  {"cat", category}, {"name", name},  {"pid", pid},
            {"tid", tid}, {"ts", ts_us},     {"dur", dur_us}, {"args", args}};
  }

  json events_ = json::array();
  double host_us_ = 10, compute_us_ = 0, comm_us_ = 0;
  int next_correlation_ = 1;
};

json bf16_dims(const json& dims) {
  json types = json::array();
  for (std::size_t i = 0; i < dims.size(); ++i) types.push_back("c10::BFloat16");
  return {{"Input Dims", dims}, {"Input type", types}};
}

json collective_args(double elements, int group_size, const std::string& ranks) {
  return {{"Collective name", "allreduce"}, {"In msg nelems", elements},
          {"Out msg nelems", elements},     {"dtype", "BFloat16"},
          {"Group size", group_size},       {"Process Group Ranks", ranks}};
}

double tp_all_reduce_s(double elements, double bus_bytes_per_s) {
  return kNvlinkLatencyS + 2.0 * elements * 2 * 7 / 8 / bus_bytes_per_s;  // bf16; all-reduce bus factor 2 (n-1)/n
}

// One plan's rank 0: `tokens` rows through a layer of width 4096 (tensor-parallel over 8 GPUs of a node, its
// gradients all-reduced with the rank of the next node); the tensor-parallel all-reduces at `nvlink_bus_bytes_per_s`.
json plan_trace(std::int64_t tokens, std::int64_t seq, double nvlink_bus_bytes_per_s = kNvlinkBusBytesPerS) {
  GpuTrace trace;
  const std::int64_t c = 4096;
  for (const std::int64_t n : {3 * c / 8, c / 8, 4 * c / 8}) {
    const double flops = 2.0 * tokens * n * c;
    trace.launch("aten::mm", bf16_dims({{tokens, c}, {c, n}}), "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_tn",
                 flops / kGemmFlopsPerS);
  }
  const double add_bytes = 3.0 * tokens * c * 2;  // two bf16 inputs read, one written
  trace.launch("aten::add", bf16_dims({{tokens, c}, {tokens, c}}),
               "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>()",
               kHbmOverheadS + add_bytes / kHbmBytesPerS);
  const double norm_bytes = 2.0 * (2.0 * tokens * c + 2 * c);
  trace.launch("aten::native_layer_norm", bf16_dims({{tokens, c}, {c}, {c}}),
               "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>()",
               kHbmOverheadS + norm_bytes / kHbmBytesPerS);
  const std::int64_t batch = tokens / seq, heads = 32 / 8, head_dim = 128;
  const json qkv = {{batch, heads, seq, head_dim}, {batch, heads, seq, head_dim}, {batch, heads, seq, head_dim}};
  const double forward_flops = 4.0 * batch * heads * seq * seq * head_dim / 2;  // causal
  json forward_args = bf16_dims(qkv);
  forward_args["Concrete Inputs"] = {"", "", "", "0.0", "True", "False", ""};
  trace.launch("aten::_scaled_dot_product_flash_attention", forward_args,
               "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>(Flash_fwd_params)",
               kAttentionOverheadS + forward_flops / kAttentionFlopsPerS);
  trace.launch("aten::_scaled_dot_product_flash_attention_backward", bf16_dims(qkv),
               "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits>()",
               kAttentionOverheadS + 2.5 * forward_flops / kAttentionFlopsPerS);
  for (const double elements : {double(tokens * c), double(tokens * c / 16)}) {
    trace.launch("record_param_comms", json::object(), "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*)",
                 tp_all_reduce_s(elements, nvlink_bus_bytes_per_s),
                 collective_args(elements, 8, "[0, 1, 2, 3, 4, 5, 6, 7]"));
  }
  for (const double elements : {3e7, 1e8}) {  // the data-parallel gradients: rank 0 with rank 8, on the next node
    trace.launch("record_param_comms", collective_args(elements, 2, "[0, 8]"),
                 "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*)",
                 kNetworkLatencyS + 2.0 * elements * 2 * 1 / 2 / kNetworkBusBytesPerS);
  }
  return trace.document();
}

TEST(GpuCalibrate, KernelsCarryTheWorkTheirOperatorsRecorded) {
  const KinetoTrace trace = read_kineto_trace(temporary("plan_a.json", plan_trace(4096, 2048).dump()));
  ASSERT_TRUE(trace.gpu);
  int gemms = 0, memory = 0, attention = 0, collectives = 0;
  for (const TracedKernel& k : trace.kernels) {
    ASSERT_EQ(k.iteration, 0) << k.name;
    if (k.kind.kind == KernelClass::Gemm) gemms += k.flops > 0;
    if (k.kind.kind == KernelClass::Elementwise || k.kind.kind == KernelClass::Norm) memory += k.bytes > 0;
    if (k.kind.kind == KernelClass::Attention) attention += k.flops > 0;
    if (k.kind.kind == KernelClass::Communication) {
      ++collectives;
      EXPECT_GT(k.collective.bytes, 0) << k.name;
      EXPECT_EQ(k.collective.ranks.size(), static_cast<std::size_t>(k.collective.group_size));
    }
  }
  EXPECT_EQ(gemms, 3);
  EXPECT_EQ(memory, 2);
  EXPECT_EQ(attention, 2);
  EXPECT_EQ(collectives, 4);  // two recorded on the NCCL kernel, two on the operator that launched it
}

TEST(GpuCalibrate, RecoversHbmAttentionAndBusBandwidthsAndChecksAnotherPlan) {
  const HardwareProfile profile =
      calibrate({read_kineto_trace(temporary("plan_a.json", plan_trace(4096, 2048).dump()))});
  EXPECT_EQ(profile.device, "NVIDIA A100-SXM4-80GB");
  EXPECT_NEAR(profile.gemm.rate_per_s, kGemmFlopsPerS, kGemmFlopsPerS * 1e-6);
  EXPECT_NEAR(profile.memory.rate_per_s, kHbmBytesPerS, kHbmBytesPerS * 1e-6);
  EXPECT_NEAR(profile.memory.overhead_s, kHbmOverheadS, 1e-10);
  EXPECT_NEAR(profile.attention.rate_per_s, kAttentionFlopsPerS, kAttentionFlopsPerS * 1e-6);
  EXPECT_NEAR(profile.attention.overhead_s, kAttentionOverheadS, 1e-10);
  ASSERT_EQ(profile.collectives.size(), 2u);
  for (const CollectiveFit& c : profile.collectives) {
    EXPECT_EQ(c.kind, CommKind::AllReduce);
    ASSERT_EQ(c.sizes.size(), 2u);
    EXPECT_LT(c.sizes[0].bus_bytes_per_s, c.sizes[1].bus_bytes_per_s);  // the small message pays more latency
    if (c.ranks == 8) {
      EXPECT_EQ(c.nodes, 1);
      EXPECT_NEAR(c.fit.rate_per_s, kNvlinkBusBytesPerS, kNvlinkBusBytesPerS * 1e-6);
      EXPECT_NEAR(c.fit.overhead_s, kNvlinkLatencyS, 1e-10);
    } else {
      EXPECT_EQ(c.ranks, 2);
      EXPECT_EQ(c.nodes, 2);
      EXPECT_NEAR(c.fit.rate_per_s, kNetworkBusBytesPerS, kNetworkBusBytesPerS * 1e-6);
      EXPECT_NEAR(c.fit.overhead_s, kNetworkLatencyS, 1e-10);
    }
  }
  // Another plan (twice the tokens, sequences of 4096) on a node whose tensor-parallel all-reduces ran at 1.2e11 bus
  // bytes/s: the check is that plan's trace timed by this profile, so it shows the difference; the in-sample fit
  // cannot.
  const OutOfSample check =
      check_profile(profile, read_kineto_trace(temporary("plan_b.json", plan_trace(8192, 4096, 1.2e11).dump())));
  EXPECT_NEAR(check.gemm_predicted_s, check.gemm_measured_s, check.gemm_measured_s * 1e-6);
  EXPECT_NEAR(check.memory_predicted_s, check.memory_measured_s, check.memory_measured_s * 1e-6);
  EXPECT_NEAR(check.attention_predicted_s, check.attention_measured_s, check.attention_measured_s * 1e-6);
  const double c = 4096, network = kNetworkLatencyS * 2 + (3e7 + 1e8) * 2 / kNetworkBusBytesPerS;
  const double measured = tp_all_reduce_s(8192 * c, 1.2e11) + tp_all_reduce_s(8192 * c / 16, 1.2e11) + network;
  const double predicted =
      tp_all_reduce_s(8192 * c, kNvlinkBusBytesPerS) + tp_all_reduce_s(8192 * c / 16, kNvlinkBusBytesPerS) + network;
  EXPECT_NEAR(check.collective_measured_s, measured, measured * 1e-6);
  EXPECT_NEAR(check.collective_predicted_s, predicted, predicted * 1e-6);
  EXPECT_GT(check.collective_measured_s - check.collective_predicted_s, 1e-4);

  const std::string table = profile_table(HardwareProfile{profile}), toml = profile_to_toml(profile);
  EXPECT_THAT(table, HasSubstr("all_reduce 8 ranks on 1 node(s): 150.0 GB/s bus bandwidth + 10.0 us latency"));
  EXPECT_THAT(toml, HasSubstr("[memory]\nbytes_per_s = 1.600000e+12"));
  EXPECT_THAT(toml, HasSubstr("[attention]"));
  EXPECT_THAT(toml, HasSubstr("kind = \"all_reduce\"\nranks = 2\nnodes = 2\n"));
}

TEST(GpuCalibrate, OperatorArgsGiveShapesBytesFlopsAndGroups) {
  const json linear = {{"Input Dims", {{4, 512, 1024}, {3072, 1024}, {3072}}}};
  const auto shape = matmul_shape("aten::linear", linear);
  ASSERT_TRUE(shape.has_value());
  EXPECT_EQ(shape->m, 2048);
  EXPECT_EQ(shape->n, 3072);
  EXPECT_EQ(shape->k, 1024);
  EXPECT_FALSE(matmul_shape("aten::add", linear).has_value());
  // Every input read once, the largest written: fp32 where no type was recorded.
  EXPECT_DOUBLE_EQ(traffic_bytes({{"Input Dims", {{10, 10}, {10, 10}}}}), 3 * 100 * 4.0);
  EXPECT_DOUBLE_EQ(traffic_bytes(bf16_dims({{10, 10}, {10, 10}})), 3 * 100 * 2.0);
  // Attention in [b, s, h, d] (flash_attn), full mask: 4 b h s^2 d; the backward 2.5 times it.
  json full = {{"Input Dims", {{2, 1024, 16, 64}}}, {"Concrete Inputs", {"", "False"}}};
  EXPECT_DOUBLE_EQ(attention_flops("aten::_flash_attention_forward", full), 4.0 * 2 * 16 * 1024 * 1024 * 64);
  EXPECT_DOUBLE_EQ(attention_flops("aten::_flash_attention_backward", full), 2.5 * 4.0 * 2 * 16 * 1024 * 1024 * 64);
  EXPECT_EQ(attention_flops("aten::mm", full), 0);
  // A group the profiler cut short continues at its stride.
  const auto call = collective_call({{"In msg nelems", 1000},
                                     {"Out msg nelems", 8000},
                                     {"dtype", "Float"},
                                     {"Group size", 8},
                                     {"Process Group Ranks", "[0, 8, 16, ...]"}});
  ASSERT_TRUE(call.has_value());
  EXPECT_DOUBLE_EQ(call->bytes, 32000);
  EXPECT_EQ(call->ranks.back(), 56);
  EXPECT_EQ(nodes_spanned(*call, 8), 8);
  EXPECT_EQ(nodes_spanned(*call, 16), 4);
  EXPECT_FALSE(collective_call({{"In msg nelems", 1000}, {"dtype", "Quaternion"}}).has_value());
  EXPECT_DOUBLE_EQ(bus_factor(CommKind::AllReduce, 8), 2.0 * 7 / 8);
  EXPECT_DOUBLE_EQ(bus_factor(CommKind::AllGather, 4), 3.0 / 4);
}

// bench/gpu/gemm_peak.cpp's printout (its format, line by line).
constexpr const char* kGemmPeak = R"(device NVIDIA H200, 132 SMs, 143771 MiB
gemm bf16 m 8192 n 8192 k 8192: median 1.570 ms (min 1.560), 700.3 TFLOP/s
gemm bf16 m 4096 n 4096 k 4096: median 0.220 ms (min 0.218), 624.7 TFLOP/s
peak_tflops 700.3
hbm scale fp32 4096 MiB in place: median 2.100 ms, 4090 GB/s read + write
hbm_gb_per_s 4090
attention gemms bf16 32 heads of 128, seq 4096: q k^T median 0.400 ms, p v 0.380 ms, 2800 GB/s, 0.68 of the stream rate
attention_gemm_hbm_fraction 0.68
flash attention bf16 causal, 4 x 32 heads of 128, seq 4096: forward median 0.500 ms 1099.5 TFLOP/s, backward 1.400 ms 981.7 TFLOP/s
)";

TEST(Microbenchmarks, GemmPeakPrintoutIsAGpuProfile) {
  EXPECT_EQ(source_kind(kGemmPeak), SourceKind::GemmPeak);
  const HardwareProfile p = profile_from_gemm_peak("h200.txt", kGemmPeak);
  EXPECT_EQ(p.device, "NVIDIA H200");
  ASSERT_EQ(p.gemm_shapes.size(), 2u);
  EXPECT_EQ(p.gemm_shapes[0].shape.m, 8192);  // largest first
  EXPECT_NEAR(p.gemm_shapes[0].flops_per_s, 2.0 * 8192 * 8192 * 8192 / 1.570e-3, 1e6);
  EXPECT_NEAR(p.memory.rate_per_s, 2 * 4096 * 1048576.0 / 2.1e-3, 1e3);
  EXPECT_DOUBLE_EQ(p.attention_gemm_hbm_fraction, 0.68);
  const double forward = 4.0 * 4 * 32 * 4096 * 4096 * 128 / 2;
  // Forward and backward (at 2.5 times the forward's FLOPs): a line through them would cross zero below zero, so the
  // fit is the line through the origin, least squares: rate = sum(x^2) / sum(x t).
  EXPECT_EQ(p.attention.samples, 2u);
  EXPECT_EQ(p.attention.overhead_s, 0);
  EXPECT_NEAR(p.attention.rate_per_s, 7.25 * forward / (0.5e-3 + 2.5 * 1.4e-3), 1e3);
  EXPECT_THAT(profile_to_toml(p), HasSubstr("gemm_hbm_fraction = 0.6800"));
  EXPECT_THROW(profile_from_gemm_peak("empty.txt", "device NVIDIA H200, 132 SMs, 143771 MiB\n"), MeasuredError);
}

TEST(Microbenchmarks, GoogleBenchmarkJsonIsACpuProfile) {
  // bench/kernels_cpu_bench.cpp's counters: each GEMM's m, n, k (and its BLAS threads), memory-bound kernels' bytes.
  const nlohmann::ordered_json document = {// in Google Benchmark's order: "context" first
                                           {"context", {{"num_cpus", 2}}},
                                           {"benchmarks",
                                            {{{"name", "BM_Gemm/512/1"},
                                              {"run_type", "iteration"},
                                              {"real_time", 2.0},
                                              {"time_unit", "ms"},
                                              {"m", 512},
                                              {"n", 512},
                                              {"k", 512},
                                              {"blas_threads", 1}},
                                             {{"name", "BM_Gemm/512/2"},
                                              {"run_type", "iteration"},
                                              {"real_time", 1.0},
                                              {"time_unit", "ms"},
                                              {"m", 512},
                                              {"n", 512},
                                              {"k", 512},
                                              {"blas_threads", 2}},
                                             {{"name", "BM_MatmulForward/1536"},
                                              {"run_type", "iteration"},
                                              {"real_time", 4000.0},
                                              {"time_unit", "us"},
                                              {"m", 1024},
                                              {"n", 1536},
                                              {"k", 512}},
                                             {{"name", "BM_GeluForward"},
                                              {"run_type", "iteration"},
                                              {"real_time", 1e6},
                                              {"time_unit", "ns"},
                                              {"bytes_per_second", 4e9}},
                                             {{"name", "BM_GeluForward_mean"},
                                              {"run_type", "aggregate"},
                                              {"real_time", 9e9},
                                              {"time_unit", "ns"},
                                              {"bytes_per_second", 1}}}}};
  const std::string text = document.dump();
  EXPECT_EQ(source_kind(text), SourceKind::GoogleBenchmark);
  const HardwareProfile p = profile_from_google_benchmark("kernels.json", text);
  EXPECT_EQ(p.device, "cpu");
  ASSERT_EQ(p.gemm_shapes.size(), 2u);  // the 2-thread GEMM left out: a rank runs one BLAS thread
  EXPECT_NEAR(p.gemm_shapes[1].flops_per_s, 2.0 * 512 * 512 * 512 / 2e-3, 1);
  EXPECT_NEAR(p.gemm_shapes[0].flops_per_s, 2.0 * 1024 * 1536 * 512 / 4e-3, 1);
  EXPECT_DOUBLE_EQ(p.memory_bytes_per_s_by_kind.at("gelu"), 4e9);  // the aggregate row ignored
  EXPECT_THROW(profile_from_google_benchmark("none.json", R"({"context": {}, "benchmarks": []})"), MeasuredError);
  EXPECT_EQ(source_kind(R"({"traceEvents": []})"), SourceKind::ProfilerTrace);
}

// tests/measured/data/README.md: rank 0 of 128 of a real run on A100s, profiled with record_shapes but by a PyTorch
// that recorded no collective sizes: its GEMMs and memory-bound kernels are fitted, its collectives are not.
TEST(GpuCalibrate, TheHolisticTraceAnalysisSample) {
  const char* dir = std::getenv("TWIN_SOURCE_DIR");
  const KinetoTrace trace =
      read_kineto_trace(std::string(dir ? dir : ".") + "/tests/measured/data/hta_sampled_rank-0.json.gz");
  int communication = 0;
  for (const TracedKernel& k : trace.kernels) communication += k.kind.kind == KernelClass::Communication;
  EXPECT_GT(communication, 0);
  const HardwareProfile p = calibrate({trace});
  EXPECT_GT(p.gemm.samples, 300u);
  EXPECT_GT(p.gemm_shapes.size(), 100u);
  EXPECT_GT(p.gemm.rate_per_s, 1e13);    // a recommendation model's GEMMs: tens of TFLOP/s ...
  EXPECT_LT(p.gemm.rate_per_s, 312e12);  // ... under the A100's bf16 peak
  EXPECT_GT(p.memory.samples, 300u);
  EXPECT_GT(p.memory.rate_per_s, 0.3 * 2039e9);  // a large share of the A100-80GB's 2039 GB/s HBM, never more
  EXPECT_LT(p.memory.rate_per_s, 2039e9);
  EXPECT_TRUE(p.collectives.empty());
}

}  // namespace
}  // namespace twin::measured
