// The measured timeline in the simulator's formats: summary keys and a Chrome trace with one process per rank.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "exec/train/run_report.hpp"
#include "exec_test_util.hpp"

namespace twin::exec {
namespace {

TEST(ExecRunReport, JsonAndTraceOfAPipelinedRun) {
  const auto s = testing::scenario(testing::small_toml(), {"parallel.tp=2", "parallel.pp=2"});
  TrainOptions options;
  options.steps = 2;
  options.trace_step = -1;
  const model::Program program = model::build_program(s, model::Granularity::Op);
  options.threads_per_rank = 1;
  const TrainResult result = train_threads(program, testing::corpus(), options);
  ASSERT_TRUE(result.timeline.has_value());
  EXPECT_EQ(result.traced_step, 1);
  EXPECT_EQ(result.timeline->ranks.size(), 4u);
  for (const auto& rank : result.timeline->ranks) {
    ASSERT_EQ(rank.spans.size(), program.ops_per_rank(rank.stage));
    for (const auto& span : rank.spans) {
      EXPECT_GE(span.start_s, 0.0);
      EXPECT_GE(span.end_s, span.start_s);
      EXPECT_LE(span.end_s, result.timeline->iteration_time_s);
    }
  }
  const nlohmann::json json = run_json(program, result, "exec (cpu, threads)");
  EXPECT_EQ(json["losses"].size(), 2u);
  EXPECT_EQ(json["iteration_time_s"].size(), 2u);
  EXPECT_GT(json["tokens_per_s"].get<double>(), 0.0);
  for (const char* key : {"iteration_time_s", "bubble_fraction", "tflops_per_gpu", "time_split", "stages"}) {
    EXPECT_TRUE(json["summary"].contains(key)) << key;
  }
  EXPECT_EQ(json["summary"]["stages"].size(), 2u);
  // Measured op by op: every kernel kind the layers run, and they add up to the compute time.
  for (const auto& stage : json["summary"]["stages"]) {
    const nlohmann::json& kinds = stage["compute_by_kind_s"];
    double total = 0;
    for (const char* kind : {"layernorm_attention", "qkv_projection", "attention_core", "attention_projection",
                             "mlp_up", "gelu", "mlp_down", "optimizer_step"}) {
      EXPECT_GT(kinds.value(kind, 0.0), 0.0) << "stage " << stage["stage"] << " " << kind;
    }
    for (const auto& [kind, seconds] : kinds.items()) total += seconds.get<double>();
    EXPECT_NEAR(total, stage["time_split"]["compute_s"].get<double>(), 1e-9) << stage["stage"];
    EXPECT_FALSE(kinds.contains("transformer_layer"));
  }
  EXPECT_EQ(compute_by_kernel_note(program, result).rfind("step 2: compute by kernel: GEMMs ", 0), 0u)
      << compute_by_kernel_note(program, result);

  const nlohmann::json trace = nlohmann::json::parse(run_trace(program, result));
  std::set<int> pids;
  for (const auto& event : trace["traceEvents"]) {
    if (event["ph"] == "X") pids.insert(event["pid"].get<int>());
  }
  EXPECT_EQ(pids, (std::set<int>{0, 1, 2, 3}));
}

// ZeRO-3's gathers and reduce-scatters sit on the data-parallel stream: the executor runs them in list order, so each
// is exposed, counted as data-parallel time, and shown on the rank's data-parallel track.
TEST(ExecRunReport, ZeroThreeCollectivesAreDataParallelTime) {
  const auto s = testing::scenario(testing::small_toml(),
                                   {"framework.name=\"composer\"", "parallel.dp=2", "parallel.zero_stage=3"});
  TrainOptions options;
  options.steps = 2;
  options.trace_step = -1;
  options.threads_per_rank = 1;
  const model::Program program = model::build_program(s, model::Granularity::Op);
  const TrainResult result = train_threads(program, testing::corpus(), options);
  ASSERT_TRUE(result.timeline.has_value());
  ASSERT_EQ(result.timeline->ranks.size(), 2u);
  std::size_t data_parallel_ops = 0;
  for (const model::Op& op : program.stage_ops[0]) data_parallel_ops += op.stream == model::Stream::DataParallel;
  EXPECT_GT(data_parallel_ops, 0u);
  for (const auto& rank : result.timeline->ranks) {
    ASSERT_EQ(rank.spans.size(), program.ops_per_rank(rank.stage));
    for (const auto& span : rank.spans) EXPECT_LE(span.end_s, result.timeline->iteration_time_s);
  }
  const nlohmann::json json = run_json(program, result, "exec (cpu, threads)");
  const nlohmann::json& summary = json["summary"];
  EXPECT_GT(summary["time_split"]["dp"].get<double>(), 0.0) << summary.dump();
  EXPECT_GT(summary["time_split"]["compute"].get<double>(), 0.0) << summary.dump();
  ASSERT_EQ(summary["stages"].size(), 1u);
  EXPECT_GT(summary["stages"][0]["time_split"]["dp_s"].get<double>(), 0.0);

  const nlohmann::json trace = nlohmann::json::parse(run_trace(program, result));
  std::size_t data_parallel_events = 0;
  for (const auto& event : trace["traceEvents"]) {
    data_parallel_events += event["ph"] == "X" && event["tid"] == static_cast<int>(model::Stream::DataParallel);
  }
  EXPECT_EQ(data_parallel_events, 2 * data_parallel_ops);  // on both ranks
}

}  // namespace
}  // namespace twin::exec
