#include "model/ops/kernel_traffic.hpp"

#include <algorithm>

namespace twin::model {

// Bytes per weight element the framework moves to accumulate one micro-batch's weight gradient, averaged over the
// iteration's micro-batches:
//   Megatron accumulating in fp32 (bf16 forces --accumulate-allreduce-grads-in-fp32 and contiguous buffers,
//     megatron/arguments.py): a gradient hook adds the model-dtype gradient into the fp32 main-gradient buffer,
//     param.main_grad.add_(param.grad.data) (megatron/model/distributed.py, 2021): read e and 4 bytes, write 4, every
//     micro-batch; nothing with framework.gradient_accumulation_fusion, where the weight-gradient GEMM accumulates
//     into main_grad itself (megatron/mpu/layers.py with fused_weight_gradient_mlp_cuda, 2022);
//   Megatron with fp16, PyTorch DDP and DeepSpeed (ZeRO-1 keeps gradients in .grad until the accumulation boundary,
//     deepspeed/runtime/zero/stage2.py): autograd accumulates into .grad in the model dtype (read two, write one:
//     3 e bytes) from the second micro-batch of the iteration on;
//   DeepSpeed's BF16_Optimizer (framework.bf16_optimizer; runtime/bf16_optimizer.py, v0.6.2): autograd writes a
//     fresh bf16 gradient (clear_lp_grads sets .grad to None before every backward) and update_hp_grads adds it into
//     the fp32 copy, hp_grad.add_(lp.grad.to(fp32)): a conversion (read e, write 4) and an add (read 4 + 4, write 4),
//     every micro-batch, in two kernels.
double gradient_accumulation_bytes(const Scenario& s) {
  const double e = dtype_bytes(s.model.dtype);
  const double m = static_cast<double>(std::max<std::int64_t>(1, s.parallel.micro_batches()));
  if (s.framework.bf16_optimizer) return e + 16;
  // Composer: under FSDP every micro-batch's backward writes a fresh unsharded gradient (FSDP moves the sharded one
  // aside, flat_param.py prepare_gradient) and the reduced shard is added on FSDP's own stream; under DDP autograd
  // adds each fp32 gradient into .grad in place (read 4 + 4, write 4) from the second micro-batch on.
  if (s.framework.name == Framework::Composer) {
    return s.parallel.zero_stage == 3 ? 0 : 12 * (m - 1) / m;
  }
  if (s.framework.name == Framework::Megatron && s.model.dtype == DType::BF16) {
    return s.framework.gradient_accumulation_fusion ? 0 : e + 8;
  }
  return 3 * e * (m - 1) / m;
}

int gradient_accumulation_launches(const Scenario& s) {
  return s.framework.bf16_optimizer ? 2 : 1;
}

}  // namespace twin::model
