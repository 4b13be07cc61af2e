// Readers of real runs: kernel names classified, PyTorch profiler traces (a real one from HolisticTraceAnalysis and
// made-up ones whose answers are known), training logs, and their comparison with a prediction.
#include <zlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "measured/calibrate.hpp"
#include "measured/compare_measured.hpp"
#include "measured/kernel_class.hpp"
#include "measured/kineto.hpp"
#include "measured/measured_run.hpp"

namespace twin::measured {
namespace {

using nlohmann::json;
using testing::HasSubstr;

std::string source_dir() {
  const char* dir = std::getenv("TWIN_SOURCE_DIR");
  return dir ? dir : ".";
}

std::string temporary(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("twin-measured-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

void write(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

void write_gzipped(const std::string& path, const std::string& text) {
  gzFile file = gzopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr);
  ASSERT_EQ(gzwrite(file, text.data(), static_cast<unsigned>(text.size())), static_cast<int>(text.size()));
  gzclose(file);
}

TEST(KernelClass, NamesOfRealKernels) {
  // Names as CUPTI records them in public traces (HolisticTraceAnalysis tests/data, Megatron-LM and FlashAttention
  // runs).
  const std::vector<std::pair<std::string, KernelClass>> cases = {
      {"ampere_sgemm_32x32_sliced1x4_tn", KernelClass::Gemm},
      {"sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__"
       "5x_cublas",
       KernelClass::Gemm},
      {"nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NTN", KernelClass::Gemm},
      {"void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4>(cutlass_80_tensorop_s1688gemm_"
       "256x64_16x4_nn_align4::Params)",
       KernelClass::Gemm},
      {"sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4",
       KernelClass::Convolution},
      {"void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>, false, "
       "true, false, false, true, true, false>(Flash_fwd_params)",
       KernelClass::Attention},
      {"void flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, "
       "false, cutlass::bfloat16_t>, true, false, false, false, false>(Flash_bwd_params)",
       KernelClass::Attention},
      {"void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(int, float, "
       "c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)",
       KernelClass::Norm},
      {"void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 128, true, 1>(float, float, float, float)",
       KernelClass::Norm},
      {"void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
       "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}, "
       "at::detail::Array<char*, 2> >(int, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
       "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}, "
       "at::detail::Array<char*, 2>)",
       KernelClass::Elementwise},
      {"void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>, float, float, float, float, float, "
       "float, adamMode_t, float>(long, int volatile*, TensorListMetadata<4>, AdamFunctor<float>, float, float, float, "
       "float, float, float, adamMode_t, float)",
       KernelClass::Optimizer},
      {"void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
       "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)",
       KernelClass::Loss},
      {"void (anonymous namespace)::softmax_warp_forward<c10::BFloat16, c10::BFloat16, float, 11, false, true>("
       "c10::BFloat16*, c10::BFloat16 const*, int, int, int, bool const*, int, bool)",
       KernelClass::Attention},
      {"void at::native::(anonymous namespace)::indexSelectLargeIndex<float, long, unsigned int, 2, 2, -2, true>("
       "at::cuda::detail::TensorInfo<float, unsigned int>)",
       KernelClass::Embedding},
      {"Memcpy DtoD (Device -> Device)", KernelClass::Copy},
      {"void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
       "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, "
       "unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
       "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, "
       "unsigned int, float, 4>)",
       KernelClass::Reduction},
      {"some_kernel_no_rule_knows", KernelClass::Unclassified},
  };
  for (const auto& [name, expected] : cases) {
    EXPECT_EQ(classify_kernel(name).kind, expected) << name;
  }
  const Classified nccl = classify_kernel(
      "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, "
      "ncclWork*)");
  EXPECT_EQ(nccl.kind, KernelClass::Communication);
  EXPECT_EQ(nccl.comm, CommKind::ReduceScatter);
  EXPECT_EQ(classify_kernel("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)").comm, CommKind::AllReduce);
  EXPECT_EQ(classify_kernel("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)").comm, CommKind::SendRecv);
  EXPECT_EQ(classify_kernel("ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)").comm,
            CommKind::AllGather);
}

TEST(KernelClass, CpuOperators) {
  EXPECT_EQ(classify_cpu_op("aten::addmm"), KernelClass::Gemm);
  EXPECT_EQ(classify_cpu_op("aten::bmm"), KernelClass::Gemm);
  EXPECT_EQ(classify_cpu_op("aten::native_layer_norm_backward"), KernelClass::Norm);
  EXPECT_EQ(classify_cpu_op("Optimizer.step#AdamW.step"), KernelClass::Optimizer);
  EXPECT_EQ(classify_cpu_op("aten::_log_softmax"), KernelClass::Loss);
  EXPECT_EQ(classify_cpu_op("aten::_softmax"), KernelClass::Attention);
  EXPECT_EQ(classify_cpu_op("aten::gelu"), KernelClass::Elementwise);
  EXPECT_EQ(classify_cpu_op("aten::embedding"), KernelClass::Embedding);
  EXPECT_EQ(classify_cpu_op("aten::linear"), std::nullopt);  // a wrapper: its addmm child has the time
  // Every GEMM kind of the Program is timed as a GEMM, the attention core as attention.
  EXPECT_EQ(class_of(model::ComputeKind::MlpDown), KernelClass::Gemm);
  EXPECT_EQ(class_of(model::ComputeKind::AttentionCore), KernelClass::Attention);
  EXPECT_EQ(class_of(model::ComputeKind::TransformerLayer), std::nullopt);
}

// A made-up trace of two iterations (5 ms each) with known answers: per iteration, a GEMM of 1 ms on stream 7
// launched by aten::mm [64, 32] x [32, 16], a layer norm of 0.5 ms, and an all-reduce of 2 ms on stream 20 of which
// the first 1 ms runs under the GEMM.
json made_up_trace() {
  json events = json::array();
  for (int step = 0; step < 2; ++step) {
    const double t0 = 1000 + step * 5000;  // microseconds
    events.push_back({{"ph", "X"},
                      {"cat", "user_annotation"},
                      {"name", "ProfilerStep#" + std::to_string(7 + step)},
                      {"pid", 1},
                      {"tid", 1},
                      {"ts", t0},
                      {"dur", 5000}});
    const int gemm_id = 100 + step * 10, norm_id = gemm_id + 1, comm_id = gemm_id + 2;
    events.push_back({{"ph", "X"},
                      {"cat", "cpu_op"},
                      {"name", "aten::mm"},
                      {"pid", 1},
                      {"tid", 1},
                      {"ts", t0 + 10},
                      {"dur", 30},
                      {"args", {{"Input Dims", {{64, 32}, {32, 16}}}}}});
    events.push_back({{"ph", "X"},
                      {"cat", "cuda_runtime"},
                      {"name", "cudaLaunchKernel"},
                      {"pid", 1},
                      {"tid", 1},
                      {"ts", t0 + 20},
                      {"dur", 5},
                      {"args", {{"correlation", gemm_id}}}});
    events.push_back({{"ph", "X"},
                      {"cat", "cuda_runtime"},
                      {"name", "cudaLaunchKernel"},
                      {"pid", 1},
                      {"tid", 1},
                      {"ts", t0 + 50},
                      {"dur", 5},
                      {"args", {{"correlation", norm_id}}}});
    events.push_back({{"ph", "X"},
                      {"cat", "cuda_runtime"},
                      {"name", "cudaLaunchKernel"},
                      {"pid", 1},
                      {"tid", 1},
                      {"ts", t0 + 60},
                      {"dur", 5},
                      {"args", {{"correlation", comm_id}}}});
    events.push_back({{"ph", "X"},
                      {"cat", "kernel"},
                      {"name", "ampere_sgemm_128x64_nn"},
                      {"pid", 0},
                      {"tid", 7},
                      {"ts", t0 + 100},
                      {"dur", 1000},
                      {"args", {{"stream", 7}, {"correlation", gemm_id}}}});
    events.push_back({{"ph", "X"},
                      {"cat", "kernel"},
                      {"name", "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>()"},
                      {"pid", 0},
                      {"tid", 7},
                      {"ts", t0 + 1100},
                      {"dur", 500},
                      {"args", {{"stream", 7}, {"correlation", norm_id}}}});
    events.push_back({{"ph", "X"},
                      {"cat", "kernel"},
                      {"name", "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)"},
                      {"pid", 0},
                      {"tid", 20},
                      {"ts", t0 + 100},
                      {"dur", 2000},
                      {"args", {{"stream", 20}, {"correlation", comm_id}}}});
  }
  // A kernel before the first step: recorded, not counted.
  events.push_back({{"ph", "X"},
                    {"cat", "kernel"},
                    {"name", "ampere_sgemm_128x64_nn"},
                    {"pid", 0},
                    {"tid", 7},
                    {"ts", 10},
                    {"dur", 100},
                    {"args", {{"stream", 7}, {"correlation", 1}}}});
  return {{"schemaVersion", 1},
          {"deviceProperties", {{{"id", 0}, {"name", "NVIDIA A100-SXM4-80GB"}, {"totalGlobalMem", 85899345920.0}}}},
          {"distributedInfo", {{"backend", "nccl"}, {"rank", 3}, {"world_size", 8}}},
          {"traceEvents", events}};
}

TEST(Kineto, MadeUpTraceMeasuresWhatItHolds) {
  const std::string path = temporary("made_up.json");
  write(path, made_up_trace().dump());
  const KinetoTrace trace = read_kineto_trace(path);
  EXPECT_TRUE(trace.gpu);
  EXPECT_EQ(trace.rank, 3);
  EXPECT_EQ(trace.world_size, 8);
  EXPECT_EQ(trace.device, "NVIDIA A100-SXM4-80GB");
  ASSERT_EQ(trace.steps.size(), 2u);
  EXPECT_EQ(trace.steps[1].number, 8);
  int gemms_with_shape = 0;
  for (const TracedKernel& k : trace.kernels) {
    if (k.kind.kind == KernelClass::Gemm && k.iteration >= 0) {
      EXPECT_EQ(k.shape.m, 64);
      EXPECT_EQ(k.shape.n, 16);
      EXPECT_EQ(k.shape.k, 32);
      ++gemms_with_shape;
    }
  }
  EXPECT_EQ(gemms_with_shape, 2);

  const RankMeasurement r = measure_rank(trace);
  EXPECT_EQ(r.iterations, 2);
  EXPECT_NEAR(r.iteration_time_s, 5e-3, 1e-12);
  EXPECT_NEAR(r.class_s[static_cast<int>(KernelClass::Gemm)], 1e-3, 1e-12);
  EXPECT_NEAR(r.class_s[static_cast<int>(KernelClass::Norm)], 0.5e-3, 1e-12);
  EXPECT_NEAR(r.communication_total_s, 2e-3, 1e-12);
  EXPECT_NEAR(r.communication_s.at("all_reduce"), 2e-3, 1e-12);
  // 2 ms of all-reduce, of which the GEMM (1 ms) and the norm (0.5 ms) hide 1.5 ms.
  EXPECT_NEAR(r.exposed_communication_s, 0.5e-3, 1e-12);
  EXPECT_EQ(r.streams, 2);
  EXPECT_EQ(r.kernels_outside_iterations, 1u);
}

TEST(Kineto, GzippedTraceReadsTheSame) {
  const std::string path = temporary("made_up.json.gz");
  write_gzipped(path, made_up_trace().dump());
  const RankMeasurement r = measure_rank(read_kineto_trace(path));
  EXPECT_NEAR(r.exposed_communication_s, 0.5e-3, 1e-12);
}

TEST(Kineto, RealTraceFromHolisticTraceAnalysis) {
  // tests/measured/data/README.md: rank 0 of 128, two profiled steps, NCCL send/receive and all-reduce.
  const KinetoTrace trace = read_kineto_trace(source_dir() + "/tests/measured/data/hta_sampled_rank-0.json.gz");
  EXPECT_TRUE(trace.gpu);
  EXPECT_EQ(trace.rank, 0);
  EXPECT_EQ(trace.world_size, 128);
  ASSERT_EQ(trace.steps.size(), 2u);
  EXPECT_EQ(trace.steps[0].number, 551);
  EXPECT_NEAR(trace.steps[0].duration_s, 0.607312, 1e-9);
  const MeasuredRun run = measure_traces({trace.path});
  EXPECT_NEAR(run.iteration_time_s, (0.607312 + 0.622928) / 2, 1e-9);
  EXPECT_GE(classified_share(run), 0.95);
  const RankMeasurement& r = run.ranks[0];
  EXPECT_GT(r.communication_s.at("send_recv"), 0);
  EXPECT_GT(r.class_s[static_cast<int>(KernelClass::Gemm)], 0);
  EXPECT_GT(r.class_s[static_cast<int>(KernelClass::Embedding)], 0);  // a recommendation model's tables
  EXPECT_LE(r.exposed_communication_s, r.communication_total_s);
  EXPECT_GT(r.streams, 1);
}

void expect_error(const std::string& path, const std::string& message) {
  try {
    read_measured(path);
    FAIL() << "expected MeasuredError for " << path;
  } catch (const MeasuredError& error) {
    EXPECT_THAT(error.what(), HasSubstr(message));
  }
}

TEST(Kineto, MalformedFilesGetOneClearError) {
  const std::string not_json = temporary("broken.json");
  write(not_json, "{\"traceEvents\": [ {\"ph\": \"X\", ");
  expect_error(not_json, "is not valid JSON");

  const std::string truncated = temporary("truncated.json.gz");
  write_gzipped(truncated, made_up_trace().dump());
  std::filesystem::resize_file(truncated, std::filesystem::file_size(truncated) / 2);
  expect_error(truncated, "cannot decompress");

  json bad = made_up_trace();
  bad["traceEvents"][5]["dur"] = "long";
  const std::string bad_event = temporary("bad_event.json");
  write(bad_event, bad.dump());
  expect_error(bad_event, "traceEvents[5] (kernel 'ampere_sgemm_128x64_nn'): \"dur\" must be a number");

  // A kernel whose name is an object, a step number past 64 bits, a number past a double: not the JSON library's
  // or std::stoll's exceptions, but the reader's refusal (fuzz_kineto found each; tests/fuzz/corpus/fuzz_kineto/).
  json object_name = made_up_trace();
  object_name["traceEvents"][5]["name"] = json::object();
  write(bad_event, object_name.dump());
  expect_error(bad_event, "is not a PyTorch profiler trace");
  json long_step = made_up_trace();
  long_step["traceEvents"].push_back({{"ph", "X"}, {"cat", "user_annotation"}, {"name", "ProfilerStep#" +
                                      std::string(30, '9')}, {"ts", 0}, {"dur", 1}, {"pid", 1}, {"tid", 1}});
  write(bad_event, long_step.dump());
  expect_error(bad_event, "a number out of range");
  write(bad_event, "{\"traceEvents\": [{\"ph\": \"X\", \"ts\": 1e999999}]}");
  expect_error(bad_event, "is not valid JSON");

  json negative = made_up_trace();
  negative["traceEvents"][5]["dur"] = -3;
  write(bad_event, negative.dump());
  expect_error(bad_event, "\"dur\" must be >= 0");

  json no_steps = made_up_trace();
  json kept = json::array();
  for (const json& e : no_steps["traceEvents"]) {
    if (e["name"].get<std::string>().rfind("ProfilerStep", 0) != 0) kept.push_back(e);
  }
  no_steps["traceEvents"] = kept;
  const std::string stepless = temporary("stepless.json");
  write(stepless, no_steps.dump());
  expect_error(stepless, "--iterations N");
  // Given the count, the kernel span is divided by it.
  const MeasuredRun given = read_measured(stepless, 2);
  EXPECT_EQ(given.ranks[0].iterations, 2);

  const std::string log = temporary("nothing.log");
  write(log, "hello\nworld\n");
  expect_error(log, "neither a PyTorch profiler trace nor a training log");

  const std::string empty_dir = temporary("empty_dir");
  std::filesystem::create_directories(empty_dir);
  expect_error(empty_dir, "holds no trace");
}

TEST(Kineto, RanksOfOneRunFromADirectory) {
  const std::string dir = temporary("ranks");
  std::filesystem::create_directories(dir);
  for (int rank = 0; rank < 2; ++rank) {
    json trace = made_up_trace();
    trace["distributedInfo"]["rank"] = rank;
    if (rank == 1) {
      for (json& e : trace["traceEvents"]) {
        if (e["name"].get<std::string>().rfind("ProfilerStep", 0) == 0) e["dur"] = 7000;  // a slower rank
      }
    }
    write(dir + "/rank" + std::to_string(rank) + ".json", trace.dump());
  }
  const MeasuredRun run = read_measured(dir);
  ASSERT_EQ(run.ranks.size(), 2u);
  EXPECT_NEAR(run.ranks[1].iteration_time_s, 7e-3, 1e-12);
  EXPECT_NEAR(run.iteration_time_s, 6e-3, 1e-12);
  // Two files of one rank are refused.
  json duplicate = made_up_trace();
  duplicate["distributedInfo"]["rank"] = 0;
  write(dir + "/rank9.json", duplicate.dump());
  expect_error(dir, "are both rank 0");
}

// A CPU run: operators' self times, the optimizer step's children the optimizer's.
TEST(Kineto, CpuRunOperatorsBySelfTime) {
  json events = json::array();
  events.push_back({{"ph", "X"},
                    {"cat", "user_annotation"},
                    {"name", "ProfilerStep#1"},
                    {"pid", 1},
                    {"tid", 1},
                    {"ts", 0},
                    {"dur", 1000}});
  events.push_back(
      {{"ph", "X"}, {"cat", "cpu_op"}, {"name", "aten::linear"}, {"pid", 1}, {"tid", 1}, {"ts", 10}, {"dur", 400}});
  events.push_back({{"ph", "X"},
                    {"cat", "cpu_op"},
                    {"name", "aten::addmm"},
                    {"pid", 1},
                    {"tid", 1},
                    {"ts", 20},
                    {"dur", 380},
                    {"args", {{"Input Dims", {{16}, {8, 32}, {32, 16}}}}}});
  events.push_back({{"ph", "X"},
                    {"cat", "user_annotation"},
                    {"name", "Optimizer.step#AdamW.step"},
                    {"pid", 1},
                    {"tid", 1},
                    {"ts", 500},
                    {"dur", 300}});
  events.push_back(
      {{"ph", "X"}, {"cat", "cpu_op"}, {"name", "aten::add_"}, {"pid", 1}, {"tid", 1}, {"ts", 510}, {"dur", 100}});
  const std::string path = temporary("cpu.json");
  write(path, json{{"traceEvents", events}}.dump());
  const KinetoTrace trace = read_kineto_trace(path);
  EXPECT_FALSE(trace.gpu);
  EXPECT_EQ(trace.device, "cpu");
  const RankMeasurement r = measure_rank(trace);
  EXPECT_NEAR(r.class_s[static_cast<int>(KernelClass::Gemm)], 380e-6, 1e-12);
  EXPECT_NEAR(r.class_s[static_cast<int>(KernelClass::Optimizer)], 300e-6, 1e-12);    // step's own 200 + add_'s 100
  EXPECT_NEAR(r.class_s[static_cast<int>(KernelClass::Unclassified)], 20e-6, 1e-12);  // aten::linear's own
  EXPECT_NEAR(r.outside_operators_s, 1000e-6 - 700e-6, 1e-12);
}

TEST(TrainingLog, MegatronLog) {
  // As megatron/training/training.py prints it (a run of GPT-3 1.3B-like shape, 8 GPUs).
  const std::string path = temporary("megatron.log");
  write(path,
        "using world size: 8, data-parallel size: 2, context-parallel size: 1, hierarchical context-parallel sizes: "
        "None, tensor-model-parallel size: 2, encoder-tensor-model-parallel size: 0, pipeline-model-parallel size: 2, "
        "encoder-pipeline-model-parallel size: 0\n"
        "------------------------ arguments ------------------------\n"
        "  global_batch_size ............................... 64\n"
        "  hidden_size ..................................... 2048\n"
        "  micro_batch_size ................................ 2\n"
        "  num_attention_heads ............................. 16\n"
        "  num_layers ...................................... 24\n"
        "  seq_length ...................................... 2048\n"
        "-------------------- end of arguments ---------------------\n"
        " [2024-05-06 13:34:31] iteration       10/     100 | consumed samples:          640 | elapsed time per "
        "iteration (ms): 9000.0 | throughput per GPU (TFLOP/s/GPU): 20.0 | learning rate: 1.5E-05 | global batch "
        "size:    64 | lm loss: 9.1E+00 | loss scale: 1.0 | grad norm: 3.2 |\n"
        " [2024-05-06 13:34:41] iteration       20/     100 | consumed samples:         1280 | elapsed time per "
        "iteration (ms): 1000.0 | throughput per GPU (TFLOP/s/GPU): 110.0 | learning rate: 3.0E-05 | global batch "
        "size:    64 | lm loss: 8.1E+00 |\n"
        " [2024-05-06 13:34:51] iteration       30/     100 | consumed samples:         1920 | elapsed time per "
        "iteration (ms): 1100.0 | throughput per GPU (TFLOP/s/GPU): 100.0 | learning rate: 4.5E-05 | global batch "
        "size:    64 | lm loss: 7.6E+00 |\n");
  ASSERT_TRUE(is_measured_input(path));
  const MeasuredRun run = read_measured(path);
  EXPECT_EQ(run.source, "megatron-lm log");
  EXPECT_EQ(run.logged_iterations, 3);
  EXPECT_NEAR(run.iteration_time_s, 1.05, 1e-12);  // the first interval (start-up) left out
  EXPECT_NEAR(run.tflops_per_gpu, 105.0, 1e-12);
  EXPECT_EQ(run.plan.at("tp"), 2);
  EXPECT_EQ(run.plan.at("pp"), 2);
  EXPECT_EQ(run.plan.at("dp"), 2);
  EXPECT_EQ(run.plan.at("layers"), 24);
  EXPECT_EQ(run.plan.at("global_batch"), 64);
  EXPECT_EQ(run.world_size, 8);
}

// The warm-up skip at other lengths than three: the first interval is left out of 3 or more (so of 4 and 5 the mean of
// the last 3 and 4), kept in 2 or 1. Distinct powers of two make every wrong subset give a different mean.
TEST(TrainingLog, LeavesOutTheFirstIntervalOfFourOrFive) {
  const std::vector<double> ms = {9000, 1000, 2000, 4000, 8000};
  struct Case {
    std::size_t iterations;
    double mean_s;
  };
  for (const Case c : {Case{5, (1000 + 2000 + 4000 + 8000) / 4e3}, Case{4, (1000 + 2000 + 4000) / 3e3},
                       Case{2, (9000 + 1000) / 2e3}, Case{1, 9.0}}) {
    std::string megatron, titan;
    for (std::size_t i = 0; i < c.iterations; ++i) {
      megatron += fmt::format(
          " iteration {:>9}/     100 | consumed samples: {:>12} | elapsed time per iteration (ms): {:.1f} | "
          "throughput per GPU (TFLOP/s/GPU): {:.1f} | global batch size:    64 | lm loss: 9.1E+00 |\n",
          10 * (i + 1), 640 * (i + 1), ms[i], ms[i] / 10);
      titan += fmt::format("[titan] - root - INFO - step: {}  loss:  9.2345  memory: 57.41GiB(72.84%)  tps: {:.0f}  "
                           "tflops: {:.2f}  mfu: 1.00%\n",
                           10 * (i + 1), ms[i], ms[i] / 10);
    }
    const std::string megatron_path = temporary(fmt::format("megatron-{}.log", c.iterations));
    write(megatron_path, megatron);
    const MeasuredRun m = read_measured(megatron_path);
    EXPECT_EQ(m.logged_iterations, static_cast<int>(c.iterations));
    EXPECT_NEAR(m.iteration_time_s, c.mean_s, 1e-12) << c.iterations << " Megatron iterations";
    EXPECT_NEAR(m.tflops_per_gpu, c.mean_s * 100, 1e-9) << c.iterations << " Megatron iterations";
    const std::string titan_path = temporary(fmt::format("titan-{}.log", c.iterations));
    write(titan_path, titan);
    EXPECT_NEAR(read_measured(titan_path).tokens_per_s_per_gpu, c.mean_s * 1000, 1e-9)
        << c.iterations << " torchtitan steps";
  }
}

TEST(TrainingLog, NemoAndTorchtitanLogs) {
  const std::string nemo = temporary("nemo.log");
  write(nemo,
        "  tensor_model_parallel_size: 1\n  num_layers: 12\n"
        "Epoch 0: :   1%|          | 10/1000 [00:30<49:30, reduced_train_loss=10.80, global_step=9.000, "
        "consumed_samples=5120.0, train_step_timing in s=2.960]\rEpoch 0: :   2%|          | 20/1000 "
        "[00:33<49:30, reduced_train_loss=9.80, global_step=19.000, train_step_timing in s=0.500]\n"
        "Epoch 0: :   3%|          | 30/1000 [00:36<49:30, train_step_timing in s=0.520]\n");
  const MeasuredRun n = read_measured(nemo);
  EXPECT_EQ(n.source, "nemo log");
  EXPECT_NEAR(n.iteration_time_s, 0.51, 1e-12);
  EXPECT_EQ(n.plan.at("layers"), 12);

  const std::string titan = temporary("titan.log");
  write(titan,
        "[titan] 2025-01-10 10:00:00,000 - root - INFO - Training starts at step 1, with local batch size 8, global "
        "batch size 64, sequence length 8192, gradient accumulation steps 1\n"
        "[titan] 2025-01-10 10:00:10,000 - root - INFO - \x1b[31mstep:  1  \x1b[32mloss: 12.2259  \x1b[33mmemory: "
        "41.2GiB(52.00%)  \x1b[34mtps: 1,254  \x1b[36mtflops: 72.63  \x1b[35mmfu: 7.34%\x1b[39m\n"
        "[titan] 2025-01-10 10:00:20,000 - root - INFO - step: 10  loss:  9.2345  memory: 57.41GiB(72.84%)  tps: "
        "7,000  tflops: 320.00  mfu: 32.00%\n"
        "[titan] 2025-01-10 10:00:30,000 - root - INFO - step: 20  loss:  8.2345  memory: 57.41GiB(72.84%)  tps: "
        "7,100  tflops: 330.00  mfu: 34.00%\n");
  const MeasuredRun t = read_measured(titan);
  EXPECT_EQ(t.source, "torchtitan log");
  EXPECT_NEAR(t.tokens_per_s_per_gpu, 7050, 1e-9);
  EXPECT_NEAR(t.tflops_per_gpu, 325, 1e-9);
  EXPECT_NEAR(t.mfu, 0.33, 1e-12);
  EXPECT_EQ(t.plan.at("seq_len"), 8192);
  EXPECT_EQ(t.plan.at("global_batch"), 64);
}

// Logs as they come: launcher noise before the first iteration line, lines that begin with '[' or '{', ANSI colours.
// The JSON test was "the first non-blank character is '[' or '{'", which took each of these for JSON.
TEST(TrainingLog, RecognisedByContentWhateverPrecedesIt) {
  const std::string iterations =
      " [2024-05-06 13:34:31] iteration       10/     100 | elapsed time per iteration (ms): 9000.0 |\n"
      " [2024-05-06 13:34:41] iteration       20/     100 | elapsed time per iteration (ms): 1000.0 |\n"
      "[Rank 0] (after 20 iterations) memory (MB) | allocated: 30000.0 | max allocated: 61440.0 | reserved: 70000.0 "
      "| max reserved: 70000.0\n"
      " [2024-05-06 13:34:51] iteration       30/     100 | elapsed time per iteration (ms): 1100.0 |\n"
      " [2024-05-06 13:35:01] iteration       40/     100 | elapsed time per iteration (ms): 1200.0 |\n";
  const std::vector<std::string> preambles = {
      "[W socket.cpp:464] [c10d] The server socket has failed to bind to [::]:29500\n",
      "[2024-05-06 13:30:00,000] torch.distributed.run: [WARNING] \n*****************************************\n",
      "{'rank': 0, 'world_size': 8}\n",
      "\x1b[33m[NeMo W 2024-05-06 13:30:00 nemo_logging:349]\x1b[0m some warning\n",
  };
  for (std::size_t i = 0; i < preambles.size(); ++i) {
    const std::string path = temporary("noisy-" + std::to_string(i) + ".log");
    write(path, preambles[i] + iterations);
    ASSERT_TRUE(is_measured_input(path)) << preambles[i];
    const MeasuredRun run = read_measured(path);
    EXPECT_EQ(run.source, "megatron-lm log");
    EXPECT_EQ(run.logged_iterations, 4);
    EXPECT_EQ(run.used_iterations, 3);  // the first interval (start-up) left out
    EXPECT_NEAR(run.iteration_time_s, 1.1, 1e-12);
    EXPECT_NEAR(run.max_allocated_bytes, 61440.0 * 1024 * 1024, 1);
  }
  // twin's own JSON stays JSON.
  const std::string summary = temporary("summary.json");
  write(summary, "[{\"iteration_time_s\": 1.0}]");
  EXPECT_FALSE(is_measured_input(summary));
  // With two lines none is left out: one interval of two would be half the data.
  const std::string two = temporary("two.log");
  write(two, " iteration 10/ 100 | elapsed time per iteration (ms): 900.0 |\n"
             " iteration 20/ 100 | elapsed time per iteration (ms): 1100.0 |\n");
  const MeasuredRun short_run = read_measured(two);
  EXPECT_EQ(short_run.used_iterations, 2);
  EXPECT_NEAR(short_run.iteration_time_s, 1.0, 1e-12);
}

TEST(CompareMeasured, LogMemoryAndIterationsUsedAreReported) {
  const std::string path = temporary("memory.log");
  write(path, " iteration 10/ 100 | elapsed time per iteration (ms): 5000.0 |\n"
              " iteration 20/ 100 | elapsed time per iteration (ms): 1000.0 |\n"
              " iteration 30/ 100 | elapsed time per iteration (ms): 1000.0 |\n"
              "[Rank 0] (after 30 iterations) memory (MB) | allocated: 1.0 | max allocated: 40960.0 | reserved: 2.0\n");
  json predicted = {{"engine", "sim"}, {"iteration_time_s", 1.0}, {"tflops_per_gpu", 100.0},
                    {"memory_per_gpu_bytes", 50.0 * 1024 * 1024 * 1024}};
  const MeasuredComparison c = compare_with_measured(predicted, read_measured(path), true, 5);
  bool memory_row = false;
  for (const auto& total : c.values.totals) {
    if (total.name == "peak memory per GPU (GiB)") {
      memory_row = true;
      EXPECT_NEAR(total.reference, 40.0, 1e-9);
      EXPECT_NEAR(total.candidate, 50.0, 1e-9);
    }
  }
  EXPECT_TRUE(memory_row);
  bool iterations_note = false;
  for (const std::string& note : c.notes) iterations_note |= note.find("last 2 of the log's 3") != std::string::npos;
  EXPECT_TRUE(iterations_note);
}

// A prediction's summary as `twin sim --json` writes it (the fields compare reads).
json prediction(const std::string& hardware, int gpus, int tp) {
  return {{"scenario",
           {{"name", "gpt"},
            {"gpus", gpus},
            {"tp", tp},
            {"pp", 2},
            {"dp", gpus / (2 * tp)},
            {"micro_batches", 16},
            {"layers", 24},
            {"hidden", 2048},
            {"heads", 16},
            {"seq_len", 2048},
            {"global_batch", 64},
            {"micro_batch", 2},
            {"hardware", hardware}}},
          {"engine", "sim"},
          {"iteration_time_s", 1.0},
          {"tflops_per_gpu", 100.0},
          {"mfu", 0.3},
          {"bubble_fraction", 0.1},
          {"time_split", {{"compute", 0.8}, {"tp", 0.05}, {"pp", 0.03}, {"dp", 0.02}, {"host", 0}, {"bubble", 0.1}}},
          {"compute_by_kind_s", {{"qkv_projection", 2e-4}, {"mlp_up", 4e-4}, {"layer_norm_attention", 1e-4}}},
          {"stages", json::array()}};
}

TEST(CompareMeasured, TraceAgainstPrediction) {
  const std::string path = temporary("made_up_compare.json");
  write(path, made_up_trace().dump());
  const MeasuredRun run = read_measured(path);
  const MeasuredComparison c = compare_with_measured(prediction("dgx-a100", 8, 2), run);
  ASSERT_FALSE(c.values.totals.empty());
  EXPECT_EQ(c.values.totals[0].name, "iteration time (s)");
  EXPECT_NEAR(c.values.totals[0].reference, 5e-3, 1e-12);
  EXPECT_NEAR(c.values.totals[0].candidate, 1.0, 1e-12);
  bool gemm = false, exposed = false;
  for (const auto& v : c.values.kinds) {
    if (v.name == "gemm (s)") {
      gemm = true;
      EXPECT_NEAR(v.candidate, 6e-4, 1e-12);  // qkv + mlp_up
      EXPECT_NEAR(v.reference, 1e-3, 1e-12);
    }
  }
  for (const auto& v : c.values.totals) {
    if (v.name == "exposed communication (s)") {
      exposed = true;
      EXPECT_NEAR(v.candidate, 0.10, 1e-12);  // (tp + pp + dp) of 1 s
      EXPECT_NEAR(v.reference, 0.5e-3, 1e-12);
    }
  }
  EXPECT_TRUE(gemm);
  EXPECT_TRUE(exposed);
  EXPECT_EQ(c.values.stages.size(), 1u);  // rank 3
  EXPECT_THAT(measured_comparison_table(c), HasSubstr("kernel time classified: 100.0 %"));
  EXPECT_EQ(measured_comparison_to_json(c)["mode"], "measured");
}

TEST(CompareMeasured, RefusesAnotherRunNamingWhatDiffers) {
  const std::string path = temporary("made_up_guard.json");
  write(path, made_up_trace().dump());
  const MeasuredRun run = read_measured(path);
  try {
    compare_with_measured(prediction("cpu-host", 16, 2), run);
    FAIL() << "expected CompareError";
  } catch (const report::CompareError& error) {
    EXPECT_THAT(error.what(), HasSubstr("hardware is NVIDIA A100-SXM4-80GB in the measurement and cpu-host"));
    EXPECT_THAT(error.what(), HasSubstr("world size is 8 in the measurement and 16 in the prediction"));
  }
  // The A100 40GB is another GPU than the 80GB one.
  EXPECT_THROW(compare_with_measured(prediction("dgx-a100-40gb", 8, 2), run), report::CompareError);
  // With --allow-mismatch: compared, the differences first.
  const MeasuredComparison c = compare_with_measured(prediction("cpu-host", 16, 2), run, true);
  ASSERT_EQ(c.values.mismatches.size(), 2u);
  EXPECT_THAT(measured_comparison_table(c), HasSubstr("WARNING: not the same run: hardware"));

  // A log's plan against the prediction's.
  const std::string log = temporary("megatron_guard.log");
  write(log,
        "  tensor_model_parallel_size ...... 4\n  num_layers ...... 24\n"
        " iteration       10/     100 | elapsed time per iteration (ms): 1000.0 |\n");
  try {
    compare_with_measured(prediction("dgx-a100", 8, 2), read_measured(log));
    FAIL() << "expected CompareError";
  } catch (const report::CompareError& error) {
    EXPECT_THAT(error.what(), HasSubstr("tp is 4 in the measurement and 2 in the prediction"));
  }
  const MeasuredComparison same = compare_with_measured(prediction("dgx-a100", 8, 4), read_measured(log));
  EXPECT_NEAR(same.values.totals[0].reference, 1.0, 1e-12);
}

TEST(CompareMeasured, TorchtitanThroughputBecomesAnIterationTime) {
  const std::string titan = temporary("titan_compare.log");
  write(titan, "step: 10  loss:  9.2  memory: 1GiB(1%)  tps: 1,024  tflops: 50.0  mfu: 16.00%\n");
  const MeasuredComparison c = compare_with_measured(prediction("dgx-a100", 8, 2), read_measured(titan));
  // 64 sequences of 2048 tokens on 8 GPUs at 1024 tokens/s per GPU: 16 s.
  EXPECT_EQ(c.values.totals[0].name, "iteration time (s)");
  EXPECT_NEAR(c.values.totals[0].reference, 16.0, 1e-9);
  EXPECT_FALSE(c.notes.empty());
}

}  // namespace
}  // namespace twin::measured

namespace twin::measured {
namespace {

// A CPU trace whose GEMMs take exactly 20 us + FLOPs / 2 GFLOP/s and whose layer norms 5 us + bytes / 4 GB/s.
json timed_cpu_trace(int batch) {
  json events = json::array();
  double t = 0;
  auto op = [&events, &t](const std::string& name, const json& dims, double seconds) {
    events.push_back({{"ph", "X"},
                      {"cat", "cpu_op"},
                      {"name", name},
                      {"pid", 1},
                      {"tid", 1},
                      {"ts", t * 1e6},
                      {"dur", seconds * 1e6},
                      {"args", {{"Input Dims", dims}}}});
    t += seconds + 1e-6;
  };
  events.push_back({{"ph", "X"},
                    {"cat", "user_annotation"},
                    {"name", "ProfilerStep#1"},
                    {"pid", 1},
                    {"tid", 1},
                    {"ts", 0},
                    {"dur", 1e6}});
  const std::int64_t m = 64 * batch;
  for (const std::int64_t n : {256, 768, 1024}) {
    op("aten::mm", {{m, 256}, {256, n}}, 20e-6 + 2.0 * m * n * 256 / 2e9);
  }
  for (const std::int64_t width : {256, 512}) {
    const double bytes = 4.0 * (m * width + width + width + m * width);  // inputs read, the largest written
    op("aten::native_layer_norm", {{m, width}, {width}, {width}}, 5e-6 + bytes / 4e9);
  }
  return {{"traceEvents", events}};
}

TEST(Calibrate, RecoversTheRatesAndPredictsAnotherPlan) {
  const std::string a = temporary("calibrate_a.json"), b = temporary("calibrate_b.json");
  write(a, timed_cpu_trace(2).dump());
  write(b, timed_cpu_trace(5).dump());
  const HardwareProfile profile = calibrate({read_kineto_trace(a)});
  EXPECT_EQ(profile.device, "cpu");
  EXPECT_NEAR(profile.gemm.rate_per_s, 2e9, 2e9 * 1e-6);
  EXPECT_NEAR(profile.gemm.overhead_s, 20e-6, 1e-9);
  EXPECT_LT(profile.gemm.residual_rms, 1e-6);
  EXPECT_EQ(profile.gemm_shapes.size(), 3u);
  EXPECT_NEAR(profile.memory.rate_per_s, 4e9, 4e9 * 1e-6);
  EXPECT_NEAR(profile.memory.overhead_s, 5e-6, 1e-9);
  // Another batch: shapes the profile never saw, each at its nearest measured shape's rate (same n and k, m = 128
  // instead of 320: the 20 us of a call spread over 2.5 times the FLOPs), the memory-bound ones by the fit.
  const OutOfSample check = check_profile(profile, read_kineto_trace(b));
  double expected = 0, measured = 0;
  for (const double n : {256.0, 768.0, 1024.0}) {
    const double rate_128 = 2.0 * 128 * n * 256 / (20e-6 + 2.0 * 128 * n * 256 / 2e9);
    expected += 2.0 * 320 * n * 256 / rate_128;
    measured += 20e-6 + 2.0 * 320 * n * 256 / 2e9;
  }
  EXPECT_NEAR(check.gemm_predicted_s, expected, 1e-12);
  EXPECT_NEAR(check.gemm_measured_s, measured, 1e-12);
  EXPECT_NEAR(check.memory_predicted_s, check.memory_measured_s, 1e-9);
  const std::string toml = profile_to_toml(profile);
  EXPECT_THAT(toml, HasSubstr("[gemm]\nflops_per_s = 2.000000e+09"));
  EXPECT_THAT(toml, HasSubstr("[[gemm.shape]]"));
  // Without shapes there is nothing to fit.
  json shapeless = timed_cpu_trace(2);
  for (json& e : shapeless["traceEvents"]) e.erase("args");
  write(a, shapeless.dump());
  EXPECT_THROW(calibrate({read_kineto_trace(a)}), MeasuredError);
}

}  // namespace
}  // namespace twin::measured

namespace twin::measured {
namespace {

// twin's own trace (`twin run --trace`) of one iteration: read as a CPU run, its ops' FLOPs and bytes from their args.
TEST(Kineto, TwinsOwnTraceIsACpuRunOfOneIteration) {
  json events = json::array();
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 0}, {"args", {{"name", "rank 0"}}}});
  events.push_back({{"name", "forward qkv_projection layer 0 micro-batch 0"},
                    {"cat", "compute"},
                    {"ph", "X"},
                    {"pid", 0},
                    {"tid", 0},
                    {"ts", 0},
                    {"dur", 1000},
                    {"args", {{"op", 0}, {"bytes", 4e6}, {"flops", 2e7}}}});
  events.push_back({{"name", "forward layernorm_mlp layer 0 micro-batch 0"},
                    {"cat", "compute"},
                    {"ph", "X"},
                    {"pid", 0},
                    {"tid", 0},
                    {"ts", 1100},
                    {"dur", 400},
                    {"args", {{"op", 1}, {"bytes", 8e5}, {"flops", 0}}}});
  events.push_back({{"name", "all_reduce data gradients"},
                    {"cat", "collective"},
                    {"ph", "X"},
                    {"pid", 0},
                    {"tid", 1},
                    {"ts", 1500},
                    {"dur", 500},
                    {"args", {{"op", 2}, {"bytes", 1e6}, {"flops", 0}}}});
  events.push_back({{"name", "forward qkv_projection layer 0 micro-batch 0"},
                    {"cat", "compute"},
                    {"ph", "X"},
                    {"pid", 1},
                    {"tid", 0},
                    {"ts", 0},
                    {"dur", 9000},
                    {"args", {{"op", 0}, {"bytes", 4e6}, {"flops", 2e7}}}});
  const std::string path = temporary("twin_trace.json");
  write(path, json{{"displayTimeUnit", "ms"}, {"otherData", {{"engine", "exec"}}}, {"traceEvents", events}}.dump());
  const KinetoTrace trace = read_kineto_trace(path);
  EXPECT_FALSE(trace.gpu);
  EXPECT_EQ(trace.device, "cpu");
  EXPECT_EQ(trace.rank, 0);
  ASSERT_EQ(trace.steps.size(), 1u);
  EXPECT_NEAR(trace.steps[0].duration_s, 2000e-6, 1e-12);  // first op's start to the collective's end, rank 0 only
  ASSERT_EQ(trace.kernels.size(), 2u);                     // the compute ops of rank 0
  EXPECT_EQ(trace.kernels[0].name, "forward qkv_projection");
  EXPECT_EQ(trace.kernels[0].kind.kind, KernelClass::Gemm);
  EXPECT_EQ(trace.kernels[0].flops, 2e7);
  EXPECT_EQ(trace.kernels[1].kind.kind, KernelClass::Norm);
  EXPECT_EQ(trace.kernels[1].bytes, 8e5);
  const HardwareProfile profile = calibrate({trace});
  EXPECT_NEAR(profile.gemm.rate_per_s, 2e7 / 1000e-6, 1);  // one GEMM: the line through the origin
}

}  // namespace
}  // namespace twin::measured

