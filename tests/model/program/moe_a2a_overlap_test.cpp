// framework.moe_a2a_overlap (model/program/moe_a2a_overlap.hpp): Megatron-Core's combined 1F1B. The Program keeps every
// op, FLOP and byte; the all-to-alls move to the expert stream; a steady step interleaves a forward's and a backward's
// nodes as TransformerLayerSchedulePlan.run does; the warm-up runs one more forward; Megatron-Core's refusals.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "model/plan/schedule.hpp"
#include "model/program/moe_a2a_overlap.hpp"
#include "model/program/program.hpp"
#include "model/scenario/errors.hpp"
#include "model/scenario/scenario.hpp"

namespace twin::model {
namespace {

using ::testing::HasSubstr;

// 8 layers (the first dense) on 16 GPUs: tp 2, pp 2 with 2 chunks a stage, dp 4; 8 experts over ep 4.
constexpr const char* kMoe = R"(
[model]
name = "tiny-moe"
layers = 8
hidden = 256
heads = 8
seq_len = 128
vocab = 1000
experts = 8
top_k = 2
moe_ffn_hidden = 512
shared_experts = 1
dense_layers = 1

[parallel]
tp = 2
pp = 2
schedule = "interleaved"
virtual_stages = 2
micro_batch = 1
global_batch = 32
sequence_parallel = true
ep = 4
zero_stage = 1
dp_overlap = true

[framework]
moe_a2a_overlap = true

[cluster]
nodes = 2
node = "dgx-a100"
)";

Scenario scenario(const std::vector<Override>& overrides = {}) {
  return parse_scenario(kMoe, "moe.toml", overrides);
}

std::string overlap_problems_of(const std::vector<Override>& overrides) {
  try {
    parse_scenario(kMoe, "moe.toml", overrides);
  } catch (const ScenarioError& error) {
    std::string out;
    for (const auto& problem : error.problems()) out += problem + "\n";
    return out;
  }
  return {};
}

bool is_all_to_all(const Op& op) {
  return op.kind == OpKind::Collective && op.collective == CollectiveKind::AllToAll;
}

// The rows' all-to-alls (the dispatch and the combine), not the probabilities' beside the dispatch.
bool is_rows_all_to_all(const Op& op) {
  return is_all_to_all(op) && op.payload == Payload::Tokens;
}

struct Sums {
  double flops = 0, compute_bytes = 0, collective_bytes = 0;
};
Sums sums_of(const Program& program) {
  Sums sums;
  for (const auto& ops : program.stage_ops) {
    for (const Op& op : ops) {
      sums.flops += op.flops;
      (op.kind == OpKind::Compute ? sums.compute_bytes : sums.collective_bytes) += op.bytes;
    }
  }
  return sums;
}

// Each op of a stage as what it is, whatever its place and stream.
using OpKey = std::tuple<int, int, int, int, int, int, int, int, int, double>;
std::vector<OpKey> keys_of(const std::vector<Op>& ops) {
  std::vector<OpKey> keys;
  for (const Op& op : ops) {
    keys.emplace_back(static_cast<int>(op.kind), static_cast<int>(op.what), static_cast<int>(op.phase),
                      static_cast<int>(op.collective), static_cast<int>(op.payload), static_cast<int>(op.group),
                      op.layer, op.micro_batch, op.chunk, op.bytes);
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

TEST(MoeA2aOverlap, KeepsEveryOpFlopAndByte) {
  const Scenario on = scenario(), off = scenario({{"framework.moe_a2a_overlap", "false"}});
  for (const Granularity granularity : {Granularity::Op, Granularity::Layer}) {
    const Program a = build_program(off, granularity), b = build_program(on, granularity);
    const Sums x = sums_of(a), y = sums_of(b);
    EXPECT_GT(y.flops, 0);
    EXPECT_DOUBLE_EQ(y.flops, x.flops) << to_string(granularity);
    EXPECT_DOUBLE_EQ(y.compute_bytes, x.compute_bytes) << to_string(granularity);
    EXPECT_DOUBLE_EQ(y.collective_bytes, x.collective_bytes) << to_string(granularity);
    EXPECT_DOUBLE_EQ(b.total_flops(), a.total_flops());
  }
  // At op granularity the same ops, one for one, on every stage.
  const Program a = build_program(off, Granularity::Op), b = build_program(on, Granularity::Op);
  for (int stage = 0; stage < a.stages(); ++stage) EXPECT_EQ(keys_of(b.stage_ops[stage]), keys_of(a.stage_ops[stage]));
}

TEST(MoeA2aOverlap, TheAllToAllsRunOnTheExpertStream) {
  for (const Granularity granularity : {Granularity::Op, Granularity::Layer}) {
    int exchanges = 0;
    for (const auto& ops : build_program(scenario(), granularity).stage_ops) {
      for (const Op& op : ops) {
        if (is_all_to_all(op)) {
          ++exchanges;
          EXPECT_EQ(op.stream, Stream::Expert);
        }
        if (op.stream == Stream::Expert) {  // nothing else: every kernel stays on the compute stream
          const bool sync = op.what == ComputeKind::ExpertSplitsSync ||
                            (op.breakdown && op.breakdown->parts.size() == 1 &&
                             op.breakdown->parts[0].what == ComputeKind::ExpertSplitsSync);  // fused
          EXPECT_TRUE(is_all_to_all(op) || sync) << to_string(op.what);
          EXPECT_GE(op.layer, 1);
        }
      }
    }
    EXPECT_GT(exchanges, 0);
    for (const auto& ops : build_program(scenario({{"framework.moe_a2a_overlap", "false"}}), granularity).stage_ops) {
      for (const Op& op : ops) EXPECT_NE(op.stream, Stream::Expert);
    }
  }
}

// TransformerLayerSchedulePlan.run: the backward's combine, the forward's dispatch, the backward's dispatch, the
// forward's combine, each a different micro-batch from the one before; each dispatch's probabilities right after it,
// in its node; and no op waits on another micro-batch's.
TEST(MoeA2aOverlap, ASteadyStepInterleavesTheForwardsAndTheBackwardsAllToAlls) {
  const Program program = build_program(scenario(), Granularity::Op);
  const std::vector<Op>& ops = program.stage_ops[0];
  std::vector<const Op*> exchanges;
  int probabilities = 0;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (is_rows_all_to_all(ops[i])) exchanges.push_back(&ops[i]);
    if (!is_all_to_all(ops[i]) || ops[i].payload != Payload::ExpertProbs) continue;
    ++probabilities;
    ASSERT_GT(i, 0u);
    const Op& rows = ops[i - 1];
    EXPECT_TRUE(is_rows_all_to_all(rows) && rows.what == ComputeKind::ExpertUp && rows.phase == ops[i].phase &&
                rows.micro_batch == ops[i].micro_batch && rows.layer == ops[i].layer)
        << "op " << i;
    EXPECT_EQ(ops[i].stream, Stream::Expert);
  }
  EXPECT_EQ(probabilities, 2 * static_cast<int>(std::count_if(ops.begin(), ops.end(), [](const Op& op) {
                             return is_rows_all_to_all(op) && op.phase == Phase::Forward &&
                                    op.what == ComputeKind::ExpertUp;
                           })));
  const auto is = [](const Op* op, Phase phase, ComputeKind what) { return op->phase == phase && op->what == what; };
  int windows = 0;
  for (std::size_t i = 0; i + 3 < exchanges.size(); ++i) {
    const Op *combine_bwd = exchanges[i], *dispatch = exchanges[i + 1], *dispatch_bwd = exchanges[i + 2],
             *combine = exchanges[i + 3];
    if (is(combine_bwd, Phase::Backward, ComputeKind::ExpertDown) &&
        is(dispatch, Phase::Forward, ComputeKind::ExpertUp) &&
        is(dispatch_bwd, Phase::Backward, ComputeKind::ExpertUp) &&
        is(combine, Phase::Forward, ComputeKind::ExpertDown)) {
      ++windows;
      EXPECT_NE(combine_bwd->micro_batch * 8 + combine_bwd->chunk, dispatch->micro_batch * 8 + dispatch->chunk);
      EXPECT_EQ(dispatch_bwd->micro_batch, combine_bwd->micro_batch);
      EXPECT_EQ(combine->micro_batch, dispatch->micro_batch);
    }
  }
  EXPECT_GT(windows, 0);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].layer < 0 || ops[i].micro_batch < 0) continue;
    for (const std::int32_t dep : ops[i].deps) {
      const Op& before = ops[static_cast<std::size_t>(dep)];
      if (before.micro_batch < 0) continue;  // a parameter gather
      EXPECT_EQ(before.micro_batch, ops[i].micro_batch) << "op " << i;
      EXPECT_EQ(before.chunk, ops[i].chunk) << "op " << i;
    }
  }
}

