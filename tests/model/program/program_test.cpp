#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>

#include "model/program/estimates.hpp"
#include "model/program/program.hpp"
#include "test_scenarios.hpp"

namespace twin::model {
namespace {

using testing::make_scenario;

struct Shape {
  const char* name;
  Scenario scenario;
};

Scenario with(Scenario s, ScheduleKind schedule, int chunks, bool sequence_parallel, int zero, bool overlap) {
  s.parallel.schedule = schedule;
  s.parallel.virtual_stages = chunks;
  s.parallel.sequence_parallel = sequence_parallel;
  s.parallel.zero_stage = zero;
  s.parallel.dp_overlap = overlap;
  return s;
}

// MT-NLG and five other shapes and plans (every schedule, SP, ZeRO-1, DP overlap, TP and PP of 1 and more).
std::vector<Shape> shapes() {
  const std::string dir = testing::source_dir() + "/scenarios/";
  return {
      {"mtnlg_530b", load_scenario(dir + "mtnlg-530b.toml")},
      {"gpt3_175b", load_scenario(dir + "gpt3-175b.toml")},
      {"gpt_1_3b", make_scenario(24, 2048, 16, 2048, 50257, 2, 2, 4, 2, 64)},
      {"megatron_8_3b_interleaved",
       with(make_scenario(72, 3072, 32, 1024, 50257, 8, 3, 2, 4, 96), ScheduleKind::Interleaved, 2, false, 0, true)},
      {"tiny_sp_zero", with(make_scenario(8, 128, 4, 64, 256, 2, 2, 2, 2, 16), ScheduleKind::OneFOneB, 1, true, 1, true)},
      {"gpt_39b_gpipe", with(make_scenario(48, 8192, 64, 2048, 51200, 8, 4, 2, 1, 64), ScheduleKind::GPipe, 1, false, 1,
                             false)},
      {"single_rank", make_scenario(4, 64, 4, 32, 300, 1, 1, 1, 2, 6)},
  };
}

Scenario recompute(Scenario s, Recompute mode) {
  s.parallel.recompute = mode;
  return s;
}

double narayanan_closed_form(const Scenario& s, bool with_recompute) {
  const double B = s.parallel.global_batch, seq = s.model.seq_len, l = s.model.layers, h = s.model.hidden;
  const double V = s.padded_vocab();
  return with_recompute ? 96 * B * seq * l * h * h * (1 + seq / (6 * h) + V / (16 * l * h))
                        : 72 * B * seq * l * h * h * (1 + seq / (6 * h) + V / (12 * l * h));
}

void PrintTo(const Shape& shape, std::ostream* out) { *out << shape.name; }

class EveryShape : public ::testing::TestWithParam<Shape> {};

TEST_P(EveryShape, GemmFlopsMatchNarayanan) {
  const Scenario s = GetParam().scenario;
  const double full = build_program(recompute(s, Recompute::Full), Granularity::Layer).total_flops();
  const double none = build_program(recompute(s, Recompute::None), Granularity::Layer).total_flops();
  EXPECT_NEAR(full / narayanan_closed_form(s, true), 1.0, 1e-3);
  EXPECT_NEAR(none / narayanan_closed_form(s, false), 1.0, 1e-3);
}

TEST_P(EveryShape, OpCountEstimateIsCloseToTheBuiltProgram) {
  // The estimate guards memory before a build (cli: build_program_within_memory); it must track the real count.
  for (const Granularity granularity : {Granularity::Op, Granularity::Layer}) {
    const Scenario s = GetParam().scenario;
    const Program program = build_program(s, granularity);
    double built = 0;
    for (const auto& ops : program.stage_ops) built += static_cast<double>(ops.size());
    const double estimate = estimated_stage_ops(s, granularity);
    EXPECT_GT(estimate, 0.75 * built) << to_string(granularity);
    EXPECT_LT(estimate, 1.6 * built) << to_string(granularity);
  }
}

TEST_P(EveryShape, SelectiveRecomputeAddsTheAttentionCoreForwardOnce) {
  const Scenario s = GetParam().scenario;
  const double none = build_program(recompute(s, Recompute::None), Granularity::Layer).total_flops();
  const double selective = build_program(recompute(s, Recompute::Selective), Granularity::Layer).total_flops();
  const double attention_forward = 4.0 * s.parallel.global_batch * s.model.seq_len * s.model.seq_len *
                                   s.model.hidden * s.model.layers;  // Q K^T and P V: 2 * 2 b s^2 h per layer
  EXPECT_NEAR((selective - none) / attention_forward, 1.0, 1e-9);
}

struct Totals {
  double flops = 0, compute_bytes = 0, collective_bytes = 0, p2p_bytes = 0;
  std::map<std::tuple<int, int, int>, int> collectives;  // (kind, group, payload) -> count
};

Totals totals(const Program& program) {
  Totals t;
  for (const auto& ops : program.stage_ops) {
    for (const auto& op : ops) {
      if (op.kind == OpKind::Compute) {
        t.flops += op.flops;
        t.compute_bytes += op.bytes;
      } else if (op.kind == OpKind::Collective) {
        t.collective_bytes += op.bytes;
        ++t.collectives[{static_cast<int>(op.collective), static_cast<int>(op.group), static_cast<int>(op.payload)}];
      } else {
        t.p2p_bytes += op.bytes;
      }
    }
  }
  return t;
}

TEST_P(EveryShape, OpAndLayerGranularityCarryTheSameWork) {
  const Scenario s = GetParam().scenario;
  for (auto mode : {Recompute::None, Recompute::Selective, Recompute::Full}) {
    const Totals op = totals(build_program(recompute(s, mode), Granularity::Op));
    const Totals layer = totals(build_program(recompute(s, mode), Granularity::Layer));
    EXPECT_NEAR(op.flops / layer.flops, 1.0, 1e-12);
    EXPECT_NEAR(op.compute_bytes / layer.compute_bytes, 1.0, 1e-12);
    EXPECT_DOUBLE_EQ(op.collective_bytes, layer.collective_bytes);
    EXPECT_DOUBLE_EQ(op.p2p_bytes, layer.p2p_bytes);
    EXPECT_EQ(op.collectives, layer.collectives);
  }
}

TEST_P(EveryShape, EverySendHasExactlyOneMatchingRecvOfTheSameSize) {
  const Program program = build_program(GetParam().scenario, Granularity::Layer);
  // (from stage, to stage, micro-batch, sender virtual stage, phase) -> bytes
  using Key = std::tuple<int, int, int, int, int>;
  std::map<Key, double> sends, recvs;
  for (int stage = 0; stage < program.stages(); ++stage) {
    for (const auto& op : program.stage_ops[stage]) {
      if (op.kind != OpKind::Send && op.kind != OpKind::Recv) continue;
      EXPECT_NE(op.peer_stage, stage);
      const bool send = op.kind == OpKind::Send;
      const Key key{send ? stage : op.peer_stage, send ? op.peer_stage : stage, op.micro_batch, op.tag_virtual_stage,
                    static_cast<int>(op.phase)};
      auto& side = send ? sends : recvs;
      EXPECT_TRUE(side.emplace(key, op.bytes).second) << "duplicate P2P tag";
    }
  }
  EXPECT_EQ(sends, recvs);
  const auto& p = GetParam().scenario.parallel;
  const std::size_t boundaries = p.pp * p.virtual_stages - 1;
  EXPECT_EQ(sends.size(), 2 * boundaries * p.micro_batches());  // activation forward, gradient backward
}

TEST_P(EveryShape, DependenciesPointBackwardsAndTheStepEndsTheIteration) {
  const Program program = build_program(GetParam().scenario, Granularity::Layer);
  for (const auto& ops : program.stage_ops) {
    int optimizer_steps = 0;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      for (int dep : ops[i].deps) {
        EXPECT_GE(dep, 0);
        EXPECT_LT(static_cast<std::size_t>(dep), i);
      }
      if (ops[i].kind == OpKind::Compute && ops[i].what == ComputeKind::OptimizerStep) ++optimizer_steps;
    }
    EXPECT_EQ(optimizer_steps, 1);
  }
}

TEST_P(EveryShape, SendsWaitOnlyForTheTensorTheySend) {
  // Gradient synchronisation (DP buckets, sequence-parallel layernorm sums) must never delay a pipeline send.
  Scenario s = GetParam().scenario;
  s.parallel.dp_overlap = true;
  const Program program = build_program(s, Granularity::Layer);
  for (const auto& ops : program.stage_ops) {
    for (const auto& op : ops) {
      if (op.kind != OpKind::Send) continue;
      ASSERT_EQ(op.deps.size(), 1u);
      const Op& producer = ops[op.deps[0]];
      const bool layer_work = producer.kind == OpKind::Compute ||
                              (producer.kind == OpKind::Collective && producer.group == Group::Tensor &&
                               producer.payload != Payload::LayerNormGrads);
      EXPECT_TRUE(layer_work) << to_string(producer.kind) << " " << to_string(producer.payload);
      EXPECT_EQ(producer.micro_batch, op.micro_batch);
    }
  }
}

TEST(Program, TensorParallelCollectivesPerLayer) {
  Scenario s = make_scenario(2, 128, 4, 64, 256, 2, 1, 1, 1, 1);
  auto count = [](const std::vector<Op>& ops, CollectiveKind kind, Phase phase) {
    int n = 0;
    for (const auto& op : ops) n += op.kind == OpKind::Collective && op.collective == kind && op.phase == phase;
    return n;
  };
  const auto plain = layer_compute_ops(s, 0, Phase::Forward);
  EXPECT_EQ(plain.size(), 10u);  // 2 LN, 4 GEMMs, attention core, GELU, 2 residuals
  const Program program = build_program(s);
  const auto& ops = program.stage_ops[0];
  // Forward: 2 all-reduces per layer plus the embedding's; backward: 2 per layer plus the LM head's.
  EXPECT_EQ(count(ops, CollectiveKind::AllReduce, Phase::Forward), 2 * 2 + 1);
  EXPECT_EQ(count(ops, CollectiveKind::AllReduce, Phase::Backward), 2 * 2 + 1 + 1);  // + the gradient norm
  s.parallel.sequence_parallel = true;
  const Program sp_program = build_program(s);
  const auto& sp = sp_program.stage_ops[0];
  EXPECT_EQ(count(sp, CollectiveKind::AllReduce, Phase::Forward), 0);
  EXPECT_EQ(count(sp, CollectiveKind::ReduceScatter, Phase::Forward), 2 * 2 + 1);
  EXPECT_EQ(count(sp, CollectiveKind::AllGather, Phase::Forward), 2 * 2 + 1 + 1);  // + LM head input, CE stats
}

TEST(Program, NoTensorCollectivesWithoutTensorParallelism) {
  const Program program = build_program(make_scenario(4, 64, 4, 32, 256, 1, 2, 1, 1, 4));
  for (const auto& ops : program.stage_ops) {
    for (const auto& op : ops) {
      if (op.kind == OpKind::Collective) {
        EXPECT_NE(op.group, Group::Tensor) << to_string(op.payload);
      }
    }
  }
}

TEST(Program, DataParallelReductionFollowsZeroAndOverlap) {
  Scenario s = make_scenario(4, 64, 4, 32, 256, 1, 2, 2, 1, 4);
  auto dp_ops = [](const Program& program, int stage) {
    std::vector<Op> out;
    for (const auto& op : program.stage_ops[stage]) {
      if (op.kind == OpKind::Collective && op.group == Group::Data) out.push_back(op);
    }
    return out;
  };
  const auto plain = dp_ops(build_program(s), 0);
  ASSERT_EQ(plain.size(), 3u);  // two layers and the embedding
  for (const auto& op : plain) {
    EXPECT_EQ(op.collective, CollectiveKind::AllReduce);
    EXPECT_EQ(op.stream, Stream::Compute);
  }
  s.parallel.zero_stage = 1;
  s.parallel.dp_overlap = true;
  const auto zero = dp_ops(build_program(s), 0);
  ASSERT_EQ(zero.size(), 6u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(zero[i].collective, CollectiveKind::ReduceScatter);
    EXPECT_EQ(zero[i].stream, Stream::DataParallel);
    EXPECT_EQ(zero[i + 3].collective, CollectiveKind::AllGather);
    EXPECT_EQ(zero[i + 3].payload, Payload::Parameters);
  }
  EXPECT_DOUBLE_EQ(zero[0].bytes, 4 * layer_parameters_per_gpu(s));  // fp32 gradients
  EXPECT_TRUE(dp_ops(build_program(make_scenario(4, 64, 4, 32, 256, 1, 2, 1, 1, 4)), 0).empty());
  // DeepSpeed's ZeRO-1 (v0.5, stage2.py with contiguous gradients off) all-reduces the whole gradient, then gathers
  // the updated partitions.
  s.framework.name = Framework::DeepSpeed;
  const auto deepspeed = dp_ops(build_program(s), 0);
  ASSERT_EQ(deepspeed.size(), 6u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(deepspeed[i].collective, CollectiveKind::AllReduce);
    EXPECT_EQ(deepspeed[i + 3].collective, CollectiveKind::AllGather);
  }
  // ... in the model dtype (allreduce_always_fp32 is off by default), where Megatron-LM reduces bf16 in fp32.
  ASSERT_EQ(s.model.dtype, DType::BF16);
  EXPECT_DOUBLE_EQ(deepspeed[0].bytes, 2 * layer_parameters_per_gpu(s));
}

TEST(Program, UnevenStagesRunTheirOwnLayersAndHoldTheirOwnMemory) {
  Scenario s = make_scenario(8, 64, 4, 32, 256, 1, 4, 1, 1, 4);
  s.parallel.first_stage_layers = 1;
  s.parallel.last_stage_layers = 1;
  const Program program = build_program(s, Granularity::Layer);
  const std::vector<std::set<int>> expected{{0}, {1, 2, 3}, {4, 5, 6}, {7}};
  for (int stage = 0; stage < 4; ++stage) {
    std::set<int> layers;
    for (const Op& op : program.stage_ops[stage]) {
      if (op.kind == OpKind::Compute && op.what == ComputeKind::TransformerLayer) layers.insert(op.layer);
    }
    EXPECT_EQ(layers, expected[stage]) << "stage " << stage;
  }
  // Parameters and stashed activations follow the layers: a middle stage holds three layers' worth.
  EXPECT_DOUBLE_EQ(parameters_per_gpu(s, 1), 3 * layer_parameters_per_gpu(s));
  const MemoryEstimate memory = estimate_memory(s);
  EXPECT_LT(memory.stages[0].parameters, memory.stages[1].parameters);
  Scenario even = s;
  even.parallel.first_stage_layers = even.parallel.last_stage_layers = 0;
  EXPECT_DOUBLE_EQ(parameters_per_gpu(even, 1), 2 * layer_parameters_per_gpu(even));
  EXPECT_GT(estimate_memory(s).stages[1].activations_bytes, estimate_memory(even).stages[1].activations_bytes);
}

TEST(Program, BlockRecomputeRunsTheFirstLayersOfEachChunkAgain) {
  // 8 layers on 2 stages x 2 chunks (2 layers per chunk: 0-1 and 4-5 on stage 0, 2-3 and 6-7 on stage 1); Megatron's
  // --recompute-method block --recompute-num-layers 1 recomputes layers 0, 2, 4 and 6, once per micro-batch each.
  Scenario s = make_scenario(8, 64, 4, 32, 256, 1, 2, 1, 1, 4);
  s.parallel.schedule = ScheduleKind::Interleaved;
  s.parallel.virtual_stages = 2;
  s.parallel.recompute = Recompute::Full;
  s.parallel.recompute_num_layers = 1;
  ASSERT_TRUE(validation_problems(s).empty());
  const Program program = build_program(s, Granularity::Layer);
  std::map<int, int> recomputes;  // layer -> recompute ops
  for (const auto& ops : program.stage_ops) {
    for (const Op& op : ops) {
      if (op.kind == OpKind::Compute && op.what == ComputeKind::TransformerLayer && op.phase == Phase::Recompute) {
        ++recomputes[op.layer];
      }
    }
  }
  EXPECT_EQ(recomputes, (std::map<int, int>{{0, 4}, {2, 4}, {4, 4}, {6, 4}}));
  EXPECT_EQ(s.recompute_of_layer(1), Recompute::None);
  EXPECT_EQ(s.recompute_of_layer(6), Recompute::Full);
  // Time and memory between no and full recompute; Narayanan's count recomputes half the layers.
  Scenario none = s, full = s;
  none.parallel.recompute = Recompute::None;
  none.parallel.recompute_num_layers = 0;
  full.parallel.recompute_num_layers = 0;
  const double activations = estimate_memory(s).stages[0].activations_bytes;
  EXPECT_GT(activations, estimate_memory(full).stages[0].activations_bytes);
  EXPECT_LT(activations, estimate_memory(none).stages[0].activations_bytes);
  EXPECT_DOUBLE_EQ(reported_flops_per_iteration(s),
                   (model_flops_per_iteration(s, false) + model_flops_per_iteration(s, true)) / 2);
  // A number at or above a chunk's layers recomputes them all, as Megatron does.
  Scenario all = s;
  all.parallel.recompute_num_layers = 5;
  EXPECT_EQ(estimate_memory(all).stages[0].activations_bytes, estimate_memory(full).stages[0].activations_bytes);
  EXPECT_DOUBLE_EQ(reported_flops_per_iteration(all), model_flops_per_iteration(s, true));
}

TEST(Program, AlibiBiasesTheForwardScoresAndLearnsNoPositions) {
  // BigScience's ALiBi (baddbmm with beta != 0 on the [b np, 1, s] bias): the bias is expanded into the scores and
  // read back by Q K^T, in every forward (and recomputed forward) of the attention core, never in its backward.
  Scenario learned = make_scenario(4, 64, 4, 32, 256, 2, 2, 2, 2, 16);
  learned.parallel.recompute = Recompute::Full;
  Scenario alibi = learned;
  alibi.model.position_embedding = PositionEmbedding::Alibi;
  ASSERT_TRUE(validation_problems(alibi).empty());
  auto attention_bytes = [](const Scenario& s, Phase phase) {
    for (const Op& op : layer_compute_ops(s, 0, phase)) {
      if (op.what == ComputeKind::AttentionCore) return op.bytes;
    }
    return -1.0;
  };
  const double scores = 2.0 * (4 / 2) * 32 * 32;  // micro-batch x local heads x seq^2
  const double e = dtype_bytes(learned.model.dtype);
  EXPECT_DOUBLE_EQ(attention_bytes(alibi, Phase::Forward) - attention_bytes(learned, Phase::Forward), 2 * scores * e);
  EXPECT_DOUBLE_EQ(attention_bytes(alibi, Phase::Recompute) - attention_bytes(learned, Phase::Recompute),
                   2 * scores * e);
  EXPECT_DOUBLE_EQ(attention_bytes(alibi, Phase::Backward), attention_bytes(learned, Phase::Backward));
  // No position embedding: seq x hidden fewer parameters on the first stage, in the count, the memory estimate and
  // the first stage's DP gradient reduction (bf16 reduced in fp32 by Megatron-LM).
  EXPECT_DOUBLE_EQ(parameters_per_gpu(learned, 0) - parameters_per_gpu(alibi, 0), 32 * 64);
  EXPECT_DOUBLE_EQ(parameters_per_gpu(learned, 1), parameters_per_gpu(alibi, 1));
  EXPECT_DOUBLE_EQ(count_parameters(learned).total - count_parameters(alibi).total, 32 * 64);
  auto embedding_reduction_bytes = [](const Scenario& s) {
    const Program program = build_program(s, Granularity::Layer);
    for (const Op& op : program.stage_ops[0]) {
      if (op.kind == OpKind::Collective && op.payload == Payload::Gradients && op.what == ComputeKind::Embedding) {
        return op.bytes;
      }
    }
    return -1.0;
  };
  EXPECT_DOUBLE_EQ(embedding_reduction_bytes(learned) - embedding_reduction_bytes(alibi), 4.0 * 32 * 64);
}

TEST(Program, TiedEmbeddingGradientsMeetBetweenFirstAndLastStage) {
  const Program program = build_program(make_scenario(4, 64, 4, 32, 256, 1, 4, 1, 1, 4));
  for (int stage = 0; stage < 4; ++stage) {
    int embedding_reductions = 0;
    for (const auto& op : program.stage_ops[stage]) {
      embedding_reductions += op.kind == OpKind::Collective && op.group == Group::Embedding;
    }
    EXPECT_EQ(embedding_reductions, stage == 0 || stage == 3 ? 1 : 0) << "stage " << stage;
  }
}

TEST(Program, RankLayoutIsMegatronsOrder) {
  const RankLayout layout(8, 35, 8);
  EXPECT_EQ(layout.rank_of({1, 2, 3}), 3 + 8 * (1 + 8 * 2));
  EXPECT_EQ(layout.coord_of(layout.rank_of({5, 34, 7})), (RankCoord{5, 34, 7}));
  const auto tensor = layout.group_members(Group::Tensor, 19);
  EXPECT_EQ(tensor, (std::vector<int>{16, 17, 18, 19, 20, 21, 22, 23}));  // one node
  const auto data = layout.group_members(Group::Data, 3);
  EXPECT_EQ(data.front(), 3);
  EXPECT_EQ(data[1], 11);  // the next node
  EXPECT_EQ(layout.group_members(Group::Embedding, 3), (std::vector<int>{3, 3 + 8 * 8 * 34}));
}

TEST(Ranks, IndexInIsTheRanksPlaceInItsGroup) {
  EXPECT_EQ(index_in({3, 11, 19}, 11), 1);
  EXPECT_EQ(index_in({3, 11, 19}, 4), -1);
  EXPECT_EQ(index_in({}, 0), -1);
  // Every rank of every group of a TP 2 x PP 3 x DP 4 layout sits where its coordinates say.
  const RankLayout layout(2, 3, 4);
  for (int rank = 0; rank < layout.world_size(); ++rank) {
    for (Group group : {Group::Tensor, Group::Data, Group::Embedding, Group::World}) {
      const RankCoord coord = layout.coord_of(rank);
      if (group == Group::Embedding && coord.pp != 0 && coord.pp != layout.pp() - 1) continue;
      EXPECT_EQ(index_in(layout.group_members(group, rank), rank), layout.index_in_group(group, rank))
          << to_string(group) << " rank " << rank;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, EveryShape, ::testing::ValuesIn(shapes()),
                         [](const ::testing::TestParamInfo<Shape>& shape_info) { return std::string(shape_info.param.name); });

}  // namespace
}  // namespace twin::model
