// What Megatron-Core pays per MoE layer and micro-batch beyond the tokens' FLOPs and bytes: the all-to-all
// dispatcher's host synchronization on the split sizes (model/ops/moe_host_sync.hpp), once per forward and recompute of
// a layer, and one GEMM launch per local expert in the grouped GEMMs (Transformer Engine's GroupedLinear). Dense
// Programs carry neither.
#include <gtest/gtest.h>

#include <tuple>
#include <vector>

#include "model/ops/moe_host_sync.hpp"
#include "model/program/program.hpp"
#include "test_scenarios.hpp"

namespace twin::model {
namespace {

using testing::make_scenario;

Scenario moe(int experts, int top_k, int ep, int etp = 1) {
  Scenario s = make_scenario(4, 256, 8, 128, 1000, 1, 2, 8, 1, 16);
  s.model.experts = experts;
  s.model.top_k = top_k;
  s.parallel.ep = ep;
  s.parallel.etp = etp;
  return s;
}

int count_of(const std::vector<Op>& ops, ComputeKind what, Phase phase) {
  int count = 0;
  for (const Op& op : ops) count += op.kind == OpKind::Compute && op.what == what && op.phase == phase;
  return count;
}

// The index of the first op after `from` that is `what` (a compute op) or an all-to-all, -1 if none.
int next_index(const std::vector<Op>& ops, std::size_t from, bool all_to_all, ComputeKind what) {
  for (std::size_t i = from; i < ops.size(); ++i) {
    const Op& op = ops[i];
    if (all_to_all && op.kind == OpKind::Collective && op.collective == CollectiveKind::AllToAll) {
      return static_cast<int>(i);
    }
    if (!all_to_all && op.kind == OpKind::Compute && op.what == what) return static_cast<int>(i);
  }
  return -1;
}

// One sync per MoE layer, micro-batch and forward (or recompute): between the permutation and the dispatch, never in
// the backward; its cost is the device-to-host copy's launch and the first launch after the wait, its bytes the
// dispatcher's int64 counts.
TEST(MoeCosts, OneSplitsSyncPerMoeLayerForwardBeforeTheDispatch) {
  for (const bool recompute : {false, true}) {
    Scenario s = moe(16, 2, 4, 2);
    s.model.dense_layers = 1;
    if (recompute) s.parallel.recompute = Recompute::Full;
    const Program program = build_program(s);
    const auto& ops = program.stage_ops[0];  // layers 0 (dense) and 1 (MoE) of the 4, over 2 stages
    const int micro_batches = static_cast<int>(s.parallel.micro_batches());
    EXPECT_EQ(count_of(ops, ComputeKind::ExpertSplitsSync, Phase::Forward), micro_batches);
    EXPECT_EQ(count_of(ops, ComputeKind::ExpertSplitsSync, Phase::Recompute), recompute ? micro_batches : 0);
    EXPECT_EQ(count_of(ops, ComputeKind::ExpertSplitsSync, Phase::Backward), 0);
    const int permute = next_index(ops, 0, false, ComputeKind::ExpertPermute);
    ASSERT_GE(permute, 0);
    EXPECT_EQ(ops[permute + 1].what, ComputeKind::ExpertSplitsSync);
    EXPECT_EQ(next_index(ops, permute, true, ComputeKind::Router), permute + 2);  // the dispatch right after it
    const Op& sync = ops[permute + 1];
    ASSERT_TRUE(sync.breakdown);
    ASSERT_EQ(sync.breakdown->kernels.size(), 1u);
    EXPECT_EQ(sync.breakdown->kernels[0].kind, KernelKind::Stream);
    // ep 4: tokens_per_expert, input_splits, output_splits and output_splits_tp copied to the host, then the first
    // kernel after the wait (moe_host_sync.hpp)
    EXPECT_EQ(sync.breakdown->kernels[0].launches, 5);
    EXPECT_EQ(expert_splits_sync_launches(s), 5);
    const double local = 16.0 / 4, counts = local + 2 * 4 + 2 + 2 * 4 * local;
    EXPECT_DOUBLE_EQ(sync.bytes, 8 * counts);
    EXPECT_DOUBLE_EQ(sync.flops, 0);
  }
}

// A capacity factor makes the permuted size itself data: the host waits before the permutation.
TEST(MoeCosts, ACapacityFactorSyncsBeforeThePermutation) {
  Scenario s = moe(8, 2, 4);
  s.model.capacity_factor = 1.25;
  const Program program = build_program(s);
  const auto& ops = program.stage_ops[0];
  const int sync = next_index(ops, 0, false, ComputeKind::ExpertSplitsSync);
  ASSERT_GE(sync, 0);
  EXPECT_EQ(ops[sync + 1].what, ComputeKind::ExpertPermute);
}

// Without expert parallelism the dispatcher still needs the counts on the host (its "before_finish" point).
TEST(MoeCosts, EpOneStillSyncs) {
  const Scenario s = moe(8, 2, 1);
  EXPECT_EQ(count_of(build_program(s).stage_ops[0], ComputeKind::ExpertSplitsSync, Phase::Forward),
            static_cast<int>(s.parallel.micro_batches() * 2));
}

int count_gathers(const std::vector<Op>& ops, Phase phase) {
  int count = 0;
  for (const Op& op : ops) {
    count += op.kind == OpKind::Collective && op.payload == Payload::ExpertCounts &&
             op.collective == CollectiveKind::AllGather && op.phase == phase;
  }
  return count;
}

// preprocess()'s all-gather of the counts over the expert-TP x EP group, before the sync, once per MoE layer forward:
// E int64 counts from each of its ep x etp members; none without expert or expert-tensor parallelism.
TEST(MoeCosts, TheCountsAreGatheredOverTheExpertGridBeforeTheSync) {
  const Scenario s = moe(16, 2, 4, 2);
  const Program program = build_program(s);
  const auto& ops = program.stage_ops[0];
  const int micro_batches = static_cast<int>(s.parallel.micro_batches());
  EXPECT_EQ(count_gathers(ops, Phase::Forward), 2 * micro_batches);  // the stage's 2 MoE layers
  EXPECT_EQ(count_gathers(ops, Phase::Backward), 0);
  int gather = -1;
  for (std::size_t i = 0; i < ops.size() && gather < 0; ++i) {
    if (ops[i].kind == OpKind::Collective && ops[i].payload == Payload::ExpertCounts) gather = static_cast<int>(i);
  }
  ASSERT_GE(gather, 0);
  EXPECT_EQ(ops[gather].group, Group::ExpertTensorAndExpert);
  EXPECT_DOUBLE_EQ(ops[gather].bytes, 8.0 * 16 * 4 * 2);
  EXPECT_LT(gather, next_index(ops, 0, false, ComputeKind::ExpertSplitsSync));
  const Program alone = build_program(moe(8, 2, 1));
  EXPECT_EQ(count_gathers(alone.stage_ops[0], Phase::Forward), 0);
}

// The GEMM launches of a grouped expert GEMM: one per local expert (forward), two per local expert backward (input
// and weight gradients), in 16-bit and in FP8.
TEST(MoeCosts, GroupedGemmsLaunchOneGemmPerLocalExpert) {
  for (const Fp8Format fp8 : {Fp8Format::None, Fp8Format::Hybrid}) {
    Scenario s = moe(16, 2, 4);
    s.model.fp8 = fp8;
    s.framework.transformer_engine = fp8 != Fp8Format::None;  // FP8 runs through TE's modules
    s.cluster.node = NodeKind::DgxH100;
    const Program program = build_program(s);
    const auto& ops = program.stage_ops[0];
    int seen = 0;
    for (const Op& op : ops) {
      if (op.kind != OpKind::Compute || (op.what != ComputeKind::ExpertUp && op.what != ComputeKind::ExpertDown)) {
        continue;
      }
      int gemm_launches = 0;
      for (const Kernel& kernel : op.breakdown->kernels) {
        if (kernel.kind == KernelKind::Gemm || kernel.kind == KernelKind::Fp8Gemm) gemm_launches += kernel.launches;
      }
      EXPECT_EQ(gemm_launches, (op.phase == Phase::Backward ? 2 : 1) * 4) << to_string(op.what);
      ++seen;
    }
    EXPECT_GT(seen, 0);
  }
}

// The dispatcher's copies of every expert row (model/ops/moe_ops.cpp, with_dispatcher_row_passes): with 2 local
// experts the sort into expert-major order after the dispatch and back before the combine; with FP8 also the padding
// to the GEMM's alignment and the unpadding. Each rides on its grouped GEMM's op as one streaming kernel whose bytes
// read and write every row (the up side's with its probabilities); with one local expert in 16-bit there is none.
TEST(MoeCosts, TheDispatcherSortsAndPadsEveryExpertRow) {
  const auto row_passes = [](int experts, Fp8Format fp8, ComputeKind what, Phase phase) {
    Scenario s = moe(experts, 2, 8);
    s.model.fp8 = fp8;
    s.framework.transformer_engine = fp8 != Fp8Format::None;
    s.cluster.node = NodeKind::DgxH100;
    const Program program = build_program(s);
    for (const Op& op : program.stage_ops[0]) {
      if (op.kind != OpKind::Compute || op.what != what || op.phase != phase) continue;
      const Kernel& last = op.breakdown->kernels.back();
      const double rows = static_cast<double>(op.gemm.m * op.gemm.count), e = 2, h = 256;
      return std::make_tuple(last.kind == KernelKind::Stream ? last.launches : 0, last.bytes, rows * h * e,
                             rows * e);
    }
    ADD_FAILURE() << "no " << to_string(what);
    return std::make_tuple(0, 0.0, 0.0, 0.0);
  };
  // 16-bit, 16 experts over ep 8: the sort (a map kernel and the copy) and the unsort.
  auto [launches, bytes, rows, probs] = row_passes(16, Fp8Format::None, ComputeKind::ExpertUp, Phase::Forward);
  EXPECT_EQ(launches, 2);
  EXPECT_DOUBLE_EQ(bytes, 2 * (rows + probs));
  std::tie(launches, bytes, rows, probs) = row_passes(16, Fp8Format::None, ComputeKind::ExpertDown, Phase::Forward);
  EXPECT_EQ(launches, 2);
  EXPECT_DOUBLE_EQ(bytes, 2 * rows);
  std::tie(launches, bytes, rows, probs) = row_passes(16, Fp8Format::None, ComputeKind::ExpertUp, Phase::Backward);
  EXPECT_EQ(launches, 1);  // the sort's backward reuses its map
  // FP8: the padding of the rows and their probabilities too, and the output's unpadding.
  std::tie(launches, bytes, rows, probs) = row_passes(16, Fp8Format::Hybrid, ComputeKind::ExpertUp, Phase::Forward);
  EXPECT_EQ(launches, 4);
  EXPECT_DOUBLE_EQ(bytes, 4 * (rows + probs));
  std::tie(launches, bytes, rows, probs) = row_passes(16, Fp8Format::Hybrid, ComputeKind::ExpertDown, Phase::Forward);
  EXPECT_EQ(launches, 3);
  EXPECT_DOUBLE_EQ(bytes, 4 * rows);
  // One local expert (8 over ep 8) in 16-bit: nothing to sort or pad, the grouped GEMM's op ends with its own kernels.
  std::tie(launches, bytes, rows, probs) = row_passes(8, Fp8Format::None, ComputeKind::ExpertUp, Phase::Forward);
  EXPECT_EQ(launches, 0);
  std::tie(launches, bytes, rows, probs) = row_passes(8, Fp8Format::Hybrid, ComputeKind::ExpertUp, Phase::Forward);
  EXPECT_EQ(launches, 2);  // FP8 still pads
  EXPECT_DOUBLE_EQ(bytes, 2 * (rows + probs));
}

// A dense Program has no sync and its GEMMs launch once (forward) or twice (backward).
TEST(MoeCosts, DenseProgramsCarryNeither) {
  const Scenario dense = make_scenario(4, 256, 8, 128, 1000, 2, 2, 2, 1, 8);
  const Program program = build_program(dense);
  for (const auto& ops : program.stage_ops) {
    for (const Op& op : ops) {
      EXPECT_NE(op.what, ComputeKind::ExpertSplitsSync);
      if (op.kind != OpKind::Compute || !op.breakdown) continue;
      for (const Kernel& kernel : op.breakdown->kernels) {
        if (kernel.kind != KernelKind::Gemm) continue;
        EXPECT_EQ(kernel.launches, op.phase == Phase::Backward ? 2 : 1);
      }
    }
  }
}

}  // namespace
}  // namespace twin::model
