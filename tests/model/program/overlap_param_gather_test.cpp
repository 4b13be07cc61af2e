// parallel.overlap_param_gather (Megatron-Core's --overlap-param-gather): ZeRO-1's parameter all-gathers leave the end
// of the iteration for the first micro-batch's forward, each bucket's forward waiting for its own gather; under 1F1B
// each gather is dispatched as the bucket before it begins its forward, under the interleaved schedule every chunk's
// at the start. The same gathers, the same bytes; only where they sit and what waits for them moves.
#include <gtest/gtest.h>

#include <map>
#include <utility>

#include "model/program/estimates.hpp"
#include "model/program/program.hpp"
#include "test_scenarios.hpp"

namespace twin::model {
namespace {

using testing::make_scenario;

Scenario zero_one(Scenario s, bool overlap_param_gather) {
  s.parallel.zero_stage = 1;
  s.parallel.dp_overlap = true;
  s.parallel.overlap_param_gather = overlap_param_gather;
  return s;
}

bool is_parameter_gather(const Op& op) {
  return op.kind == OpKind::Collective && op.payload == Payload::Parameters;
}

// (layer, kind) -> index of the bucket's parameter gather on one stage
std::map<std::pair<int, ComputeKind>, int> gathers_of(const std::vector<Op>& ops) {
  std::map<std::pair<int, ComputeKind>, int> out;
  for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
    if (is_parameter_gather(ops[i])) out[{ops[i].layer, ops[i].what}] = i;
  }
  return out;
}

// The first op of micro-batch 0's forward that belongs to a bucket (a transformer layer, the embedding, the head:
// its final layer norm comes first).
int first_forward_op(const std::vector<Op>& ops, int layer, ComputeKind what) {
  const ComputeKind first = what == ComputeKind::LmHead ? ComputeKind::FinalLayerNorm : what;
  for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
    const Op& op = ops[i];
    if (op.kind != OpKind::Compute || op.phase != Phase::Forward || op.micro_batch != 0) continue;
    if (what == ComputeKind::TransformerLayer ? op.layer == layer : op.what == first) return i;
  }
  return -1;
}

bool depends_on(const Op& op, int index) {
  for (int dep : op.deps) {
    if (dep == index) return true;
  }
  return false;
}

TEST(OverlapParamGather, TheSameGathersMoveFromAfterTheStepToUnderTheFirstForward) {
  const Scenario base = make_scenario(4, 64, 4, 32, 256, 1, 2, 2, 1, 8);
  const Program after_step = build_program(zero_one(base, false));
  const Program under_forward = build_program(zero_one(base, true));
  for (int stage = 0; stage < 2; ++stage) {
    const auto& before = after_step.stage_ops[stage];
    const auto& now = under_forward.stage_ops[stage];
    int optimizer_step = -1;
    for (int i = 0; i < static_cast<int>(now.size()); ++i) {
      if (now[i].what == ComputeKind::OptimizerStep && now[i].kind == OpKind::Compute) optimizer_step = i;
    }
    ASSERT_GE(optimizer_step, 0);
    double bytes_before = 0, bytes_now = 0;
    int count_before = 0, count_now = 0;
    for (const Op& op : before) {
      if (is_parameter_gather(op)) bytes_before += op.bytes, ++count_before;
    }
    for (int i = 0; i < static_cast<int>(now.size()); ++i) {
      if (!is_parameter_gather(now[i])) continue;
      bytes_now += now[i].bytes;
      ++count_now;
      EXPECT_LT(i, optimizer_step) << "stage " << stage << ": a gather after the step";
      EXPECT_EQ(now[i].stream, Stream::DataParallel);
      EXPECT_EQ(now[i].phase, Phase::Forward);
      EXPECT_EQ(now[i].micro_batch, 0);
    }
    EXPECT_EQ(count_now, count_before) << "stage " << stage;
    EXPECT_DOUBLE_EQ(bytes_now, bytes_before) << "stage " << stage;
    // Every bucket's first forward waits for its own gather.
    for (const auto& [bucket, gather] : gathers_of(now)) {
      const int forward = first_forward_op(now, bucket.first, bucket.second);
      ASSERT_GE(forward, 0);
      EXPECT_TRUE(depends_on(now[forward], gather)) << "stage " << stage << " layer " << bucket.first;
    }
  }
}

