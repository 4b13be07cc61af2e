#include "model/ops/exchanges.hpp"

#include <algorithm>
#include <utility>

#include "model/ops/context_parallel_ring.hpp"

namespace twin::model {

ExchangeIssue exchange_issue(const Scenario& scenario) {
  // A zero-bubble stage must not wait on the B gradient it sends before its W: the zero-bubble runtime (a
  // Megatron-LM fork) posts its sends asynchronously and waits only on receives, as the interleaved schedule does.
  const ScheduleKind kind = scenario.parallel.schedule;
  if (kind == ScheduleKind::Interleaved || kind == ScheduleKind::ZeroBubbleH1 || kind == ScheduleKind::ZeroBubbleV ||
      kind == ScheduleKind::DualPipeV || kind == ScheduleKind::DualPipe) {
    return ExchangeIssue::Eager;
  }
  const bool train_schedule =
      scenario.framework.name == Framework::DeepSpeed && scenario.parallel.schedule == ScheduleKind::OneFOneB;
  return train_schedule ? ExchangeIssue::Serialized : ExchangeIssue::Batched;
}

std::int64_t deepspeed_step(const Op& p2p, int stage, int stages) {
  const std::int64_t k = p2p.micro_batch;
  const std::int64_t pass_step = p2p.phase == Phase::Backward ? 2 * k + 2 * stages - 1 - stage : 2 * k + stage;
  return pass_step + (p2p.kind == OpKind::Send ? 1 : 0);
}

namespace {

// Serialized exchanges go by DeepSpeed step, activation ops (Phase::Forward) before gradient ops within a step
// (gradient ops first from DeepSpeed v0.8.3 on). With fewer micro-batches than stages ahead, the last warm-up
// activation leaves in an earlier step than the first gradient arrives in: Program order there would deadlock.
//   TrainSchedule.steps() of v0.3 to v0.8.2 (2020 to March 2023, the engines the 2021-2022 published runs used): a
//   forward step issues RecvActivation then SendGrad, a backward step SendActivation then RecvGrad; in both, the
//   activation comes first. v0.8.3 swapped the two (#2862, when it cut the stage's pipe buffers by one): SendGrad
//   then RecvActivation, RecvGrad then SendActivation (framework.deepspeed_version).
void order_train_schedule(const Scenario& scenario, const std::vector<Op>& ops, int stage,
                          std::vector<std::int32_t>& exchange) {
  const int stages = static_cast<int>(scenario.parallel.pp);
  const bool gradient_first = deepspeed_gradient_first_in_step(scenario.framework);
  std::stable_sort(exchange.begin(), exchange.end(), [&](std::int32_t a, std::int32_t b) {
    const std::int64_t a_step = deepspeed_step(ops[a], stage, stages), b_step = deepspeed_step(ops[b], stage, stages);
    if (a_step != b_step) return a_step < b_step;
    const bool a_gradient = ops[a].phase == Phase::Backward, b_gradient = ops[b].phase == Phase::Backward;
    return gradient_first ? a_gradient && !b_gradient : !a_gradient && b_gradient;
  });
}

}  // namespace

std::vector<PipelineExchange> pipeline_exchanges(const Scenario& scenario, const std::vector<Op>& ops, int stage) {
  const bool serialized = exchange_issue(scenario) == ExchangeIssue::Serialized;
  std::vector<PipelineExchange> exchanges;
  PipelineExchange open;
  const auto close = [&](std::int32_t next_compute) {
    if (open.ops.empty()) return;
    open.before = next_compute;
    if (serialized) order_train_schedule(scenario, ops, stage, open.ops);
    exchanges.push_back(std::move(open));
    open = PipelineExchange{};
  };
  std::int32_t last_compute = -1;
  for (std::int32_t i = 0; i < static_cast<std::int32_t>(ops.size()); ++i) {
    if (is_cp_ring_message(ops[i])) continue;  // a CP ring's: its own deps order it (context_parallel_ring.hpp)
    if (ops[i].stream == Stream::Pipeline) {
      if (open.ops.empty()) open.after = last_compute;
      open.ops.push_back(i);
    } else if (ops[i].stream == Stream::Compute) {
      close(i);
      last_compute = i;
    }
  }
  close(-1);
  return exchanges;
}

PipelineTransfer pipeline_transfer(const Scenario& scenario, const Op& p2p) {
  PipelineTransfer transfer;
  transfer.full_bytes = p2p.bytes;
  transfer.wire_bytes = p2p.bytes;
  const double t = static_cast<double>(scenario.parallel.tp);
  // With sequence parallelism the tensor is already a 1/t shard (Program::bytes): nothing to scatter or gather.
  const bool split = scenario.parallel.tp > 1 && !scenario.parallel.sequence_parallel;
  if (!split) return transfer;
  const bool gradient = p2p.phase == Phase::Backward;
  switch (scenario.framework.name) {
    case Framework::Megatron:
      // With TP and without sequence parallelism each rank sends 1/t of the tensor and the receiver all-gathers it
      // over NVLink (--scatter-gather-tensors-in-pipeline, on by default): split_tensor_into_1d_equal_chunks /
      // gather_split_1d_tensor, both directions. Until February 2022 the gather was torch.distributed.all_gather
      // into a list of t chunks of the output, which PyTorch's NCCL process group gathers into a flat buffer and
      // copies out chunk by chunk (read and write the tensor, t kernels); after, one _all_gather_base into the
      // output ("versus the former does internal copies", megatron/mpu/utils.py).
      transfer.wire_bytes = p2p.bytes / t;
      transfer.receipt_gathers = 1;
      if (scenario.framework.pipeline_gather_copies) {
        transfer.receipt_copy_bytes = 2 * p2p.bytes;
        transfer.receipt_copy_kernels = static_cast<int>(scenario.parallel.tp);
      }
      break;
    case Framework::DeepSpeed:
      // Activations are partitioned across the TP group (is_pipe_partitioned: a meta tensor and 1/t of the data,
      // all-gathered on receipt). Each receipt restores tensors with PartitionedTensor.full() (runtime/utils.py): an
      // all-gather across TP, then zero-fill (write), NCCL's copy-out of the list all-gather (read, write) and the
      // returned clone (read, write): 5 full tensors in 3 kernels. Through v0.5.3 (is_grad_partitioned = False) a
      // gradient crosses whole and the receiver restores only its own partitioned output.
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
      } else if (deepspeed_partitions_gradients(scenario.framework)) {
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
    case Framework::Composer:
      break;  // no pipeline (parallel.pp = 1): never reached
  }
  return transfer;
}

}  // namespace twin::model
