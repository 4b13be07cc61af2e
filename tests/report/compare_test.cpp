#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include "model/ops/op_label.hpp"
#include "report/compare.hpp"
#include "report/compare_traces.hpp"
#include "report/trace.hpp"
#include "tests/sim/support.hpp"

namespace twin::report {
namespace {

using ::testing::HasSubstr;

nlohmann::json summary(double time, double tflops, int dp, double stage0_busy) {
  return {{"scenario", {{"tp", 8}, {"pp", 2}, {"dp", dp}, {"micro_batches", 16}}},
          {"engine", "sim"},
          {"iteration_time_s", time},
          {"tflops_per_gpu", tflops},
          {"bubble_fraction", 0.1},
          {"time_split", {{"compute", 0.7}, {"tp", 0.1}, {"pp", 0.05}, {"dp", 0.05}, {"bubble", 0.1}}},
          {"stages", {{{"stage", 0}, {"busy_s", stage0_busy}}, {{"stage", 1}, {"busy_s", 9.0}}}}};
}

TEST(Compare, ErrorsAreRelativeToTheMeasurement) {
  const Comparison c = compare_summaries(summary(10.0, 100, 4, 8.0), summary(12.0, 83.3, 4, 10.0));
  ASSERT_GE(c.totals.size(), 3u);
  EXPECT_EQ(c.totals[0].name, "iteration time (s)");
  EXPECT_NEAR(c.totals[0].error(), 0.2, 1e-12);
  ASSERT_EQ(c.stages.size(), 2u);
  EXPECT_NEAR(c.stages[0].error(), 0.25, 1e-12);
  // The time split is in seconds: compute 0.7 * 10 measured against 0.7 * 12 predicted.
  EXPECT_DOUBLE_EQ(c.totals[3].reference, 7.0);
  EXPECT_DOUBLE_EQ(c.totals[3].candidate, 8.4);
  EXPECT_THAT(comparison_table(c), HasSubstr("+20.0%"));
  const nlohmann::json json = comparison_to_json(c);
  EXPECT_EQ(json["mode"], "summary");
  EXPECT_EQ(json["totals"][0]["name"], "iteration time (s)");
  EXPECT_DOUBLE_EQ(json["totals"][0]["predicted"].get<double>(), 12.0);
  EXPECT_DOUBLE_EQ(json["totals"][0]["measured"].get<double>(), 10.0);
  EXPECT_NEAR(json["totals"][0]["error"].get<double>(), 0.2, 1e-12);
  EXPECT_EQ(json["stages"].size(), 2u);
  Comparison zero;
  zero.totals.push_back({"idle (s)", 0.0, 1.0});
  EXPECT_TRUE(comparison_to_json(zero)["totals"][0]["error"].is_null());  // no error relative to nothing
}

TEST(Compare, ComputeByKindComparesTheKindsBothTimedInALayersOrder) {
  nlohmann::json measured = summary(10.0, 100, 4, 8.0), predicted = summary(12.0, 83.3, 4, 10.0);
  measured["compute_by_kind_s"] = {{"mlp_up", 2.0}, {"qkv_projection", 1.0}, {"gelu", 0.5}};
  predicted["compute_by_kind_s"] = {{"mlp_up", 2.5}, {"qkv_projection", 0.9}, {"transformer_layer", 4.0}};
  const Comparison c = compare_summaries(measured, predicted);
  ASSERT_EQ(c.kinds.size(), 2u);  // gelu measured only, transformer_layer predicted only
  EXPECT_EQ(c.kinds[0].name, "qkv_projection (s)");
  EXPECT_NEAR(c.kinds[0].error(), -0.1, 1e-12);
  EXPECT_EQ(c.kinds[1].name, "mlp_up (s)");
  EXPECT_NEAR(c.kinds[1].error(), 0.25, 1e-12);
  EXPECT_THAT(comparison_table(c), HasSubstr("compute by kernel"));
  // Without the key on either side there is nothing to compare.
  EXPECT_TRUE(compare_summaries(summary(10.0, 100, 4, 8.0), predicted).kinds.empty());
  nlohmann::json broken = measured;
  broken["compute_by_kind_s"]["mlp_up"] = -1;
  try {
    find_summary(broken, "bad.json");
    FAIL() << "expected CompareError";
  } catch (const CompareError& error) {
    EXPECT_THAT(error.what(), HasSubstr("\"compute_by_kind_s.mlp_up\" must be a number of seconds >= 0, got -1"));
  }
}

TEST(Compare, RefusesDifferentPlans) {
  try {
    compare_summaries(summary(10.0, 100, 4, 8.0), summary(10.0, 100, 8, 8.0));
    FAIL() << "expected CompareError";
  } catch (const CompareError& error) {
    EXPECT_THAT(error.what(), HasSubstr("dp is 4 in the measurement and 8 in the prediction"));
  }
}

TEST(Compare, RefusesAnotherModelOrHardwareUnlessAllowed) {
  // An A100 prediction of gpt-350m against a CPU run of gpt-tiny: every difference named.
  nlohmann::json predicted = summary(10.0, 100, 4, 8.0), measured = summary(0.5, 1, 4, 0.4);
  predicted["scenario"]["name"] = "gpt-350m";
  predicted["scenario"]["layers"] = 24;
  predicted["scenario"]["hardware"] = "dgx-a100";
  measured["scenario"]["name"] = "gpt-tiny";
  measured["scenario"]["layers"] = 4;
  measured["scenario"]["hardware"] = "cpu-host";
  try {
    compare_summaries(measured, predicted);
    FAIL() << "expected CompareError";
  } catch (const CompareError& error) {
    EXPECT_THAT(error.what(), HasSubstr("model is gpt-tiny in the measurement and gpt-350m in the prediction"));
    EXPECT_THAT(error.what(), HasSubstr("layers is 4 in the measurement and 24 in the prediction"));
    EXPECT_THAT(error.what(), HasSubstr("hardware is cpu-host in the measurement and dgx-a100 in the prediction"));
  }
  const Comparison c = compare_summaries(measured, predicted, true);
  EXPECT_EQ(c.mismatches.size(), 3u);
  EXPECT_THAT(comparison_table(c), HasSubstr("WARNING: not the same run: model is gpt-tiny"));
  EXPECT_EQ(comparison_to_json(c)["mismatches"].size(), 3u);
  // One hardware, spelt two ways (the scenario's node, the GPU a simulation ran on), is the same.
  EXPECT_EQ(hardware_family("dgx-a100"), hardware_family("A100-SXM4-80GB"));
  EXPECT_NE(hardware_family("dgx-a100-40gb"), hardware_family("NVIDIA A100-SXM4-80GB"));
  EXPECT_EQ(hardware_family("cpu-host"), hardware_family("cpu"));
}

TEST(Compare, FindsTheSummaryOfARunDocument) {
  const nlohmann::json run = {{"losses", {5.5, 5.0}}, {"summary", summary(1.0, 1.0, 1, 1.0)}};
  EXPECT_EQ(&find_summary(run, "run.json"), &run["summary"]);
  EXPECT_THROW(find_summary(nlohmann::json{{"losses", 1}}, "x.json"), CompareError);
}

TEST(Compare, ASummaryWithAFieldOfTheWrongKindIsRefusedByName) {
  auto refused = [](nlohmann::json document) {
    try {
      find_summary(document, "bad.json");
    } catch (const CompareError& error) {
      return std::string(error.what());
    }
    return std::string("accepted");
  };
  nlohmann::json negative_time = summary(10.0, 100, 4, 8.0);
  negative_time["iteration_time_s"] = -1;
  EXPECT_THAT(refused(negative_time), HasSubstr("bad.json: \"iteration_time_s\" must be a positive number"));
  nlohmann::json zero_time = summary(10.0, 100, 4, 8.0);
  zero_time["iteration_time_s"] = 0;
  EXPECT_THAT(refused(zero_time), HasSubstr("\"iteration_time_s\""));
  nlohmann::json text_split = summary(10.0, 100, 4, 8.0);
  text_split["time_split"]["compute"] = "x";
  EXPECT_THAT(refused(text_split), HasSubstr("\"time_split.compute\" must be a fraction in [0, 1], got \"x\""));
  nlohmann::json negative_tflops = summary(10.0, -5, 4, 8.0);
  EXPECT_THAT(refused(negative_tflops), HasSubstr("\"tflops_per_gpu\""));
  nlohmann::json text_stages = summary(10.0, 100, 4, 8.0);
  text_stages["stages"] = "x";
  EXPECT_THAT(refused(text_stages), HasSubstr("\"stages\" must be an array"));
  nlohmann::json text_scenario = summary(10.0, 100, 4, 8.0);
  text_scenario["scenario"] = 5;
  EXPECT_THAT(refused(text_scenario), HasSubstr("\"scenario\" must be an object"));
  nlohmann::json text_dp = summary(10.0, 100, 4, 8.0);
  text_dp["scenario"]["dp"] = "four";
  EXPECT_THAT(refused(text_dp), HasSubstr("\"scenario.dp\" must be an integer"));
  EXPECT_EQ(refused(summary(10.0, 100, 4, 8.0)), "accepted");
}

// --- Op by op: two traces of one Program ---

TEST(CompareTraces, AnOpsClassIsItsLabelWithoutLayerMicroBatchOrPeer) {
  model::Op gemm;
  gemm.what = model::ComputeKind::MlpUp;
  gemm.phase = model::Phase::Backward;
  gemm.layer = 12;
  gemm.micro_batch = 3;
  // The labels both engines write (model::op_label), and their classes as README.md documents them.
  using model::op_label;
  EXPECT_EQ(op_label(gemm), "backward mlp_up layer 12 micro-batch 3");
  EXPECT_EQ(op_class(op_label(gemm)), "backward mlp_up");
  model::Op reduce = testing::collective(model::CollectiveKind::AllReduce, model::Group::Tensor, 1e6);
  reduce.payload = model::Payload::LayerOutput;
  reduce.layer = 4;
  reduce.what = model::ComputeKind::MlpDown;
  EXPECT_EQ(op_label(reduce), "all_reduce tensor layer_output (forward mlp_down) layer 4");
  EXPECT_EQ(op_class(op_label(reduce)), "all_reduce tensor layer_output");
  model::Op send;
  send.kind = model::OpKind::Send;
  send.phase = model::Phase::Forward;
  send.micro_batch = 10;
  send.peer_stage = 2;
  send.chunk = 1;
  EXPECT_EQ(op_label(send), "send forward micro-batch 10 chunk 1 to stage 2");
  EXPECT_EQ(op_class(op_label(send)), "send forward");
  model::Op recv = send;
  recv.kind = model::OpKind::Recv;
  EXPECT_EQ(op_class(op_label(recv)), "recv forward");
  // A kind whose name merely starts like a layer or micro-batch tag is kept.
  EXPECT_EQ(op_class("forward mbx Layer L"), "forward mbx Layer L");
}

// One stage, ranks 0 and 1 recorded: two forward GEMMs of layers 0 and 1, a TP all-reduce that waits 1 s for its last
// member, and a Recv. The prediction takes 3 s for each GEMM where the measurement took 2.
struct TwoTraces {
  model::Program program;
  nlohmann::json measured, predicted;
  static Timeline timeline(const std::string& engine, double gemm_s) {
    Timeline t;
    t.engine = engine;
    for (int rank : {0, 1}) {
      const double gemms_end = 2 * gemm_s;
      t.ranks.push_back({rank,
                         0,
                         {{0, 0, 0, gemm_s},
                          {1, gemm_s, gemm_s, gemms_end},
                          {2, gemms_end, gemms_end + 1, gemms_end + 1.5},
                          {3, gemms_end + 1.5, gemms_end + 2, gemms_end + 2.25}}});
    }
    t.iteration_time_s = 2 * gemm_s + 2.25;
    return t;
  }
  TwoTraces() {
    testing::Plan plan;
    plan.dp = 8;  // one DGX node: ranks 0-7 run the one stage
    std::vector<model::Op> ops(4);
    for (int layer : {0, 1}) {
      ops[layer].what = model::ComputeKind::MlpUp;
      ops[layer].layer = layer;
      ops[layer].micro_batch = 0;
    }
    ops[2] = testing::collective(model::CollectiveKind::AllReduce, model::Group::Tensor, 1e6);
    ops[3].kind = model::OpKind::Recv;
    ops[3].stream = model::Stream::Pipeline;
    ops[3].micro_batch = 1;
    program = testing::hand_program(testing::make_scenario(plan), {ops});
    measured = nlohmann::json::parse(chrome_trace(program, timeline("exec", 2.0)));
    predicted = nlohmann::json::parse(chrome_trace(program, timeline("sim", 3.0)));
  }
};

TEST(CompareTraces, EachOpIsTimedFromWhenItsWorkBeganAndGroupedByClass) {
  const TwoTraces f;
  EXPECT_TRUE(is_trace(f.measured));
  EXPECT_FALSE(is_trace(summary(10.0, 100, 4, 8.0)));
  const TraceComparison c = compare_traces(f.measured, "m.json", f.predicted, "p.json", 1);
  EXPECT_EQ(c.reference_engine, "exec");
  EXPECT_EQ(c.candidate_engine, "sim");
  EXPECT_EQ(c.ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ(c.ops, 8u);
  ASSERT_EQ(c.classes.size(), 3u);
  EXPECT_EQ(c.total.name, "all ops");
  EXPECT_DOUBLE_EQ(c.total.ops, 4);
  EXPECT_NEAR(c.total.reference_s, 4.0 + 0.5 + 0.25, 1e-9);  // per rank
  EXPECT_NEAR(c.total.candidate_s, 6.0 + 0.5 + 0.25, 1e-9);
  // Largest measured time first: the two GEMMs of a rank as one class.
  EXPECT_EQ(c.classes[0].name, "forward mlp_up");
  EXPECT_DOUBLE_EQ(c.classes[0].ops, 2);
  EXPECT_NEAR(c.classes[0].reference_s, 4.0, 1e-9);
  EXPECT_NEAR(c.classes[0].candidate_s, 6.0, 1e-9);
  EXPECT_NEAR(c.classes[0].error(), 0.5, 1e-9);
  // The all-reduce's wait for its last member is not its time: 0.5 s in both.
  EXPECT_EQ(c.classes[1].name, "all_reduce tensor layer_output");
  EXPECT_NEAR(c.classes[1].reference_s, 0.5, 1e-9);
  EXPECT_NEAR(c.classes[1].error(), 0.0, 1e-9);
  EXPECT_EQ(c.classes[2].name, "recv forward");
  EXPECT_NEAR(c.classes[2].reference_s, 0.25, 1e-9);
  ASSERT_EQ(c.largest.size(), 1u);  // top = 1
  EXPECT_NEAR(c.largest[0].candidate_s - c.largest[0].reference_s, 1.0, 1e-9);
  EXPECT_EQ(c.largest[0].label, "forward mlp_up layer 0 micro-batch 0");
  const std::string table = trace_comparison_table(c);
  EXPECT_THAT(table, HasSubstr("8 ops on 2 ranks (0-1)"));
  EXPECT_THAT(table, HasSubstr("+50.0%"));
  EXPECT_THAT(table, HasSubstr("the 1 op that differ most"));
  const nlohmann::json json = trace_comparison_to_json(c);
  EXPECT_EQ(json["mode"], "ops");
  EXPECT_EQ(json["ops"], 8);
  EXPECT_EQ(json["ranks"], (std::vector<int>{0, 1}));
  EXPECT_EQ(json["total"]["name"], "all ops");
  EXPECT_EQ(json["classes"][0]["name"], "forward mlp_up");
  EXPECT_NEAR(json["classes"][0]["error"].get<double>(), 0.5, 1e-9);
  EXPECT_NEAR(json["classes"][0]["measured_s"].get<double>(), 4.0, 1e-9);
  EXPECT_EQ(json["largest"][0]["label"], "forward mlp_up layer 0 micro-batch 0");
  EXPECT_EQ(json["largest"][0]["rank"], 0);
  // Only the ranks both recorded are compared.
  const nlohmann::json rank0 = nlohmann::json::parse(chrome_trace(f.program, TwoTraces::timeline("sim", 3.0), {0}));
  EXPECT_EQ(compare_traces(f.measured, "m.json", rank0, "p.json", 10).ranks, (std::vector<int>{0}));
}

TEST(CompareTraces, RefusesTracesOfDifferentProgramsOrWithoutACommonRank) {
  const TwoTraces f;
  auto refused = [&f](const nlohmann::json& predicted) {
    try {
      compare_traces(f.measured, "m.json", predicted, "p.json", 10);
    } catch (const CompareError& error) {
      return std::string(error.what());
    }
    return std::string("accepted");
  };
  nlohmann::json relabelled = f.predicted;
  for (auto& event : relabelled["traceEvents"]) {
    if (event.value("name", "") == "forward mlp_up layer 1 micro-batch 0") {
      event["name"] = "forward gelu layer 1 micro-batch 0";
    }
  }
  EXPECT_THAT(refused(relabelled),
              HasSubstr("rank 0 op 1 is 'forward mlp_up layer 1 micro-batch 0' in m.json and 'forward gelu layer 1 "
                        "micro-batch 0' in p.json: the traces are of different Programs"));
  nlohmann::json fewer = f.predicted;
  auto& events = fewer["traceEvents"];
  events.erase(std::remove_if(
                   events.begin(), events.end(),
                   [](const nlohmann::json& e) { return e.value("ph", "") == "X" && e["args"].value("op", -1) == 3; }),
               events.end());
  EXPECT_THAT(refused(fewer), HasSubstr("rank 0 has 4 ops in m.json and 3 in p.json"));
  const nlohmann::json other_rank = nlohmann::json::parse(chrome_trace(f.program, [] {
    Timeline t = TwoTraces::timeline("sim", 3.0);
    for (RankTimeline& rank : t.ranks) rank.rank += 2;
    return t;
  }()));
  EXPECT_THAT(refused(other_rank), HasSubstr("no rank is in both traces: m.json records ranks 0-1, p.json ranks 2-3"));
  EXPECT_EQ(refused(f.predicted), "accepted");
}

TEST(CompareTraces, AMalformedOpEventIsRefusedByItsField) {
  const TwoTraces f;
  auto refused = [&f](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json broken = f.predicted;
    for (auto& event : broken["traceEvents"]) {
      if (event.value("ph", "") == "X") {
        edit(event);
        break;
      }
    }
    try {
      compare_traces(f.measured, "m.json", broken, "p.json", 10);
    } catch (const CompareError& error) {
      return std::string(error.what());
    }
    return std::string("accepted");
  };
  EXPECT_THAT(refused([](nlohmann::json& e) { e["dur"] = -5; }),
              ::testing::MatchesRegex("p\\.json: traceEvents\\[[0-9]+\\]\\.dur must be a number of microseconds >= 0, "
                                      "got -5"));
  EXPECT_THAT(refused([](nlohmann::json& e) { e["args"]["op"] = "first"; }), HasSubstr("args.op must be an op index"));
  EXPECT_THAT(refused([](nlohmann::json& e) { e["pid"] = -1; }), HasSubstr("pid must be a rank"));
  EXPECT_THAT(refused([](nlohmann::json& e) { e["args"]["wait_us"] = "x"; }), HasSubstr("args.wait_us must be"));
  EXPECT_THAT(refused([](nlohmann::json& e) { e.erase("name"); }), HasSubstr("name must be the op's label"));
  EXPECT_THAT(refused([](nlohmann::json& e) { e["args"]["op"] = 1; }), HasSubstr("rank 0 op 1 appears twice"));
  try {
    compare_traces(summary(10.0, 100, 4, 8.0), "s.json", f.predicted, "p.json", 10);
    FAIL() << "expected CompareError";
  } catch (const CompareError& error) {
    EXPECT_THAT(error.what(), HasSubstr("s.json: not a trace"));
  }
}

}  // namespace
}  // namespace twin::report