void expect_pairs_merged_where_the_model_has_all_to_alls(const char* schedule) {
  const auto with_ep = [&](const char* ep) {
    return scenario({{"parallel.schedule", schedule}, {"framework.moe_a2a_overlap", "false"}, {"parallel.ep", ep}});
  };
  const Scenario merged = with_ep("4"), alone = with_ep("1");
  EXPECT_TRUE(overlaps_pairs(merged));
  EXPECT_FALSE(overlaps_pairs(alone));
  EXPECT_FALSE(overlaps_pairs(scenario({{"framework.moe_a2a_overlap", "false"}})));  // interleaved 1F1B
  const Program program = build_program(merged, Granularity::Op);
  int windows = 0, on_expert_stream = 0;
  for (const auto& ops : program.stage_ops) {
    std::vector<const Op*> exchanges;
    for (const Op& op : ops) {
      if (is_all_to_all(op)) exchanges.push_back(&op);
      on_expert_stream += op.stream == Stream::Expert;
    }
    for (std::size_t i = 0; i + 3 < exchanges.size(); ++i) {
      windows += exchanges[i]->phase == Phase::Backward && exchanges[i + 1]->phase == Phase::Forward &&
                 exchanges[i + 2]->phase == Phase::Backward && exchanges[i + 3]->phase == Phase::Forward &&
                 exchanges[i]->micro_batch == exchanges[i + 2]->micro_batch &&
                 exchanges[i + 1]->micro_batch == exchanges[i + 3]->micro_batch;
    }
  }
  EXPECT_GT(windows, 0);
  EXPECT_GT(on_expert_stream, 0);
  for (const auto& ops : build_program(alone, Granularity::Op).stage_ops) {
    for (const Op& op : ops) EXPECT_NE(op.stream, Stream::Expert);
  }
  // Merged or not, the same work: the merge only reorders a step's two micro-batches' ops.
  EXPECT_DOUBLE_EQ(program.total_flops(), build_program(merged, Granularity::Layer).total_flops());
}