namespace twin::measured {
namespace {

// Two profiled steps, the second 3x slower in every op (other work on the machine): a profile fitted on the fastest
// step alone has the fast step's rates; one fitted on both has the median of the two.
TEST(Calibrate, OnTheFastestStepAloneFitsTheRatesOfThatStep) {
  json fast = timed_cpu_trace(2);
  json events = json::array();
  double end_us = 0;
  for (const json& e : fast["traceEvents"]) end_us = std::max(end_us, e["ts"].get<double>() + e["dur"].get<double>());
  for (const json& e : fast["traceEvents"]) {
    events.push_back(e);
    json slow = e;
    slow["ts"] = 2e6 + 3 * e["ts"].get<double>();
    slow["dur"] = 3 * e["dur"].get<double>();
    if (e["name"] == "ProfilerStep#1") slow["name"] = "ProfilerStep#2";
    events.push_back(slow);
  }
  const std::string path = temporary("calibrate_two_steps.json");
  write(path, json{{"traceEvents", events}}.dump());
  KinetoTrace trace = read_kineto_trace(path);
  ASSERT_EQ(trace.steps.size(), 2u);
  const double both_rate = calibrate({trace}).gemm_shapes.front().flops_per_s;
  keep_fastest_step(trace);
  ASSERT_EQ(trace.steps.size(), 1u);
  EXPECT_EQ(trace.steps.front().number, 1);
  const HardwareProfile profile = calibrate({trace});
  const MatmulShape shape = profile.gemm_shapes.front().shape;
  EXPECT_NEAR(profile.gemm_shapes.front().flops_per_s, shape.flops() / (20e-6 + shape.flops() / 2e9), 1e-3);
  // The median of a fast and a 3x slower call: half the fast rate.
  EXPECT_NEAR(both_rate, profile.gemm_shapes.front().flops_per_s / 2, 1e-3);
}

}  // namespace
}  // namespace twin::measured
