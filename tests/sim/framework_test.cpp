// The accuracy refinements (docs/accuracy.md): GEMM quantization, fused kernels, gradient accumulation, and the
// frameworks' pipeline exchanges and TP overlap, each through the cost model or the whole engine.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "model/ops/compute_ops.hpp"
#include "model/program/program.hpp"
#include "report/summary.hpp"
#include "sim/collectives.hpp"
#include "sim/simulate.hpp"
#include "tests/sim/support.hpp"
#include "topology/hardware.hpp"

namespace twin::sim {
namespace {

using testing::make_scenario;
using testing::Plan;

const topology::NodeSpec kDgxA100 = topology::dgx_a100();
const NcclTuning kDefaultNccl;

// The compute op `what` of layer 0 in `phase`, as the Program has it (with its kernels).
model::Op layer_op(const model::Scenario& s, model::ComputeKind what, model::Phase phase) {
  for (const model::Op& op : model::layer_compute_ops(s, 0, phase)) {
    if (op.what == what) return op;
  }
  ADD_FAILURE() << "no " << model::to_string(what) << " op";
  return {};
}

// One layer of h 4096 on 8 tensor-parallel ranks, sequence 2048.
Plan tensor_parallel_layer() {
  Plan plan;
  plan.tp = 8;
  plan.hidden = 4096;
  plan.heads = 32;
  plan.seq = 2048;
  return plan;
}

TEST(GemmModel, AQuantizedGemmCostsMoreThanItsFlopsSay) {
  const AnalyticalCostModel a100(topology::a100_sxm4_80gb());
  const double m = 2048, k = 8192;
  // 108 columns of 128: every SM busy for whole waves. One more column: 1/108 more FLOPs, a partial extra wave.
  const double full = a100.gemm_time_s(m, 128 * 108, k, 1, model::DType::FP16);
  const double ragged = a100.gemm_time_s(m, 128 * 108 + 1, k, 1, model::DType::FP16);
  EXPECT_GT(ragged / full, 1.05);
  const double rate_full = 2 * m * 128 * 108 * k / full, rate_ragged = 2 * m * (128 * 108 + 1) * k / ragged;
  EXPECT_LT(rate_ragged, 0.95 * rate_full);
}

TEST(GemmModel, ReproducesTheEraMeasurement) {
  // A100, CUDA 11.7: 230 TFLOP/s on 8192^3 fp16 (mli/transformers-benchmarks); H100 keeps the MAMF value.
  const AnalyticalCostModel a100(topology::a100_sxm4_80gb());
  EXPECT_NEAR(2 * 8192.0 * 8192 * 8192 / a100.gemm_time_s(8192, 8192, 8192, 1, model::DType::FP16), 230e12, 1e9);
  EXPECT_NEAR(a100.parameters().hbm_efficiency, 1616.0 / 2039, 1e-9);
}

TEST(KernelModel, FusedElementwiseKernelsAreFaster) {
  model::Scenario fused = make_scenario(tensor_parallel_layer());
  model::Scenario unfused = fused;
  unfused.framework.fused_kernels = false;
  const AnalyticalCostModel cost(topology::a100_sxm4_80gb());
  const double t_fused = cost.compute_time_s(fused, model::fused_layer_op(fused, 0, model::Phase::Forward));
  const double t_unfused = AnalyticalCostModel(topology::a100_sxm4_80gb())
                               .compute_time_s(unfused, model::fused_layer_op(unfused, 0, model::Phase::Forward));
  EXPECT_GT(t_unfused, 1.02 * t_fused);
}

TEST(KernelModel, GradientAccumulationFusionSavesAMemoryPass) {
  Plan plan;
  plan.tp = 8;
  plan.hidden = 8192;
  plan.heads = 64;
  plan.global_batch = 8;                           // 8 micro-batches
  model::Scenario separate = make_scenario(plan);  // bf16 Megatron: fp32 main_grad.add_() per micro-batch
  model::Scenario fusion = separate;
  fusion.framework.gradient_accumulation_fusion = true;
  const AnalyticalCostModel cost(topology::a100_sxm4_80gb());
  const double n = 4 * 8192 / 8, k = 8192;  // MLP up's weight on one TP rank
  const auto op = [](const model::Scenario& s) {
    return layer_op(s, model::ComputeKind::MlpUp, model::Phase::Backward);
  };
  const double saved = cost.compute_time_s(separate, op(separate)) - cost.compute_time_s(fusion, op(fusion));
  EXPECT_NEAR(saved, cost.memory_time_s(k * n * (2 + 8)) + cost.parameters().kernel_launch_s, 1e-12);
  // Autograd accumulation (DeepSpeed) costs nothing with a single micro-batch.
  model::Scenario single = separate;
  single.framework.name = model::Framework::DeepSpeed;
  single.parallel.global_batch = 1;
  EXPECT_DOUBLE_EQ(cost.compute_time_s(single, op(single)), cost.compute_time_s(fusion, op(fusion)));
  // DeepSpeed's BF16_Optimizer adds every micro-batch's bf16 gradient into its fp32 copy, even a single one:
  // hp_grad.add_(lp.grad.to(fp32)) reads 2 and writes 4, then reads 4 + 4 and writes 4, in two kernels.
  single.framework.bf16_optimizer = true;
  single.parallel.zero_stage = 1;
  EXPECT_NEAR(cost.compute_time_s(single, op(single)) - cost.compute_time_s(fusion, op(fusion)),
              cost.memory_time_s(k * n * (2 + 16)) + 2 * cost.parameters().kernel_launch_s, 1e-12);
}

TEST(KernelModel, LayerNormBackwardReadsItsInputsTwiceInThreeKernels) {
  // megatron/fused_kernels/layer_norm_cuda_kernel.cu: the weight-gradient partial sums read dy and x, the input
  // gradient reads them again and writes dx; the forward reads x and writes y.
  const model::Scenario s = make_scenario(tensor_parallel_layer());
  const double elements = 2048.0 * 4096, e = 2;  // micro-batch 1, bf16; no sequence parallelism: x is replicated
  const model::Op forward = layer_op(s, model::ComputeKind::LayerNormMlp, model::Phase::Forward);
  const model::Op backward = layer_op(s, model::ComputeKind::LayerNormMlp, model::Phase::Backward);
  EXPECT_DOUBLE_EQ(forward.bytes, 2 * e * elements);
  EXPECT_DOUBLE_EQ(backward.bytes, 5 * e * elements);
  ASSERT_EQ(backward.breakdown->kernels.size(), 1u);
  EXPECT_EQ(backward.breakdown->kernels[0].launches, 3);
  EXPECT_EQ(forward.breakdown->kernels[0].launches, 1);

  const AnalyticalCostModel cost(topology::a100_sxm4_80gb());
  const double launch = cost.parameters().kernel_launch_s;
  EXPECT_NEAR(cost.compute_time_s(s, backward), cost.memory_time_s(backward.bytes) + 3 * launch, 1e-12);
  EXPECT_NEAR(cost.compute_time_s(s, forward), cost.memory_time_s(forward.bytes) + launch, 1e-12);
}

TEST(KernelModel, TheQkvBiasIsAddedAndReducedInKernelsOfItsOwn) {
  // F.linear on a 3-D input (the PyTorch of 2021-2022) and Megatron 2022's
  // LinearWithGradAccumulationAndAsyncCommunication: matmul, then the bias added in its own pass over the [tokens,
  // 3h/t] output; backward sums the output gradient into the bias gradient. The other linear layers' biases are fused
  // into bias-GeLU and bias-dropout-add.
  const model::Scenario s = make_scenario(tensor_parallel_layer());
  const double tokens = 2048, h = 4096, width = 3 * h / 8, e = 2;
  const double operands = e * (tokens * h + h * width + tokens * width);
  model::Op forward, backward, mlp_up;
  for (const model::Op& op : model::layer_compute_ops(s, 0, model::Phase::Forward)) {
    if (op.what == model::ComputeKind::QkvProjection) forward = op;
    if (op.what == model::ComputeKind::MlpUp) mlp_up = op;
  }
  for (const model::Op& op : model::layer_compute_ops(s, 0, model::Phase::Backward)) {
    if (op.what == model::ComputeKind::QkvProjection) backward = op;
  }
  EXPECT_DOUBLE_EQ(forward.bytes, operands + 2 * e * tokens * width);                     // read and write the output
  EXPECT_DOUBLE_EQ(mlp_up.bytes, e * (tokens * h + h * 4 * h / 8 + tokens * 4 * h / 8));  // bias in bias-GeLU
  // Backward: the two gradient GEMMs, Megatron's fp32 main_grad.add_() of the weight gradient (bf16: read e and 4,
  // write 4 per weight), then the bias gradient's read of the output gradient.
  ASSERT_EQ(backward.breakdown->kernels.size(), 3u);
  EXPECT_EQ(backward.breakdown->kernels[0].kind, model::KernelKind::Gemm);
  EXPECT_EQ(backward.breakdown->kernels[0].launches, 2);
  EXPECT_DOUBLE_EQ(backward.breakdown->kernels[0].bytes, 2 * operands);
  EXPECT_DOUBLE_EQ(backward.breakdown->kernels[1].bytes, (e + 8) * h * width);
  EXPECT_DOUBLE_EQ(backward.breakdown->kernels[2].bytes, e * tokens * width);
  EXPECT_EQ(backward.breakdown->kernels[2].launches, 1);
  EXPECT_DOUBLE_EQ(backward.bytes, 2 * operands + (e + 8) * h * width + e * tokens * width);

  const AnalyticalCostModel cost(topology::a100_sxm4_80gb());
  const double launch = cost.parameters().kernel_launch_s;
  EXPECT_NEAR(cost.compute_time_s(s, forward),
              cost.gemm_time_s(tokens, width, h, 1, s.model.dtype) + launch +
                  cost.memory_time_s(2 * e * tokens * width) + launch,
              1e-12);
  EXPECT_NEAR(cost.compute_time_s(s, mlp_up), cost.gemm_time_s(tokens, 4 * h / 8, h, 1, s.model.dtype) + launch, 1e-12);
}

TEST(KernelModel, FusedCausalSoftmaxReadsTheLowerTriangleOnly) {
  // megatron/fused_kernels/scaled_upper_triang_masked_softmax.h: row i reads its i + 1 unmasked scores and writes the
  // whole row; the backward reads dy and y below the diagonal and writes the whole dx. Unfused: scale, mask and
  // softmax, each a full pass (6 e forward, 7 e backward).
  model::Scenario fused = make_scenario(tensor_parallel_layer());
  fused.framework.dropout = false;
  model::Scenario unfused = fused;
  unfused.framework.fused_kernels = false;
  auto attention_bytes = [](const model::Scenario& s, model::Phase phase) {
    for (const model::Op& op : model::layer_compute_ops(s, 0, phase)) {
      if (op.what == model::ComputeKind::AttentionCore) return op.bytes;
    }
    return -1.0;
  };
  const double seq = 2048, scores = 1 * (32 / 8) * seq * seq, e = 2, lower = (seq + 1) / (2 * seq);
  EXPECT_DOUBLE_EQ(attention_bytes(unfused, model::Phase::Forward) - attention_bytes(fused, model::Phase::Forward),
                   scores * e * (6 - (1 + lower)));
  EXPECT_DOUBLE_EQ(attention_bytes(unfused, model::Phase::Backward) - attention_bytes(fused, model::Phase::Backward),
                   scores * e * (7 - (1 + 2 * lower)));
}

TEST(KernelModel, TheAttentionCoreCountsItsLayoutCopies) {
  // Everything the core moves, written out: Q, K, V read and the context written by the two batched GEMMs, the
  // scores written, passed over by the fused causal softmax (no dropout here) and read; forward the context's
  // permute(...).contiguous() copy; backward every GEMM operand twice (four gradient GEMMs), the softmax backward,
  // and split_backward's concatenation of the Q, K and V gradients (read and write 3 h/t per token).
  model::Scenario s = make_scenario(tensor_parallel_layer());
  s.framework.dropout = false;
  const double seq = 2048, heads = 32 / 8, head_dim = 128, e = 2, lower = (seq + 1) / (2 * seq);
  const double scores = heads * seq * seq, context = seq * heads * head_dim;  // elements, micro-batch 1
  double forward = -1, backward = -1;
  for (const model::Op& op : model::layer_compute_ops(s, 0, model::Phase::Forward)) {
    if (op.what == model::ComputeKind::AttentionCore) forward = op.bytes;
  }
  for (const model::Op& op : model::layer_compute_ops(s, 0, model::Phase::Backward)) {
    if (op.what == model::ComputeKind::AttentionCore) backward = op.bytes;
  }
  const double operands = e * (4 * context + 2 * scores);
  EXPECT_DOUBLE_EQ(forward, operands + e * scores * (1 + lower) + 2 * e * context);
  EXPECT_DOUBLE_EQ(backward, 2 * operands + e * scores * (1 + 2 * lower) + 6 * e * context);
}

TEST(KernelModel, AlibiCopiesTheBiasIntoTheScoresAndQkReadsItBack) {
  // BigScience's baddbmm on the ALiBi bias: a copy writes the expanded bias into the scores (streaming, one more
  // kernel) and Q K^T reads it as its C operand (at the attention GEMMs' rate); the backward is unchanged.
  model::Scenario learned = make_scenario(tensor_parallel_layer());
  model::Scenario alibi = learned;
  alibi.model.position_embedding = model::PositionEmbedding::Alibi;
  auto core = [](const model::Scenario& s, model::Phase phase) {
    for (const model::Op& op : model::layer_compute_ops(s, 0, phase)) {
      if (op.what == model::ComputeKind::AttentionCore) return op;
    }
    return model::Op{};
  };
  const AnalyticalCostModel cost(topology::a100_sxm4_80gb());
  const double score_bytes = 2.0 * (32 / 8) * 2048 * 2048;  // bf16, micro-batch 1, 4 local heads
  const double fraction = cost.parameters().attention_gemm_hbm_fraction;
  const double added = cost.compute_time_s(alibi, core(alibi, model::Phase::Forward)) -
                       cost.compute_time_s(learned, core(learned, model::Phase::Forward));
  EXPECT_NEAR(
      added,
      cost.memory_time_s(score_bytes) + cost.memory_time_s(score_bytes) / fraction + cost.parameters().kernel_launch_s,
      1e-12);
  EXPECT_DOUBLE_EQ(cost.compute_time_s(alibi, core(alibi, model::Phase::Backward)),
                   cost.compute_time_s(learned, core(learned, model::Phase::Backward)));
}

// Megatron-LM's attention measured on an A100-SXM4-40GB (Dao et al., FlashAttention, arXiv:2205.14135, Appendix E.6:
// fp16, batch 16 x 8 heads, head dim 64, no mask), timed by the cost model op by op as the simulator times the
// Program's attention core. `phase` Forward or Backward.
double modelled_attention_s(bool dropout, model::Phase phase, std::int64_t seq = 2048) {
  model::Scenario s = make_scenario(tensor_parallel_layer());
  s.model.dtype = model::DType::FP16;
  const double batch_heads = 16 * 8, head_dim = 64;
  const model::AttentionBenchmarkKernels kernels =
      model::unmasked_attention_kernels(batch_heads, static_cast<double>(seq), head_dim, 2, dropout);
  const bool backward = phase == model::Phase::Backward;
  auto breakdown = std::make_shared<model::KernelBreakdown>();
  breakdown->kernels = backward ? kernels.backward : kernels.forward;
  model::Op op;
  op.what = model::ComputeKind::AttentionCore;
  op.phase = phase;
  op.gemm = {seq, seq, 64, 2 * 16 * 8};
  op.breakdown = std::move(breakdown);
  return AnalyticalCostModel(topology::a100_sxm4_40gb()).compute_time_s(s, op);
}

TEST(AttentionModel, ReproducesMegatronsMeasuredAttention) {
  // The measurement the attention GEMMs' fraction of the streaming rate is read from (Table 20: 13.21 ms forward +
  // backward): the model gives it back, and the GEMMs are memory bound there (else the fraction would not matter).
  const double total =
      modelled_attention_s(false, model::Phase::Forward) + modelled_attention_s(false, model::Phase::Backward);
  EXPECT_NEAR(total, 13.21e-3, 0.01 * 13.21e-3);
  const AnalyticalCostModel a100(topology::a100_sxm4_40gb());
  const double fraction = a100.parameters().attention_gemm_hbm_fraction;
  EXPECT_GT(fraction, 0.5);
  EXPECT_LT(fraction, 0.8);
  EXPECT_GT(a100.gemm_time_s(2048, 2048, 64, 128, model::DType::FP16, fraction),
            1.5 * a100.gemm_time_s(2048, 2048, 64, 128, model::DType::FP16, 100.0));
  // The same fraction on the 80GB part and on Hopper (relative to each GPU's own streaming rate).
  EXPECT_DOUBLE_EQ(AnalyticalCostModel(topology::h100_sxm5_80gb()).parameters().attention_gemm_hbm_fraction, fraction);
}

TEST(AttentionModel, PredictsTheMeasurementsItWasNotReadFrom) {
  // Same paper, same GPU, not used to derive anything: with dropout 0.1 (Table 17: 17.41 ms forward + backward, the
  // way the published runs train; 4.73 ms at sequence 1024), and the forward and backward alone without it
  // (Tables 18, 19: 4.28, 8.86 ms).
  auto with_dropout = [](std::int64_t seq) {
    return modelled_attention_s(true, model::Phase::Forward, seq) +
           modelled_attention_s(true, model::Phase::Backward, seq);
  };
  EXPECT_NEAR(with_dropout(2048), 17.41e-3, 0.03 * 17.41e-3);
  EXPECT_NEAR(with_dropout(1024), 4.73e-3, 0.05 * 4.73e-3);
  EXPECT_NEAR(modelled_attention_s(false, model::Phase::Forward), 4.28e-3, 0.12 * 4.28e-3);
  EXPECT_NEAR(modelled_attention_s(false, model::Phase::Backward), 8.86e-3, 0.06 * 8.86e-3);
}

TEST(KernelModel, CrossEntropyPassesOverFp32LogitsAsMegatronRunsThem) {
  // megatron/mpu/cross_entropy.py on output.float(): forward cast, max, sub_, exp, sum, div_ (e + 36 bytes per logit
  // in 6 kernels), backward mul_ and the cast back (12 + e bytes in 2 kernels); in fp32 there is no cast.
  Plan plan = tensor_parallel_layer();
  plan.vocab = 51200;
  const model::Scenario half = make_scenario(plan);  // bf16
  model::Scenario full = half;
  full.model.dtype = model::DType::FP32;
  auto head = [](const model::Scenario& s, model::Phase phase) {
    model::Program program = model::build_program(s, model::Granularity::Op);
    for (const model::Op& op : program.stage_ops.front()) {
      if (op.what == model::ComputeKind::CrossEntropy && op.kind == model::OpKind::Compute && op.phase == phase)
        return op;
    }
    return model::Op{};
  };
  const double logits = 2048.0 * 51200 / 8;
  const model::Op forward = head(half, model::Phase::Forward), backward = head(half, model::Phase::Backward);
  EXPECT_DOUBLE_EQ(forward.bytes, logits * (2 + 36));
  EXPECT_DOUBLE_EQ(backward.bytes, logits * (12 + 2));
  EXPECT_DOUBLE_EQ(head(full, model::Phase::Forward).bytes, logits * 32);
  EXPECT_DOUBLE_EQ(head(full, model::Phase::Backward).bytes, logits * 8);

  const AnalyticalCostModel cost(topology::a100_sxm4_80gb());
  const double launch = cost.parameters().kernel_launch_s;
  EXPECT_NEAR(cost.compute_time_s(half, forward), cost.memory_time_s(forward.bytes) + 6 * launch, 1e-12);
  EXPECT_NEAR(cost.compute_time_s(half, backward), cost.memory_time_s(backward.bytes) + 2 * launch, 1e-12);
}

TEST(Framework, AReceiptsCopiesCostTheirBytesAndLaunches) {
  // DeepSpeed's PartitionedTensor.full() on a receipt (model::pipeline_transfer): 5 full tensors in 3 kernels.
  const AnalyticalCostModel cost(topology::a100_sxm4_80gb());
  EXPECT_NEAR(cost.memory_copy_s(4e7, 3), cost.memory_time_s(4e7) + 3 * cost.parameters().kernel_launch_s, 1e-15);
  EXPECT_DOUBLE_EQ(cost.memory_copy_s(0, 3), 0);
}

TEST(Framework, DeepSpeedReplaysFewAndManyMicroBatchesWithEverySchedule) {
  // Regression: with fewer micro-batches than stages (m < p), and with GPipe, the serialized DeepSpeed order used to
  // deadlock the replay. Every plan must finish, at both fidelities, in v0.5's order and in v0.8.3's.
  for (const std::string schedule : {"1f1b", "gpipe", "1f1b from 0.8.3"}) {
    for (const int micro_batches : {1, 2, 3, 5, 8}) {
      Plan plan;
      plan.tp = 2;
      plan.pp = 4;
      plan.layers = 4;
      plan.hidden = 256;
      plan.heads = 4;
      plan.seq = 256;
      plan.global_batch = micro_batches;
      plan.schedule = schedule.substr(0, schedule.find(' '));
      model::Scenario scenario = make_scenario(plan);
      scenario.framework.name = model::Framework::DeepSpeed;
      if (schedule.find("0.8.3") != std::string::npos) scenario.framework.deepspeed_version = {0, 8, 3};
      const model::Program program = model::build_program(scenario, model::Granularity::Layer);
      const AnalyticalCostModel cost(topology::a100_sxm4_80gb());
      for (const Fidelity fidelity : {Fidelity::Rank, Fidelity::Group}) {
        SimOptions options;
        options.fidelity = fidelity;
        double seconds = 0;
        ASSERT_NO_THROW(seconds = simulate(program, cost, options).timeline.iteration_time_s)
            << schedule << ", m = " << micro_batches;
        EXPECT_GT(seconds, 0) << schedule << ", m = " << micro_batches;
      }
    }
  }
}

// One message between two nodes with TP 8: 1/8 of the bytes on the NIC, then the receiver's all-gather on NVLink.
double one_message_s(model::Framework framework, model::Phase phase, double bytes, Fidelity fidelity) {
  Plan plan;
  plan.tp = 8;
  plan.pp = 2;
  plan.layers = 2;
  plan.nodes = 2;
  model::Scenario scenario = make_scenario(plan);
  scenario.framework.name = framework;
  model::Op send;
  send.kind = model::OpKind::Send;
  send.stream = model::Stream::Pipeline;
  send.phase = phase;
  send.micro_batch = 0;
  send.peer_stage = 1;
  send.tag_virtual_stage = 0;
  send.bytes = bytes;
  model::Op recv = send;
  recv.kind = model::OpKind::Recv;
  recv.peer_stage = 0;
  SimOptions options;
  options.fidelity = fidelity;
  return simulate(testing::hand_program(scenario, {{send}, {recv}}), FixedCostModel(0, 0), options)
      .timeline.iteration_time_s;
}

TEST(PipelineExchange, ScatterGatherAndPartitionedMessages) {
  const double S = 2.4e8;
  const double gather = kDefaultNccl.ring_simple_base_s + 7 * kDefaultNccl.ring_simple_nvlink_step_s +
                        7.0 / 8 * S / kDgxA100.nvlink_effective_bytes_per_s;
  const double hops = 2 * 130e-9, step = kDefaultNccl.ring_simple_net_step_s + hops;
  const double megatron = S / 8 / kDgxA100.nic_effective_bytes_per_s + step + gather;
  const double deepspeed_activation = S / 8 / kDgxA100.nic_effective_bytes_per_s + 2 * step + gather;
  const double deepspeed_gradient = S / kDgxA100.nic_effective_bytes_per_s + step + gather;
  for (Fidelity fidelity : {Fidelity::Rank, Fidelity::Group}) {
    EXPECT_NEAR(one_message_s(model::Framework::Megatron, model::Phase::Forward, S, fidelity), megatron, 1e-9);
    EXPECT_NEAR(one_message_s(model::Framework::DeepSpeed, model::Phase::Forward, S, fidelity), deepspeed_activation,
                1e-9);
    EXPECT_NEAR(one_message_s(model::Framework::DeepSpeed, model::Phase::Backward, S, fidelity), deepspeed_gradient,
                1e-9);
  }
}

// Two stages of one layer each, TP 4.
model::Scenario two_stage_scenario() {
  Plan plan;
  plan.tp = 4;
  plan.pp = 2;
  plan.layers = 2;
  return make_scenario(plan);
}

struct Exchange {
  model::Op send, recv, compute;
};

// Stage 0 sends micro-batch 0's activation (1 MB) to stage 1; `compute` is a forward layer op for either side.
Exchange one_activation_exchange() {
  Exchange x;
  x.send.kind = model::OpKind::Send;
  x.send.stream = model::Stream::Pipeline;
  x.send.phase = model::Phase::Forward;
  x.send.micro_batch = 0;
  x.send.peer_stage = 1;
  x.send.tag_virtual_stage = 0;
  x.send.bytes = 1e6;
  x.recv = x.send;
  x.recv.kind = model::OpKind::Recv;
  x.recv.peer_stage = 0;
  x.compute.what = model::ComputeKind::TransformerLayer;
  x.compute.phase = model::Phase::Forward;
  return x;
}

TEST(PipelineExchange, ABlockingSendHoldsItsSenderUntilTheReceiverPosts) {
  // Stage 0 sends, then computes; stage 1 computes 5 ms before it posts its receive. Blocking (both frameworks):
  // stage 0 computes only once the receive is posted and the bytes have moved. Eager: it computes at once.
  const model::Scenario scenario = two_stage_scenario();
  const auto [send, recv, compute] = one_activation_exchange();
  const auto program = testing::hand_program(scenario, {{send, compute}, {compute, recv}});
  SimOptions options;
  options.fidelity = Fidelity::Rank;
  const FixedCostModel cost(5e-3, 0);
  const SimResult blocking = simulate(program, cost, options);
  const auto stage0 = [](const SimResult& r) { return r.timeline.ranks.at(0).spans.at(1); };  // stage 0's compute
  EXPECT_GT(stage0(blocking).start_s, 5e-3);
  options.blocking_p2p = false;
  EXPECT_DOUBLE_EQ(stage0(simulate(program, cost, options)).start_s, 0);
}

TEST(PipelineExchange, DeepSpeedsReceiverPaysItsCopiesBeforeItComputes) {
  // Stage 1 receives an activation, then computes. DeepSpeed's PartitionedTensor.full() copies (here 3 ms by the
  // cost model) come after the bytes and the gather, before the compute; so do Megatron's list all-gather copies
  // (2021); Megatron's _all_gather_base (2022) gathers in place.
  model::Scenario scenario = two_stage_scenario();
  const auto [send, recv, compute] = one_activation_exchange();
  struct CopiesTakeThreeMs : FixedCostModel {
    CopiesTakeThreeMs() : FixedCostModel(5e-3, 0) {}
    double memory_copy_s(double bytes, int /*kernels*/) const override { return bytes > 0 ? 3e-3 : 0; }
  } cost;
  SimOptions options;
  options.fidelity = Fidelity::Rank;
  const auto compute_start = [&](const model::Scenario& s) {
    const auto program = testing::hand_program(s, {{send}, {recv, compute}});
    return simulate(program, cost, options).timeline.ranks.at(1).spans.at(1).start_s;
  };
  const double megatron_2021 = compute_start(scenario);
  scenario.framework.pipeline_gather_copies = false;
  const double megatron = compute_start(scenario);
  EXPECT_NEAR(megatron_2021 - megatron, 3e-3, 1e-9);
  scenario.framework.name = model::Framework::DeepSpeed;
  const double deepspeed = compute_start(scenario);
  // DeepSpeed also sends a meta message (one more latency) and the same 1/t of the data.
  EXPECT_GT(deepspeed - megatron, 3e-3);
  EXPECT_LT(deepspeed - megatron, 3.1e-3);
}

TEST(PipelineExchange, Bf16OptimizersGradientReceiptRestoresTwoTensors) {
  // Stage 1 sends micro-batch 0's gradient back to stage 0, which then runs its backward. v0.5 sends the gradient
  // whole and restores the stage's own partitioned output (one PartitionedTensor.full(): 5 tensors copied);
  // BF16_Optimizer's engine sends it partitioned and restores both (10). Copies cost 1 ms per MB here.
  model::Scenario scenario = two_stage_scenario();
  scenario.framework.name = model::Framework::DeepSpeed;
  scenario.model.dtype = model::DType::BF16;
  scenario.parallel.zero_stage = 1;
  auto [send, recv, compute] = one_activation_exchange();
  for (model::Op* op : {&send, &recv, &compute}) op->phase = model::Phase::Backward;
  send.peer_stage = 0;
  recv.peer_stage = 1;
  struct CopiesTakeAMsPerMegabyte : FixedCostModel {
    CopiesTakeAMsPerMegabyte() : FixedCostModel(5e-3, 0) {}
    double memory_copy_s(double bytes, int /*kernels*/) const override { return bytes * 1e-9; }
  } cost;
  SimOptions options;
  options.fidelity = Fidelity::Rank;
  const auto compute_start = [&](const model::Scenario& s) {
    const auto program = testing::hand_program(s, {{recv, compute}, {send}});
    return simulate(program, cost, options).timeline.ranks.at(0).spans.at(1).start_s;
  };
  const double v05 = compute_start(scenario);
  EXPECT_GT(v05, 5e-3);
  scenario.framework.bf16_optimizer = true;
  // 5 ms more of copies; a quarter of the bytes on the wire, one more message and one more NVLink gather: microseconds.
  EXPECT_NEAR(compute_start(scenario) - v05, 5e-3, 2e-4);
}

TEST(TpOverlap, HidesBackwardCollectivesUnderTheirGemms) {
  Plan plan;
  plan.tp = 8;
  plan.layers = 4;
  plan.hidden = 4096;
  plan.heads = 32;
  plan.seq = 2048;
  plan.global_batch = 4;
  for (const bool sequence_parallel : {false, true}) {
    plan.sequence_parallel = sequence_parallel;
    model::Scenario scenario = make_scenario(plan);
    const AnalyticalCostModel cost(topology::a100_sxm4_80gb());
    const auto run = [&](bool overlap, Fidelity fidelity) {
      scenario.framework.tp_comm_overlap = overlap;
      SimOptions options;
      options.fidelity = fidelity;
      return simulate(model::build_program(scenario, model::Granularity::Layer), cost, options)
          .timeline.iteration_time_s;
    };
    const double exposed = run(false, Fidelity::Rank), hidden = run(true, Fidelity::Rank);
    EXPECT_LT(hidden, 0.99 * exposed) << "sequence parallel " << sequence_parallel;
    // Both fidelities hide the same time, to SimGrid's timing precision (precision/timing, 1e-9 s by default).
    EXPECT_NEAR(run(true, Fidelity::Group), hidden, 1e-9);
  }
}

TEST(TpOverlap, ACollectiveHoldsItsChannelsSmsBesideTheGemm) {
  // One NCCL block per channel: 24 channels inside a DGX A100 (NCCL 2.8's ring search), of 108 SMs.
  const topology::NodeSpec node = topology::dgx_a100();
  EXPECT_EQ(node.nccl_nvlink_channels, 24);
  const double share = 24.0 / 108;
  // A collective well inside its GEMM: the GEMM loses the collective's SMs for as long as it runs.
  EXPECT_DOUBLE_EQ(exposed_beside_gemm_s(1e-3, 4e-3, share), share * 1e-3);
  // Longer than its GEMM: the collective's own rest is what shows.
  EXPECT_DOUBLE_EQ(exposed_beside_gemm_s(4e-3, 1e-3, share), 3e-3);
  // No GEMM beside it, or a share of nothing: the old rule.
  EXPECT_DOUBLE_EQ(exposed_beside_gemm_s(1e-3, 0, share), 1e-3);
  EXPECT_DOUBLE_EQ(exposed_beside_gemm_s(1e-3, 4e-3, 0), 0);

  // Through the engine: holding SMs costs time, yet less than not overlapping at all.
  Plan plan;
  plan.tp = 8;
  plan.layers = 4;
  plan.hidden = 8192;
  plan.heads = 64;
  plan.seq = 2048;
  plan.micro_batch = 4;
  plan.global_batch = 4;
  model::Scenario scenario = make_scenario(plan);
  const AnalyticalCostModel cost(topology::a100_sxm4_80gb());
  const auto run = [&](bool overlap, int channels) {
    scenario.framework.tp_comm_overlap = overlap;
    SimOptions options;
    options.node = node;
    options.node->nccl_nvlink_channels = channels;
    return simulate(model::build_program(scenario, model::Granularity::Layer), cost, options).timeline.iteration_time_s;
  };
  const double free_sms = run(true, 0), held_sms = run(true, 24), serial = run(false, 24);
  EXPECT_GT(held_sms, free_sms * (1 + 1e-4));
  EXPECT_LT(held_sms, serial);
}

TEST(Pipeline, ThroughputPerGpuFallsAsDataParallelismShrinksTheMicroBatches) {
  // Fixed global batch, more pipelines: fewer micro-batches each, a larger bubble (p-1)/(m+p-1).
  double previous = 1e30;
  for (const int dp : {1, 2, 4}) {
    Plan plan;
    plan.tp = 2;
    plan.pp = 4;
    plan.dp = dp;
    plan.layers = 8;
    plan.nodes = dp;
    plan.global_batch = 32;
    const model::Program program = model::build_program(make_scenario(plan), model::Granularity::Layer);
    const SimResult result = simulate(program, AnalyticalCostModel(topology::a100_sxm4_80gb()));
    const report::Summary summary = report::summarize(program, result.timeline, result.peak_flops_per_gpu, "sim");
    EXPECT_LT(summary.tflops_per_gpu, previous) << "dp = " << dp;
    previous = summary.tflops_per_gpu;
  }
}

TEST(Pipeline, OverlappedParameterGathersHideUnderTheFirstForward) {
  // ZeRO-1 over two nodes without a pipeline, few micro-batches: the updated parameters' all-gather after the step
  // is exposed; with parallel.overlap_param_gather only the first bucket's is, the rest running under the first
  // micro-batch's forward (8192 tokens: a layer's forward outlasts its 25 MB gather over the network), so the
  // iteration is shorter by most of it and the exposed DP time falls. (With a forward shorter than its gather, the
  // forward would run at the gathers' pace instead, and nothing would be won.)
  Plan plan;
  plan.tp = 8;
  plan.dp = 2;
  plan.nodes = 2;
  plan.hidden = 4096;
  plan.heads = 32;
  plan.seq = 2048;
  plan.micro_batch = 4;
  plan.global_batch = 16;
  plan.zero_stage = 1;
  plan.dp_overlap = true;
  auto run = [](model::Scenario s) {
    const model::Program program = model::build_program(s, model::Granularity::Layer);
    const SimResult result = simulate(program, AnalyticalCostModel(topology::a100_sxm4_80gb()));
    return report::summarize(program, result.timeline, result.peak_flops_per_gpu, "sim");
  };
  model::Scenario s = make_scenario(plan);
  const report::Summary after_step = run(s);
  s.parallel.overlap_param_gather = true;
  const report::Summary under_forward = run(s);
  EXPECT_LT(under_forward.split.dp_s, 0.7 * after_step.split.dp_s);
  EXPECT_LT(under_forward.iteration_time_s, after_step.iteration_time_s);
  // It can hide no more than the DP time there was.
  EXPECT_GT(under_forward.iteration_time_s, after_step.iteration_time_s - after_step.split.dp_s);
  std::printf("[ overlap_param_gather ] iteration %.4f s -> %.4f s, exposed DP %.4f s -> %.4f s\n",
              after_step.iteration_time_s, under_forward.iteration_time_s, after_step.split.dp_s,
              under_forward.split.dp_s);
}

TEST(Framework, AParallelBlockSavesItsForwardAllReduce) {
  // TP 8 inside a DGX A100: the parallel block's forward (and recomputed forward) all-reduce one [tokens, h] tensor
  // per layer where the sequential block reduces two. Its compute is the same GEMMs and slightly fewer elementwise
  // passes (one residual op instead of two, at the full width h that TP does not split), so the iteration shrinks
  // by the exposed TP time it saves and a little compute, no more.
  Plan plan;
  plan.tp = 8;
  plan.hidden = 4096;
  plan.heads = 32;
  plan.seq = 2048;
  plan.recompute = "full";
  const model::Scenario sequential = make_scenario(plan);
  model::Scenario parallel = sequential;
  parallel.model.parallel_residual = true;
  const AnalyticalCostModel cost(topology::a100_sxm4_80gb());
  auto run = [&cost](const model::Scenario& scenario) {
    const model::Program program = model::build_program(scenario);
    const SimResult result = simulate(program, cost);
    return report::summarize(program, result.timeline, result.peak_flops_per_gpu, "sim");
  };
  const report::Summary one = run(sequential), two = run(parallel);
  EXPECT_LT(two.split.tp_s, 0.75 * one.split.tp_s);
  EXPECT_LT(two.iteration_time_s, one.iteration_time_s);
  EXPECT_LT(two.split.compute_s, one.split.compute_s);
  EXPECT_GT(two.split.compute_s, 0.95 * one.split.compute_s);
  const double saved_s = (one.split.tp_s - two.split.tp_s) + (one.split.compute_s - two.split.compute_s);
  EXPECT_GT(two.iteration_time_s, one.iteration_time_s - saved_s - 1e-3);
}

}  // namespace
}  // namespace twin::sim