// DualPipeV's F&B pairs (its steps 4 and 5, PipelineStep::overlapped) run merged as the combined 1F1B's steady steps
// where the model has expert all-to-alls (overlaps_pairs): the same windows of the two micro-batches' all-to-alls on
// the expert stream, every op, FLOP and byte kept. Without expert parallelism there is nothing to hide: one after the
// other. DualPipe's pairs (the same steps on each half of its stages) likewise.
TEST(MoeA2aOverlap, DualPipeVsPairsRunMergedWhereTheModelHasAllToAlls) {
  for (const char* schedule : {"\"dualpipev\"", "\"dualpipe\""}) {
    SCOPED_TRACE(schedule);
    expect_pairs_merged_where_the_model_has_all_to_alls(schedule);
  }
}

TEST(MoeA2aOverlap, TheWarmUpRunsOneMoreForward) {
  // Interleaved: get_pp_rank_microbatches adds one; capped at every step.
  EXPECT_EQ(warmup_steps(ScheduleKind::Interleaved, 0, 2, 8, 2, 0, 1),
            warmup_steps(ScheduleKind::Interleaved, 0, 2, 8, 2, 0, 0) + 1);
  EXPECT_EQ(warmup_steps(ScheduleKind::Interleaved, 0, 2, 2, 2, 0, 1), 4);
  // No pipeline: combined_1f1b_schedule_for_no_pipelining runs F0, then (F1 + B0), (F2 + B1), ..., then B3.
  const std::vector<StageSchedule> plain = build_schedule(ScheduleKind::OneFOneB, 1, 4, 1, 0, 1);
  const StageSchedule expected = {{0, 0, Pass::Forward},  {1, 0, Pass::Forward},  {0, 0, Pass::Backward},
                                  {2, 0, Pass::Forward},  {1, 0, Pass::Backward}, {3, 0, Pass::Forward},
                                  {2, 0, Pass::Backward}, {3, 0, Pass::Backward}};
  EXPECT_EQ(plain[0], expected);
  const Program program = build_program(scenario());
  const Scenario off = scenario({{"framework.moe_a2a_overlap", "false"}});
  EXPECT_EQ(program.schedule, build_schedule(off.parallel, 1));
  EXPECT_NE(program.schedule, build_schedule(off.parallel));
}