TEST(OverlapParamGather, UnderOneFOneBEachGatherIsDispatchedAsTheBucketBeforeItBeginsItsForward) {
  const Program program = build_program(zero_one(make_scenario(4, 64, 4, 32, 256, 1, 2, 2, 1, 8), true));
  // Stage 1 holds layers 2 and 3 and the head: its first gather waits for the activation it receives (the forward
  // that dispatches it runs after the Recv), the second for nothing but the stream's order, the third (the head's)
  // for layer 2's forward to end, which is when layer 3's forward begins and waits for layer 3's gather.
  const auto& ops = program.stage_ops[1];
  const auto gathers = gathers_of(ops);
  ASSERT_EQ(gathers.size(), 3u);
  const int layer2 = gathers.at({2, ComputeKind::TransformerLayer});
  const int layer3 = gathers.at({3, ComputeKind::TransformerLayer});
  const int head = gathers.at({-1, ComputeKind::LmHead});
  ASSERT_EQ(ops[layer2].deps.size(), 1u);
  EXPECT_EQ(ops[ops[layer2].deps[0]].kind, OpKind::Recv);
  EXPECT_TRUE(ops[layer3].deps.empty());
  ASSERT_EQ(ops[head].deps.size(), 1u);
  const Op& dispatcher = ops[ops[head].deps[0]];
  EXPECT_EQ(dispatcher.layer, 2);
  EXPECT_EQ(dispatcher.phase, Phase::Forward);
  EXPECT_LT(layer2, layer3);
  EXPECT_LT(layer3, head);
  EXPECT_LT(head, first_forward_op(ops, 3, ComputeKind::TransformerLayer));
}

TEST(OverlapParamGather, TheInterleavedScheduleDispatchesEveryChunksGathersAtTheStart) {
  Scenario s = zero_one(make_scenario(8, 64, 4, 32, 256, 1, 2, 2, 1, 8), true);
  s.parallel.schedule = ScheduleKind::Interleaved;
  s.parallel.virtual_stages = 2;
  const Program program = build_program(s);
  for (int stage = 0; stage < 2; ++stage) {
    const auto& ops = program.stage_ops[stage];
    const auto gathers = gathers_of(ops);
    EXPECT_EQ(gathers.size(), 5u) << "stage " << stage;  // four layers (two chunks of two) and an end of the model
    for (int i = 0; i < static_cast<int>(gathers.size()); ++i) {
      EXPECT_TRUE(is_parameter_gather(ops[i])) << "stage " << stage << " op " << i;
      EXPECT_TRUE(ops[i].deps.empty());
    }
  }
}

TEST(OverlapParamGather, IsMegatronsDistributedOptimizerWithOverlappedGradientReduction) {
  const std::string plan = R"(
[model]
name = "small"
layers = 4
hidden = 64
heads = 4
seq_len = 32
vocab = 256
[parallel]
pp = 2
dp = 2
micro_batch = 1
global_batch = 8
overlap_param_gather = true
)";
  const auto problems = [&](const std::string& extra) {
    return testing::problems_of(plan + extra + "\n[cluster]\nnode = \"dgx-a100\"\nnodes = 1\ngpus_per_node = 4\n");
  };
  const std::string zero = "zero_stage = 1\n", overlap = "dp_overlap = true\n";
  EXPECT_TRUE(problems(zero + overlap).empty()) << ::testing::PrintToString(problems(zero + overlap));
  auto says = [](const std::vector<std::string>& list, const std::string& text) {
    for (const auto& line : list) {
      if (line.find(text) != std::string::npos) return true;
    }
    return false;
  };
  EXPECT_TRUE(says(problems(overlap), "the distributed optimizer, parallel.zero_stage = 1, got 0"));
  EXPECT_TRUE(says(problems(zero), "--overlap-grad-reduce, parallel.dp_overlap = true"));
  EXPECT_TRUE(says(problems(zero + overlap + "[framework]\nname = \"deepspeed\"\n"),
                   "framework.name = \"megatron\", got \"deepspeed\""));
}

}  // namespace
}  // namespace twin::model
