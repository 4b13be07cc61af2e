// parallel.schedule = "dualpipe" in the Program (model/program/stage_builder.hpp): each half of the micro-batches
// routed through its direction's blocks, an embedding and a loss at both ends, the two copies' gradients summed over
// the mirror pair, and the memory of the second copy.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "model/program/estimates.hpp"
#include "model/program/program.hpp"
#include "test_scenarios.hpp"

namespace twin::model {
namespace {

// 8 layers on 4 stages (blocks of 2 layers), 8 micro-batches, untied embeddings (each end its own head weight).
Scenario plan(ScheduleKind kind, int chunks) {
  Scenario s = testing::make_scenario(8, 64, 4, 16, 128, 1, 4, 1, 1, 8);
  s.parallel.schedule = kind;
  s.parallel.virtual_stages = chunks;
  s.framework.tied_embeddings = false;
  s.cluster = ClusterSpec{1, NodeKind::CpuHost, 4};
  return s;
}

// Down micro-batches (0..3) on chunk 0 of stage s run block s (layers 2s, 2s+1) and go on to stage s + 1; up ones
// (4..7) on chunk 1 run block 3 - s and go on to stage s - 1. Embedding where a direction enters, head and loss
// where it leaves: stage 0 embeds the down half and ends the up half, stage 3 the reverse.
TEST(DualPipeProgram, RoutesEachHalfThroughItsDirectionsBlocks) {
  const Scenario s = plan(ScheduleKind::DualPipe, 2);
  ASSERT_TRUE(validation_problems(s).empty());
  const Program program = build_program(s, Granularity::Layer);
  for (int stage = 0; stage < 4; ++stage) {
    std::set<std::pair<int, int>> embedded, ended;  // (micro-batch, stage)
    for (const Op& op : program.stage_ops[stage]) {
      if (op.kind == OpKind::Compute && op.phase == Phase::Forward && op.micro_batch >= 0) {
        const bool down = op.micro_batch < 4;
        EXPECT_EQ(op.chunk, down ? 0 : 1) << "stage " << stage;
        if (op.what == ComputeKind::TransformerLayer) {
          EXPECT_EQ(op.layer / 2, down ? stage : 3 - stage) << "stage " << stage << " micro-batch " << op.micro_batch;
        }
        if (op.what == ComputeKind::Embedding) embedded.insert({op.micro_batch, stage});
        if (op.what == ComputeKind::CrossEntropy) ended.insert({op.micro_batch, stage});
      }
      if (op.kind == OpKind::Send && op.phase == Phase::Forward) {
        EXPECT_EQ(op.peer_stage, op.micro_batch < 4 ? stage + 1 : stage - 1) << "stage " << stage;
      }
    }
    const int expected_ends = stage == 0 || stage == 3 ? 4 : 0;
    EXPECT_EQ(static_cast<int>(embedded.size()), expected_ends) << "stage " << stage;
    EXPECT_EQ(static_cast<int>(ended.size()), expected_ends) << "stage " << stage;
    for (const auto& [micro_batch, at] : embedded) EXPECT_EQ(micro_batch < 4, at == 0);
    for (const auto& [micro_batch, at] : ended) EXPECT_EQ(micro_batch < 4, at == 3);
  }
}

// Uneven end blocks (parallel.first_stage_layers = 1, last_stage_layers = 3 of 8 layers): each direction's blocks hold
// 1, 2, 2, 3 layers, so both end stages hold 1 + 3 and the middle ones 2 + 2, and every layer runs once per direction.
TEST(DualPipeProgram, UnevenEndBlocksSizeEachDirectionsFirstAndLastBlock) {
  Scenario s = plan(ScheduleKind::DualPipe, 2);
  s.parallel.first_stage_layers = 1;
  s.parallel.last_stage_layers = 3;
  ASSERT_TRUE(validation_problems(s).empty());
  const Program program = build_program(s, Granularity::Layer);
  const std::vector<std::set<int>> down_blocks = {{0}, {1, 2}, {3, 4}, {5, 6, 7}};
  for (int stage = 0; stage < 4; ++stage) {
    EXPECT_EQ(s.layers_on_stage(stage), 4) << "stage " << stage;
    std::set<int> down, up;
    for (const Op& op : program.stage_ops[stage]) {
      if (op.kind != OpKind::Compute || op.phase != Phase::Forward || op.what != ComputeKind::TransformerLayer) continue;
      (op.micro_batch < 4 ? down : up).insert(op.layer);
    }
    EXPECT_EQ(down, down_blocks[stage]) << "stage " << stage;
    EXPECT_EQ(up, down_blocks[3 - stage]) << "stage " << stage;
  }
  // The same block sizes with accounted embedding and loss are refused by name (both ends would count them twice).
  s.parallel.first_stage_layers = s.parallel.last_stage_layers = 0;
  s.parallel.account_for_embedding = true;
  const std::vector<std::string> problems = validation_problems(s);
  ASSERT_FALSE(problems.empty());
  EXPECT_NE(problems.front().find("parallel.account_for_embedding"), std::string::npos) << problems.front();
}

// One all-reduce of the stage's whole gradient over {s, 3 - s} (Group::MirrorStages), fp32 as Megatron reduces bf16
// gradients: the same bytes on both members, every parameter of the stage once, before the optimizer step.
TEST(DualPipeProgram, SumsTheTwoCopiesGradientsOverTheMirrorPair) {
  const Scenario s = plan(ScheduleKind::DualPipe, 2);
  const Program program = build_program(s, Granularity::Layer);
  for (int stage = 0; stage < 4; ++stage) {
    int sums = 0, at = -1, step = -1;
    double bytes = 0;
    const auto& ops = program.stage_ops[stage];
    for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
      if (ops[i].kind == OpKind::Collective && ops[i].group == Group::MirrorStages) {
        ++sums;
        at = i;
        bytes = ops[i].bytes;
        EXPECT_EQ(ops[i].collective, CollectiveKind::AllReduce);
      }
      if (ops[i].kind == OpKind::Compute && ops[i].what == ComputeKind::OptimizerStep) step = i;
    }
    EXPECT_EQ(sums, 1) << "stage " << stage;
    EXPECT_LT(at, step) << "stage " << stage;
    EXPECT_DOUBLE_EQ(bytes, 4 * parameters_per_gpu(s, stage)) << "stage " << stage;
    EXPECT_DOUBLE_EQ(parameters_per_gpu(s, stage), parameters_per_gpu(s, 3 - stage));
  }
  // No other schedule has the pair.
  const Program v = build_program(plan(ScheduleKind::DualPipeV, 2), Granularity::Layer);
  for (const Op& op : v.stage_ops[0]) {
    EXPECT_NE(op.group, Group::MirrorStages);
  }
}

// DeepSeek-V3's Table 2 (the DualPipe README): parameters 2x, activations PP + 1. Every block, embedding and head is
// held twice, so the stages' parameters sum to twice 1F1B's on the same pp, a middle stage's exactly twice; gradients
// and optimizer state follow the parameters (each rank's optimizer steps both its copies, the sum keeping them equal).
// At the peak p + 1 = 5 blocks' activations (max_in_flight), each a block of 2 layers.
TEST(DualPipeProgram, MemoryCountsTheSecondCopy) {
  const MemoryEstimate dual = estimate_memory(plan(ScheduleKind::DualPipe, 2));
  const MemoryEstimate one = estimate_memory(plan(ScheduleKind::OneFOneB, 1));
  double dual_total = 0, one_total = 0;
  for (int stage = 0; stage < 4; ++stage) {
    dual_total += dual.stages[stage].parameters;
    one_total += one.stages[stage].parameters;
    EXPECT_EQ(dual.stages[stage].in_flight_micro_batches, 5) << "stage " << stage;
  }
  EXPECT_DOUBLE_EQ(dual_total, 2 * one_total);
  for (int stage : {1, 2}) {
    EXPECT_DOUBLE_EQ(dual.stages[stage].parameters, 2 * one.stages[stage].parameters);
    EXPECT_DOUBLE_EQ(dual.stages[stage].gradients_bytes, 2 * one.stages[stage].gradients_bytes);
    EXPECT_DOUBLE_EQ(dual.stages[stage].optimizer_bytes, 2 * one.stages[stage].optimizer_bytes);
  }
}

// scenarios/deepseek-v3-h800.toml is the plan DeepSeek-V3's report describes (arXiv:2412.19437, sections 3.1 to 3.3
// and 4.2): 2048 H800, PP 16 with DualPipe, EP 64 over 8 nodes, ZeRO-1 DP, no TP, FP8 with 1 x 128 / 128 x 128 block
// scales, batches of 15360 sequences of 4096 tokens; its 61 layers in blocks of 4, 14 x 4 and 1, so each end stage
// holds 5 and the others 8.
TEST(DualPipeProgram, DeepSeekV3OnH800IsTheReportsPlan) {
  const Scenario s = load_scenario(testing::source_dir() + "/scenarios/deepseek-v3-h800.toml");
  const ParallelSpec& p = s.parallel;
  EXPECT_EQ(p.tp * p.pp * p.dp, 2048);
  EXPECT_EQ(s.cluster.nodes * 8, 2048);
  EXPECT_EQ(p.pp, 16);
  EXPECT_EQ(p.ep, 64);
  EXPECT_EQ(p.tp, 1);
  EXPECT_EQ(p.zero_stage, 1);
  EXPECT_EQ(p.schedule, ScheduleKind::DualPipe);
  EXPECT_EQ(s.model.fp8, Fp8Format::E4M3);
  EXPECT_EQ(s.framework.fp8_recipe, Fp8Recipe::Blockwise);
  EXPECT_EQ(p.global_batch * s.model.seq_len, 15360 * 4096);
  EXPECT_EQ(p.micro_batches() % 2, 0);
  for (int stage = 0; stage < 16; ++stage) {
    EXPECT_EQ(s.layers_on_stage(stage), stage == 0 || stage == 15 ? 5 : 8) << "stage " << stage;
  }
}

}  // namespace
}  // namespace twin::model
