#include "sim/framework.hpp"

#include <algorithm>

namespace twin::sim {

PipelineTransfer pipeline_transfer(const model::Scenario& scenario, const model::Op& p2p) {
  PipelineTransfer transfer;
  transfer.full_bytes = p2p.bytes;
  transfer.wire_bytes = p2p.bytes;
  const double t = static_cast<double>(scenario.parallel.tp);
  // With sequence parallelism the tensor is already a 1/t shard (Program::bytes): nothing to scatter or gather.
  const bool split = scenario.parallel.tp > 1 && !scenario.parallel.sequence_parallel;
  if (!split) return transfer;
  const bool gradient = p2p.phase == model::Phase::Backward;
  switch (scenario.framework.name) {
    case model::Framework::Megatron:
      // split_tensor_into_1d_equal_chunks / gather_split_1d_tensor, both directions. Until February 2022 the gather
      // was torch.distributed.all_gather into a list of t chunks of the output, which PyTorch's NCCL process group
      // gathers into a flat buffer and copies out chunk by chunk (read and write the tensor, t kernels); after, one
      // _all_gather_base into the output ("versus the former does internal copies", megatron/mpu/utils.py).
      transfer.wire_bytes = p2p.bytes / t;
      transfer.receipt_gathers = 1;
      if (scenario.framework.pipeline_gather_copies) {
        transfer.receipt_copy_bytes = 2 * p2p.bytes;
        transfer.receipt_copy_kernels = scenario.parallel.tp;
      }
      break;
    case model::Framework::DeepSpeed:
      // Each receipt restores tensors with PartitionedTensor.full(): an all-gather across TP, then zero-fill
      // (write), NCCL's copy-out of the list all-gather (read, write) and the returned clone (read, write): 5 full
      // tensors in 3 kernels. Through v0.5.3 (is_grad_partitioned = False) a gradient crosses whole and the receiver
      // restores only its own partitioned output.
      transfer.receipt_gathers = 1;
      transfer.receipt_copy_bytes = 5 * p2p.bytes;
      transfer.receipt_copy_kernels = 3;
      if (!gradient) {
        // PartitionedTensor: its meta tensor, then 1/t of the data; the receiver also clones the partition it
        // received twice (_exec_recv_activations, then _exec_forward_pass).
        transfer.wire_bytes = p2p.bytes / t;
        transfer.messages = 2;
        transfer.receipt_copy_bytes += 2 * 2 * p2p.bytes / t;
        transfer.receipt_copy_kernels += 2;
      } else if (model::deepspeed_partitions_gradients(scenario.framework)) {
        // v0.5.4 on (is_grad_partitioned = is_model_parallel, DeepSpeed #1407; BF16_Optimizer's engine, v0.6.2 on,
        // included): the gradient is a PartitionedTensor too, and the backward restores both its own output and the
        // received gradient (_exec_backward_pass, unchanged through v0.9.5).
        transfer.wire_bytes = p2p.bytes / t;
        transfer.messages = 2;
        transfer.receipt_gathers = 2;
        transfer.receipt_copy_bytes = 2 * 5 * p2p.bytes;
        transfer.receipt_copy_kernels = 2 * 3;
      }
      break;
    case model::Framework::Composer:
      break;  // no pipeline (parallel.pp = 1): never reached
  }
  return transfer;
}

bool serialized_exchanges(const model::Scenario& scenario) {
  // DeepSpeed's PipelineEngine trains with TrainSchedule (1F1B) only; a GPipe or interleaved DeepSpeed scenario is
  // replayed with batched exchanges (TrainSchedule's order does not fit those op orders and would deadlock).
  return scenario.framework.name == model::Framework::DeepSpeed &&
         scenario.parallel.schedule == model::ScheduleKind::OneFOneB;
}

std::int64_t deepspeed_step(const model::Op& p2p, int stage, int stages) {
  const std::int64_t k = p2p.micro_batch;
  const std::int64_t pass_step = p2p.phase == model::Phase::Backward ? 2 * k + 2 * stages - 1 - stage : 2 * k + stage;
  return pass_step + (p2p.kind == model::OpKind::Send ? 1 : 0);
}

std::vector<std::int32_t> exchange_order(const model::Scenario& scenario, const std::vector<model::Op>& ops,
                                         std::vector<std::int32_t> exchange, int stage) {
  if (!serialized_exchanges(scenario)) return exchange;
  // TrainSchedule.steps() of v0.3 to v0.8.2 (2020 to March 2023, the engines the 2021-2022 published runs used): a
  // forward step issues RecvActivation then SendGrad, a backward step SendActivation then RecvGrad; in both, the
  // activation comes first. v0.8.3 swapped the two (#2862, when it cut the stage's pipe buffers by one): SendGrad
  // then RecvActivation, RecvGrad then SendActivation (framework.deepspeed_version).
  const int stages = scenario.parallel.pp;
  const bool gradient_first = model::deepspeed_gradient_first_in_step(scenario.framework);
  std::stable_sort(exchange.begin(), exchange.end(), [&](std::int32_t a, std::int32_t b) {
    const std::int64_t a_step = deepspeed_step(ops[a], stage, stages), b_step = deepspeed_step(ops[b], stage, stages);
    if (a_step != b_step) return a_step < b_step;
    const bool a_gradient = ops[a].phase == model::Phase::Backward, b_gradient = ops[b].phase == model::Phase::Backward;
    return gradient_first ? a_gradient && !b_gradient : !a_gradient && b_gradient;
  });
  return exchange;
}

HiddenUnder tp_overlap(const model::Scenario& scenario, const model::Op& collective) {
  if (!scenario.framework.tp_comm_overlap || collective.kind != model::OpKind::Collective) return HiddenUnder::Nothing;
  if (collective.group != model::Group::Tensor || collective.phase != model::Phase::Backward)
    return HiddenUnder::Nothing;
  const bool column_parallel = collective.what == model::ComputeKind::QkvProjection ||
                               collective.what == model::ComputeKind::MlpUp ||
                               collective.what == model::ComputeKind::LmHead;
  if (!column_parallel) return HiddenUnder::Nothing;
  // The input gradient's all-reduce (or reduce-scatter) runs while the weight gradient is computed ...
  if (collective.payload == model::Payload::InputGrad) return HiddenUnder::WeightGradient;
  // ... and the sequence-parallel re-gather of the input while the input gradient is computed.
  if (collective.payload == model::Payload::LayerInput && collective.collective == model::CollectiveKind::AllGather) {
    return HiddenUnder::InputGradient;
  }
  return HiddenUnder::Nothing;
}

double exposed_beside_gemm_s(double collective_s, double gemm_s, double sm_share) {
  if (collective_s <= 0) return 0;
  if (gemm_s <= 0) return collective_s;
  return std::max(collective_s - gemm_s, std::clamp(sm_share, 0.0, 1.0) * collective_s);
}

}  // namespace twin::sim
