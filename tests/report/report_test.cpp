// The engine-neutral writers: time split, JSON summary, Chrome trace, SVG, rank lists. No simulation needed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "report/summary.hpp"
#include "report/svg.hpp"
#include "report/trace.hpp"
#include "tests/sim/support.hpp"

namespace twin::report {
namespace {

// One stage, one rank: compute [0,2], TP all-reduce issued at 2, active from 3 (waiting for peers), done at 4; a
// Recv whose bytes arrive over [5,6]; compute [6,7]; DP-stream reduction [7,9].
struct Fixture {
  model::Program program;
  Timeline timeline;
  Fixture() {
    testing::Plan plan;
    plan.tp = 8;
    std::vector<model::Op> ops(5);
    ops[0].what = model::ComputeKind::TransformerLayer;
    ops[0].micro_batch = 0;
    ops[1] = testing::collective(model::CollectiveKind::AllReduce, model::Group::Tensor, 1e6);
    ops[1].micro_batch = 0;
    ops[2].kind = model::OpKind::Recv;
    ops[2].stream = model::Stream::Pipeline;
    ops[2].micro_batch = 1;
    ops[3].what = model::ComputeKind::TransformerLayer;
    ops[3].micro_batch = 1;
    ops[4] = testing::collective(model::CollectiveKind::AllReduce, model::Group::Data, 1e6);
    ops[4].stream = model::Stream::DataParallel;
    program = testing::hand_program(testing::make_scenario(plan), {ops});
    timeline.engine = "test";
    timeline.iteration_time_s = 10;
    timeline.ranks.push_back({0, 0, {{0, 0, 0, 2}, {1, 2, 3, 4}, {2, 0, 5, 6}, {3, 6, 6, 7}, {4, 7, 7, 9}}});
  }
};

TEST(TimeSplit, PartitionsTheIteration) {
  const Fixture f;
  const TimeSplit split = time_split(f.program, f.timeline.ranks[0], 10);
  EXPECT_DOUBLE_EQ(split.compute_s, 3);  // [0,2] + [6,7]
  EXPECT_DOUBLE_EQ(split.tp_s, 1);       // [3,4]: the wait [2,3] is bubble
  EXPECT_DOUBLE_EQ(split.pp_s, 1);       // [5,6]
  EXPECT_DOUBLE_EQ(split.dp_s, 2);       // [7,9], compute stream idle
  EXPECT_DOUBLE_EQ(split.bubble_s, 3);   // [2,3] + [4,5] + [9,10]
}

// Context-parallel exchanges and the experts' token all-to-alls are their own shares, not DP's: compute [0,1], a CP
// all-gather [1,2], an EP all-to-all [2,4], the tokens-per-expert all-gather over tp-ep [4,5], an expert-TP
// all-gather [5,6], the gradients' reduce-scatter over dp x cp [6,8], the experts' over expert-data [8,9].
TEST(TimeSplit, ContextAndExpertExchangesAreTheirOwnShares) {
  testing::Plan plan;
  plan.tp = 8;
  std::vector<model::Op> ops(7);
  ops[0].what = model::ComputeKind::TransformerLayer;
  ops[1] = testing::collective(model::CollectiveKind::AllGather, model::Group::Context, 1e6);
  ops[2] = testing::collective(model::CollectiveKind::AllToAll, model::Group::Expert, 1e6);
  ops[3] = testing::collective(model::CollectiveKind::AllGather, model::Group::ExpertTensorAndExpert, 1e3);
  ops[4] = testing::collective(model::CollectiveKind::AllGather, model::Group::ExpertTensor, 1e6);
  ops[5] = testing::collective(model::CollectiveKind::ReduceScatter, model::Group::DataWithContext, 1e6);
  ops[6] = testing::collective(model::CollectiveKind::ReduceScatter, model::Group::ExpertData, 1e6);
  const model::Program program = testing::hand_program(testing::make_scenario(plan), {ops});
  const RankTimeline rank{
      0, 0, {{0, 0, 0, 1}, {1, 1, 1, 2}, {2, 2, 2, 4}, {3, 4, 4, 5}, {4, 5, 5, 6}, {5, 6, 6, 8}, {6, 8, 8, 9}}};
  const TimeSplit split = time_split(program, rank, 10);
  EXPECT_DOUBLE_EQ(split.compute_s, 1);
  EXPECT_DOUBLE_EQ(split.cp_s, 1);
  EXPECT_DOUBLE_EQ(split.ep_s, 3);  // the dispatch and the counts' gather
  EXPECT_DOUBLE_EQ(split.tp_s, 1);  // expert TP counts as TP
  EXPECT_DOUBLE_EQ(split.dp_s, 3);  // both gradient reductions
  EXPECT_DOUBLE_EQ(split.bubble_s, 1);

  Timeline timeline;
  timeline.engine = "test";
  timeline.iteration_time_s = 10;
  timeline.ranks.push_back(rank);
  const Summary summary = summarize(program, timeline, 312e12, "test");
  const nlohmann::json json = summary_to_json(summary);
  EXPECT_DOUBLE_EQ(json["time_split"]["cp"].get<double>(), 0.1);
  EXPECT_DOUBLE_EQ(json["time_split"]["ep"].get<double>(), 0.3);
  EXPECT_DOUBLE_EQ(json["stages"][0]["time_split"]["ep_s"].get<double>(), 3);
  EXPECT_THAT(summary_table(summary), ::testing::HasSubstr("exposed TP 10.0 %, CP 10.0 %, EP 30.0 %, PP 0.0 %"));
}

TEST(TimeSplit, ADensePlanPrintsNoContextOrExpertShare) {
  const Fixture f;
  const Summary summary = summarize(f.program, f.timeline, 312e12, "test");
  const std::string table = summary_table(summary);
  EXPECT_THAT(table, ::testing::HasSubstr("exposed TP 10.0 %, PP 10.0 %, DP 20.0 %"));
  EXPECT_THAT(table, ::testing::Not(::testing::HasSubstr("CP %")));
}

TEST(Summary, JsonHasTheDocumentedKeys) {
  const Fixture f;
  const Summary summary = summarize(f.program, f.timeline, 312e12, "test");
  ASSERT_EQ(summary.stages.size(), 1u);
  EXPECT_DOUBLE_EQ(summary.stages[0].busy_s, 4);  // compute 3 + TP 1 (its wait excluded)
  EXPECT_DOUBLE_EQ(summary.bubble_fraction, 0.6);
  const nlohmann::json json = summary_to_json(summary);
  for (const char* key : {"iteration_time_s", "bubble_fraction", "tflops_per_gpu", "mfu", "memory_per_gpu_bytes",
                          "stages", "time_split", "memory"}) {
    EXPECT_TRUE(json.contains(key)) << key;
  }
  EXPECT_DOUBLE_EQ(json["iteration_time_s"].get<double>(), 10);
  EXPECT_EQ(json["stages"].size(), 1u);
  EXPECT_FALSE(summary_table(summary).empty());
}

TEST(Summary, TheTableFoldsARunOfIdenticalStagesIntoOneLine) {
  const Fixture f;
  Summary summary = summarize(f.program, f.timeline, 312e12, "test");
  const StageSummary like = summary.stages[0];
  summary.stages.clear();
  for (int stage = 0; stage < 6; ++stage) {
    StageSummary row = like;
    row.stage = stage;
    row.rank = 8 * stage;
    if (stage == 0 || stage == 5) row.busy_s += 1;  // the end stages differ from the middle ones
    summary.stages.push_back(row);
  }
  const std::string table = summary_table(summary);
  EXPECT_THAT(table, ::testing::HasSubstr("(stages 2 to 4 like stage 1)"));
  EXPECT_THAT(table, ::testing::HasSubstr("\n      5     40 "));  // a stage that differs is printed
  EXPECT_THAT(table, ::testing::Not(::testing::HasSubstr("\n      3     24 ")));
  summary.stages.resize(3);  // stages 1 and 2 alike: a single repeat prints as itself
  EXPECT_THAT(summary_table(summary), ::testing::Not(::testing::HasSubstr("like stage")));
}

TEST(Summary, ComputeByKindSplitsFusedLayersByTheirPartsCosts) {
  const Fixture f;
  // Unsplit, the two fused layer ops' 3 s stay one kind.
  const Summary unsplit = summarize(f.program, f.timeline, 312e12, "test");
  const auto layer = static_cast<std::size_t>(model::ComputeKind::TransformerLayer);
  EXPECT_DOUBLE_EQ(unsplit.stages[0].compute_by_kind[layer], 3);
  EXPECT_DOUBLE_EQ(unsplit.compute_by_kind[layer], 3);
  EXPECT_THAT(summary_table(unsplit), ::testing::HasSubstr("layers not split 30.0 %"));
  // Split 1 : 3 between a GEMM and the attention core, whatever the parts' absolute costs.
  const LayerParts parts = [](const model::Op&) {
    return std::vector<std::pair<model::ComputeKind, double>>{{model::ComputeKind::MlpUp, 0.5},
                                                              {model::ComputeKind::AttentionCore, 1.5}};
  };
  const Summary split = summarize(f.program, f.timeline, 312e12, "test", 0, parts);
  const ComputeByKind& seconds = split.stages[0].compute_by_kind;
  EXPECT_DOUBLE_EQ(seconds[layer], 0);
  EXPECT_DOUBLE_EQ(seconds[static_cast<std::size_t>(model::ComputeKind::MlpUp)], 0.75);
  EXPECT_DOUBLE_EQ(seconds[static_cast<std::size_t>(model::ComputeKind::AttentionCore)], 2.25);
  const std::string table = summary_table(split);
  EXPECT_THAT(table, ::testing::HasSubstr("compute by kernel: GEMMs 7.5 %, attention core 22.5 %"));
  EXPECT_THAT(table, ::testing::Not(::testing::HasSubstr("layers not split")));
  const nlohmann::json json = summary_to_json(split);
  EXPECT_DOUBLE_EQ(json["compute_by_kind_s"]["mlp_up"].get<double>(), 0.75);
  EXPECT_DOUBLE_EQ(json["stages"][0]["compute_by_kind_s"]["attention_core"].get<double>(), 2.25);
  EXPECT_FALSE(json["compute_by_kind_s"].contains("transformer_layer"));  // only the kinds that ran
}

TEST(Trace, IsChromeTraceJson) {
  const Fixture f;
  const nlohmann::json trace = nlohmann::json::parse(chrome_trace(f.program, f.timeline));
  int complete = 0;
  for (const auto& event : trace["traceEvents"]) complete += event["ph"] == "X";
  EXPECT_EQ(complete, 5);
  EXPECT_NE(trace.dump().find("rank 0 (stage 0, dp 0, tp 0)"), std::string::npos);
  EXPECT_EQ(nlohmann::json::parse(chrome_trace(f.program, f.timeline, {3}))["traceEvents"].size(), 0u);
}

TEST(Svg, DrawsOneBoxPerMicroBatchAndPass) {
  const Fixture f;
  const std::string svg = pipeline_svg(f.program, f.timeline);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  std::size_t boxes = 0;
  for (std::size_t at = svg.find("fill=\"#4e79a7\""); at != std::string::npos;
       at = svg.find("fill=\"#4e79a7\"", at + 1)) {
    ++boxes;
  }
  // Micro-batch 0: its compute, then (after the wait, which is bubble) its TP all-reduce; micro-batch 1.
  EXPECT_EQ(boxes, 3u);
}

TEST(RankList, Parses) {
  EXPECT_EQ(parse_rank_list("0,5,7-9", 16), (std::vector<int>{0, 5, 7, 8, 9}));
  EXPECT_EQ(parse_rank_list("3,3,1", 16), (std::vector<int>{1, 3}));
  EXPECT_THROW(parse_rank_list("16", 16), std::invalid_argument);
  EXPECT_THROW(parse_rank_list("a", 16), std::invalid_argument);
  EXPECT_THROW(parse_rank_list("5-2", 16), std::invalid_argument);
  EXPECT_THROW(parse_rank_list("1,,2", 16), std::invalid_argument);
}

}  // namespace
}  // namespace twin::report