TEST(MoeA2aOverlap, RefusedWhereMegatronCoreRefusesIt) {
  EXPECT_EQ(overlap_problems_of({}), "");
  EXPECT_EQ(overlap_problems_of({{"parallel.recompute", "selective"}}), "");
  EXPECT_THAT(overlap_problems_of({{"parallel.ep", "1"}}), HasSubstr("only supported with expert model parallelism"));
  EXPECT_THAT(overlap_problems_of({{"parallel.schedule", "1f1b"}, {"parallel.virtual_stages", "1"}}),
              HasSubstr("virtual_pipeline_model_parallel_size must be specified"));
  EXPECT_THAT(overlap_problems_of({{"parallel.recompute", "full"}}), HasSubstr("disable full recomputation"));
  EXPECT_THAT(overlap_problems_of({{"model.dtype", "fp32"}}), HasSubstr("only supported with bf16 or fp16"));
  EXPECT_THAT(
      overlap_problems_of({{"parallel.pp", "1"}, {"parallel.schedule", "gpipe"}, {"parallel.virtual_stages", "1"}}),
      HasSubstr("set parallel.schedule = \"1f1b\""));
  EXPECT_EQ(
      overlap_problems_of({{"parallel.pp", "1"}, {"parallel.schedule", "1f1b"}, {"parallel.virtual_stages", "1"}}), "");
  // A dense model: the key names what it lacks.
  std::string dense = kMoe;
  for (const char* key : {"experts = 8\n", "top_k = 2\n", "moe_ffn_hidden = 512\n", "shared_experts = 1\n",
                          "dense_layers = 1\n", "ep = 4\n"}) {
    dense.erase(dense.find(key), std::string(key).size());
  }
  try {
    parse_scenario(dense, "dense.toml");
    ADD_FAILURE() << "a dense model with framework.moe_a2a_overlap loaded";
  } catch (const ScenarioError& error) {
    ASSERT_EQ(error.problems().size(), 1u);
    EXPECT_THAT(error.problems()[0], HasSubstr("framework.moe_a2a_overlap (Megatron-Core's "
                                               "--overlap-moe-expert-parallel-comm) needs expert parallelism"));
  }
}

TEST(MoeA2aOverlap, RoundTripsThroughToml) {
  const Scenario s = scenario();
  EXPECT_TRUE(s.framework.moe_a2a_overlap);
  EXPECT_TRUE(parse_scenario(to_toml(s), "back.toml").framework.moe_a2a_overlap);
  EXPECT_EQ(to_toml(scenario({{"framework.moe_a2a_overlap", "false"}})).find("moe_a2a_overlap"), std::string::npos);
}

}  // namespace
}  // namespace twin::model
