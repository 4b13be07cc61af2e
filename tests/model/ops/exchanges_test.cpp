// The Program's pipeline exchanges as the frameworks issue them (model/ops/exchanges.hpp), what a message costs beyond
// its bytes (pipeline_transfer), the one packing of a P2P tag (p2p_tag_key) and which TP collectives hide under a GEMM.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/ops/exchanges.hpp"
#include "model/ops/tp_overlap.hpp"
#include "model/program/program.hpp"
#include "test_scenarios.hpp"

namespace twin::model {
namespace {

using testing::make_scenario;

// TP 8 x PP 2, one layer per stage.
Scenario two_stages() {
  return make_scenario(2, 1024, 16, 1024, 50257, 8, 2, 1, 1, 8);
}

TEST(PipelineTransfer, MegatronScattersAndGathersDeepSpeedPartitions) {
  Scenario s = two_stages();
  Op activation;
  activation.kind = OpKind::Send;
  activation.phase = Phase::Forward;
  activation.bytes = 8e6;
  Op gradient = activation;
  gradient.phase = Phase::Backward;
  // Megatron: scatter/gather both ways; until February 2022 gather_split_1d_tensor's list all_gather copies the
  // tensor out of NCCL's flat buffer (read, write; one copy per chunk), after it gathers in place.
  EXPECT_DOUBLE_EQ(pipeline_transfer(s, activation).wire_bytes, 1e6);
  EXPECT_EQ(pipeline_transfer(s, gradient).receipt_gathers, 1);
  EXPECT_DOUBLE_EQ(pipeline_transfer(s, activation).receipt_copy_bytes, 2 * 8e6);
  EXPECT_EQ(pipeline_transfer(s, gradient).receipt_copy_kernels, 8);
  s.framework.pipeline_gather_copies = false;
  EXPECT_DOUBLE_EQ(pipeline_transfer(s, activation).receipt_copy_bytes, 0);
  // DeepSpeed: partitioned activations (meta + data), whole gradients; every gather is PartitionedTensor.full()
  // (zero-fill, copy-out, clone: 5 full tensors), and the received partition is cloned twice (receive, forward).
  s.framework.name = Framework::DeepSpeed;
  EXPECT_DOUBLE_EQ(pipeline_transfer(s, activation).wire_bytes, 1e6);
  EXPECT_EQ(pipeline_transfer(s, activation).messages, 2);
  EXPECT_DOUBLE_EQ(pipeline_transfer(s, gradient).wire_bytes, 8e6);
  EXPECT_DOUBLE_EQ(pipeline_transfer(s, activation).receipt_copy_bytes, 5 * 8e6 + 2 * 2 * 1e6);
  EXPECT_DOUBLE_EQ(pipeline_transfer(s, gradient).receipt_copy_bytes, 5 * 8e6);
  EXPECT_EQ(pipeline_transfer(s, gradient).receipt_gathers, 1);
  // BF16_Optimizer's engine (v0.6.2 on) partitions gradients too; the backward restores the output and the gradient.
  s.framework.bf16_optimizer = true;
  EXPECT_DOUBLE_EQ(pipeline_transfer(s, gradient).wire_bytes, 1e6);
  EXPECT_EQ(pipeline_transfer(s, gradient).messages, 2);
  EXPECT_EQ(pipeline_transfer(s, gradient).receipt_gathers, 2);
  EXPECT_DOUBLE_EQ(pipeline_transfer(s, gradient).receipt_copy_bytes, 2 * 5 * 8e6);
  EXPECT_DOUBLE_EQ(pipeline_transfer(s, activation).receipt_copy_bytes, 5 * 8e6 + 2 * 2 * 1e6);
  s.framework.bf16_optimizer = false;
  // So does any engine from v0.5.4 on (is_grad_partitioned = is_model_parallel), in fp16 too; v0.5.3 still sends
  // gradients whole.
  s.framework.deepspeed_version = {0, 5, 3};
  EXPECT_DOUBLE_EQ(pipeline_transfer(s, gradient).wire_bytes, 8e6);
  s.framework.deepspeed_version = {0, 5, 4};
  EXPECT_DOUBLE_EQ(pipeline_transfer(s, gradient).wire_bytes, 1e6);
  EXPECT_EQ(pipeline_transfer(s, gradient).receipt_gathers, 2);
  EXPECT_DOUBLE_EQ(pipeline_transfer(s, gradient).receipt_copy_bytes, 2 * 5 * 8e6);
  s.framework.deepspeed_version = {0, 0, 0};
  // Sequence parallelism already sends a shard.
  s.parallel.sequence_parallel = true;
  EXPECT_DOUBLE_EQ(pipeline_transfer(s, gradient).wire_bytes, 8e6);
  EXPECT_EQ(pipeline_transfer(s, gradient).receipt_gathers, 0);
}

// One pipeline message of a stage's exchange: a Send or Recv of an activation (Forward) or a gradient (Backward).
Op message(OpKind kind, Phase phase, int micro_batch) {
  Op op;
  op.kind = kind;
  op.stream = Stream::Pipeline;
  op.phase = phase;
  op.micro_batch = micro_batch;
  return op;
}

// The order in which `stage` issues `ops`, one exchange's messages.
std::vector<std::int32_t> issue_order(const Scenario& s, const std::vector<Op>& ops, int stage) {
  const std::vector<PipelineExchange> exchanges = pipeline_exchanges(s, ops, stage);
  EXPECT_EQ(exchanges.size(), 1u);
  return exchanges.empty() ? std::vector<std::int32_t>{} : exchanges.front().ops;
}

TEST(PipelineExchanges, DeepSpeedMovesTheActivationFirstWithinAStep) {
  Scenario s = make_scenario(2, 1024, 16, 1024, 50257, 4, 2, 1, 1, 8);
  // Stage 0 of 2 between its forward of micro-batch 1 and its backward of micro-batch 0: both messages belong to
  // TrainSchedule step 3.
  std::vector<Op> ops = {message(OpKind::Recv, Phase::Backward, 0),  // the gradient for the backward to come
                         message(OpKind::Send, Phase::Forward, 1)};  // the activation of the forward just done
  EXPECT_EQ(deepspeed_step(ops[0], 0, 2), 3);
  EXPECT_EQ(deepspeed_step(ops[1], 0, 2), 3);
  EXPECT_EQ(exchange_issue(s), ExchangeIssue::Batched);
  EXPECT_EQ(issue_order(s, ops, 0), (std::vector<std::int32_t>{0, 1}));  // Megatron: batched, as listed
  s.framework.name = Framework::DeepSpeed;
  EXPECT_EQ(exchange_issue(s), ExchangeIssue::Serialized);
  // v0.5's TrainSchedule (a backward step): SendActivation, then RecvGrad.
  EXPECT_EQ(issue_order(s, ops, 0), (std::vector<std::int32_t>{1, 0}));
  // Stage 1 of 2 between its backward of micro-batch 0 and its forward of micro-batch 1 (step 3, a forward step):
  // RecvActivation, then SendGrad.
  ops = {message(OpKind::Send, Phase::Backward, 0), message(OpKind::Recv, Phase::Forward, 1)};
  EXPECT_EQ(deepspeed_step(ops[0], 1, 2), 3);
  EXPECT_EQ(deepspeed_step(ops[1], 1, 2), 3);
  EXPECT_EQ(issue_order(s, ops, 1), (std::vector<std::int32_t>{1, 0}));
  // Messages of different steps go in step order, whatever their direction: a gradient of step 3 before an
  // activation of step 5 (stage 0's micro-batch 2).
  ops = {message(OpKind::Send, Phase::Forward, 2), message(OpKind::Recv, Phase::Backward, 0)};
  EXPECT_EQ(deepspeed_step(ops[0], 0, 2), 5);
  EXPECT_EQ(issue_order(s, ops, 0), (std::vector<std::int32_t>{1, 0}));
  // GPipe is not a DeepSpeed training schedule: batched, as listed; the interleaved schedule's leave eagerly.
  s.parallel.schedule = ScheduleKind::GPipe;
  EXPECT_EQ(exchange_issue(s), ExchangeIssue::Batched);
  EXPECT_EQ(issue_order(s, ops, 0), (std::vector<std::int32_t>{0, 1}));
  s.parallel.schedule = ScheduleKind::Interleaved;
  EXPECT_EQ(exchange_issue(s), ExchangeIssue::Eager);
  s.framework.name = Framework::Megatron;
  EXPECT_EQ(exchange_issue(s), ExchangeIssue::Eager);
}

TEST(PipelineExchanges, DeepSpeedFrom083MovesTheGradientFirstWithinAStep) {
  Scenario s = make_scenario(2, 1024, 16, 1024, 50257, 4, 2, 1, 1, 8);
  s.framework.name = Framework::DeepSpeed;
  // Stage 0 of 2, step 3 (a backward step): the gradient of micro-batch 0 and the activation of micro-batch 1.
  std::vector<Op> ops = {message(OpKind::Send, Phase::Forward, 1),    // the activation of the forward just done
                         message(OpKind::Recv, Phase::Backward, 0)};  // the gradient for the backward to come
  s.framework.deepspeed_version = {0, 8, 2};                          // SendActivation, then RecvGrad
  EXPECT_EQ(issue_order(s, ops, 0), (std::vector<std::int32_t>{0, 1}));
  s.framework.deepspeed_version = {0, 8, 3};  // RecvGrad, then SendActivation (#2862)
  EXPECT_EQ(issue_order(s, ops, 0), (std::vector<std::int32_t>{1, 0}));
  // Steps still come first: stage 0's activation of micro-batch 2 (step 5) after a gradient of step 3, and the last
  // warm-up activation (step 3 of 4 stages) before a gradient of step 7.
  ops[0].micro_batch = 2;
  EXPECT_EQ(issue_order(s, ops, 0), (std::vector<std::int32_t>{1, 0}));
  s.parallel.pp = 4;
  ops[0].micro_batch = 1;
  EXPECT_EQ(issue_order(s, ops, 0), (std::vector<std::int32_t>{0, 1}));
}

TEST(PipelineExchanges, DeepSpeedSendsTheLastWarmupActivationBeforeAGradientOfALaterStep) {
  // Stage 0 of 4 with 2 micro-batches: forwards at steps 0 and 2, the activation of micro-batch 1 leaves in step 3,
  // the gradient of micro-batch 0 arrives in step 7. Receiving the gradient first would wait for a gradient that
  // needs this very activation (stage 1 runs both forwards before its first backward).
  Scenario s = make_scenario(4, 1024, 16, 1024, 50257, 2, 4, 1, 1, 2);
  s.framework.name = Framework::DeepSpeed;
  const std::vector<Op> ops = {message(OpKind::Recv, Phase::Backward, 0), message(OpKind::Send, Phase::Forward, 1)};
  EXPECT_EQ(deepspeed_step(ops[0], 0, 4), 7);
  EXPECT_EQ(deepspeed_step(ops[1], 0, 4), 3);
  EXPECT_EQ(issue_order(s, ops, 0), (std::vector<std::int32_t>{1, 0}));
}

TEST(PipelineExchanges, EveryMessageIsInOneExchangeBetweenItsComputeOps) {
  for (const Framework framework : {Framework::Megatron, Framework::DeepSpeed}) {
    for (const ScheduleKind schedule : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved}) {
      Scenario s = make_scenario(8, 256, 8, 128, 1000, 2, 4, 1, 1, 8);
      s.framework.name = framework;
      s.parallel.schedule = schedule;
      s.parallel.virtual_stages = schedule == ScheduleKind::Interleaved ? 2 : 1;
      s.parallel.dp_overlap = true;
      const Program program = build_program(s, Granularity::Op);
      EXPECT_EQ(program.exchange_issue, exchange_issue(s));
      ASSERT_EQ(program.stage_exchanges.size(), program.stage_ops.size());
      for (int stage = 0; stage < program.stages(); ++stage) {
        const std::vector<Op>& ops = program.stage_ops[stage];
        std::multiset<std::int32_t> listed;
        for (const PipelineExchange& exchange : program.stage_exchanges[stage]) {
          ASSERT_FALSE(exchange.ops.empty());
          const auto [first, last] = std::minmax_element(exchange.ops.begin(), exchange.ops.end());
          // Compute-stream ops around it, none inside it.
          if (exchange.after >= 0) {
            EXPECT_EQ(ops[exchange.after].stream, Stream::Compute);
          }
          if (exchange.before >= 0) {
            EXPECT_EQ(ops[exchange.before].stream, Stream::Compute);
            EXPECT_GT(exchange.before, *last);
          }
          EXPECT_LT(exchange.after, *first);
          for (std::int32_t i = exchange.after + 1; i < *last; ++i) EXPECT_NE(ops[i].stream, Stream::Compute);
          for (std::int32_t op : exchange.ops) {
            EXPECT_EQ(ops[op].stream, Stream::Pipeline);
            listed.insert(op);
          }
          // Only DeepSpeed's TrainSchedule reorders an exchange.
          if (program.exchange_issue != ExchangeIssue::Serialized) {
            EXPECT_TRUE(std::is_sorted(exchange.ops.begin(), exchange.ops.end()));
          }
        }
        std::multiset<std::int32_t> pipeline_ops;
        for (std::int32_t i = 0; i < static_cast<std::int32_t>(ops.size()); ++i) {
          if (ops[i].stream == Stream::Pipeline) pipeline_ops.insert(i);
        }
        EXPECT_EQ(listed, pipeline_ops) << to_string(schedule) << " stage " << stage;
      }
    }
  }
}

TEST(P2PTagKey, DistinctTagsGiveDistinctKeysUnderTheMpiTagLimit) {
  std::set<std::uint64_t> keys;
  int tags = 0;
  for (int micro_batch : {0, 1, 2, 1000, kP2PTagMicroBatches - 1}) {
    for (int virtual_stage : {0, 1, 35, 279, kP2PTagVirtualStages - 1}) {
      for (Phase phase : {Phase::Forward, Phase::Backward}) {
        const std::uint64_t key = p2p_tag_key({micro_batch, virtual_stage, phase});
        EXPECT_LT(key, kP2PTagKeys);
        keys.insert(key);
        ++tags;
      }
    }
  }
  EXPECT_EQ(keys.size(), static_cast<std::size_t>(tags));
  EXPECT_EQ(p2p_tag_key({kP2PTagMicroBatches - 1, kP2PTagVirtualStages - 1, Phase::Backward}), kP2PTagKeys - 1);
  // Every tag of a Program is distinct per (sender, receiver) pair, hence every key.
  const Program program = build_program(make_scenario(8, 256, 8, 128, 1000, 1, 4, 1, 1, 16), Granularity::Layer);
  for (int stage = 0; stage < program.stages(); ++stage) {
    std::set<std::pair<int, std::uint64_t>> sent;
    for (const Op& op : program.stage_ops[stage]) {
      if (op.kind == OpKind::Send) {
        EXPECT_TRUE(sent.insert({op.peer_stage, p2p_tag_key(p2p_tag(op))}).second);
      }
    }
  }
}

TEST(P2PTagKey, ATagOutOfRangeIsRefused) {
  EXPECT_THROW(p2p_tag_key({kP2PTagMicroBatches, 0, Phase::Forward}), std::out_of_range);
  EXPECT_THROW(p2p_tag_key({-1, 0, Phase::Forward}), std::out_of_range);
  EXPECT_THROW(p2p_tag_key({0, kP2PTagVirtualStages, Phase::Backward}), std::out_of_range);
  EXPECT_THROW(p2p_tag_key({0, -1, Phase::Backward}), std::out_of_range);
  EXPECT_THROW(p2p_tag_key({0, 0, Phase::Recompute}), std::out_of_range);
  // A scenario whose messages could not be tagged is refused before a Program is built, naming the section.
  Scenario s = make_scenario(4, 64, 4, 32, 300, 1, 2, 1, 1, kP2PTagMicroBatches);
  try {
    build_program(s, Granularity::Layer);
    FAIL() << "no error";
  } catch (const ScenarioError& error) {
    EXPECT_NE(std::string(error.what()).find("parallel"), std::string::npos) << error.what();
  }
}

TEST(TpOverlap, ColumnParallelGemmsHideTheirBackwardCollectives) {
  Scenario s = make_scenario(2, 256, 8, 128, 1000, 2, 1, 1, 1, 4);
  s.parallel.sequence_parallel = true;
  std::vector<Op> collectives;
  for (const Phase phase : {Phase::Forward, Phase::Backward}) {
    for (const Op& op : testing::first_layer_ops(s, phase)) {
      if (op.kind == OpKind::Collective) collectives.push_back(op);
    }
  }
  const auto hidden = [&](const Scenario& scenario) {
    std::multiset<std::pair<ComputeKind, HiddenUnder>> out;
    for (const Op& op : collectives) {
      if (tp_overlap(scenario, op) != HiddenUnder::Nothing) out.insert({op.what, tp_overlap(scenario, op)});
    }
    return out;
  };
  EXPECT_TRUE(hidden(s).empty());  // framework.tp_comm_overlap off
  s.framework.tp_comm_overlap = true;
  // Backward: each column-parallel GEMM's input-gradient reduce-scatter under its weight gradient, the re-gather of
  // its input under its input gradient; nothing of the row-parallel GEMMs or of the forward.
  const std::multiset<std::pair<ComputeKind, HiddenUnder>> expected{
      {ComputeKind::QkvProjection, HiddenUnder::WeightGradient},
      {ComputeKind::QkvProjection, HiddenUnder::InputGradient},
      {ComputeKind::MlpUp, HiddenUnder::WeightGradient},
      {ComputeKind::MlpUp, HiddenUnder::InputGradient}};
  EXPECT_EQ(hidden(s), expected);
}

}  // namespace
}  // namespace twin::model
