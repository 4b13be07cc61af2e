#include "model/ops/optimizer_traffic.hpp"

#include "model/ops/compute_ops.hpp"

namespace twin::model {

namespace {

// Composer's DecoupledAdamW (composer/optim/decoupled_weight_decay.py of v0.13.3, a Python loop over the
// parameters; each FSDP unit is one flat fp32 shard) with weight_decay = 0: eight elementwise kernels per shard
// (the moments' mul_, add_, mul_, addcmul_; the denominator's sqrt, div, add_; the update's addcdiv_), 52 bytes
// read and 32 written per element.
double composer_adam_bytes() {
  return 52 + 32;
}

}  // namespace

// Memory traffic of the optimizer step, in bytes, for `local_parameters` on this rank (`shard` of them updated
// here: all, or 1/dp under ZeRO-1).
//   Megatron-LM (megatron/optimizer/optimizer.py, Float16OptimizerWithFloat16Params with apex FusedAdam, and
//   megatron/model/distributed.py, 2021): with fp16, gradients accumulate in the model dtype; the local DDP
//   flattens them around its all-reduce and copies them back (read + write twice: 4 e B), dividing the flat
//   buffer by the DP size in between (`coalesced /= dp`: 2 e B; PyTorch DDP folds it into its copy into the
//   bucket), and the optimizer makes fp32 copies (grad.float(): e + 4 B), unscales them and checks for inf/NaN
//   (8 B). With bf16 they accumulate in a contiguous fp32 main-gradient buffer, zeroed every iteration (4 B),
//   divided in place by the DP size before its all-reduce (`buffer_.data /= dp`, run by the local DDP's
//   allreduce_gradients whatever the DP size: 8 B), then used in place. Then on the shard: the L2
//   norm for clipping (read, 4 B), Adam (read parameter, gradient, m, v: 16 B; write parameter, m, v: 12 B) and the
//   copy of the fp32 parameter into the model dtype (4 + e B).
//   DeepSpeed (runtime/zero/stage2.py of v0.5, ZeRO-1; its fp16 optimizer without ZeRO moves about as much):
//   gradients stay in the model dtype. Per local parameter, with DP: every bucket of 500M elements is flattened,
//   divided by the DP size and copied back around its all-reduce (allreduce_bucket / allreduce_and_copy: 6 e B);
//   under ZeRO-1 the list all-gather of the updated partitions copies out of NCCL's flat buffer (2 e B). Per
//   parameter of its shard: the overflow check x.float().sum() (e + 8 B), the norm g.double().norm(2) (e + 16 B),
//   flattening and conversion to fp32 (2 e + e + 4 B), unscale and clip, a mul_ even at scale 1 (8 B), Adam
//   (28 B) and the copy into the model dtype (4 + e B).
//   DeepSpeed's BF16_Optimizer (runtime/bf16_optimizer.py and engine.py of v0.6.2; its per-micro-batch fp32
//   accumulation rides on the weight-gradient GEMMs, gradient_accumulation_bytes): per local parameter, with DP, the fp32
//   gradients go through allreduce_bucket in communication_data_type, bf16 when neither fp16 nor ZeRO is on: a
//   conversion (4 + e B), the division by the DP size (mul_, 2 e B) and the copy back (e + 4 B), and the list
//   all-gather of the updated bf16 partitions copies out of NCCL's flat buffer (2 e B); the global norm reads
//   every local fp32 gradient (get_grads_for_norm, 4 B) and clear_hp_grads zeroes them (4 B). Per parameter of its
//   shard: Adam (28 B) and update_lp_params' copy into bf16 (4 + e B). Clipping multiplies only when the norm
//   exceeds the limit (clip_tensors_by_global_norm): not counted.
double optimizer_step_bytes(const Scenario& s, double local_parameters, int dp, bool zero) {
  const double e = dtype_bytes(s.model.dtype), shard = local_parameters / (zero ? dp : 1);
  const double adam = 28, norm = 4, copy_back = 4 + e;
  if (s.framework.name == Framework::Composer) return shard * (norm + composer_adam_bytes());
  if (s.model.dtype == DType::FP32) return shard * (norm + adam) + local_parameters * 4;
  const double unscale = s.model.dtype == DType::FP16 ? 8 : 0;
  if (s.framework.bf16_optimizer) {
    const double reduce_copies = dp > 1 ? 8 + 4 * e : 0, gather_copy_out = zero ? 2 * e : 0;
    const double norm_of_all = 4, clear = 4;
    return local_parameters * (reduce_copies + gather_copy_out + norm_of_all + clear) + shard * (adam + copy_back);
  }
  if (s.framework.name == Framework::DeepSpeed) {
    const double reduce_copies = dp > 1 ? 6 * e : 0, gather_copy_out = zero ? 2 * e : 0;
    const double overflow_check = e + 8, double_norm = e + 16, to_fp32 = 3 * e + 4, unscale_and_clip = 8;
    return local_parameters * (reduce_copies + gather_copy_out) +
           shard * (overflow_check + double_norm + to_fp32 + unscale_and_clip + adam + copy_back);
  }
  const bool local_ddp = !s.parallel.dp_overlap;  // Megatron's own DDP; dp_overlap is PyTorch DDP
  if (s.model.dtype == DType::BF16) {
    return shard * (norm + adam + copy_back) + local_parameters * (4 + (local_ddp ? 8 : 0));
  }
  return local_parameters * (4 * e + (local_ddp ? 2 * e : 0) + (e + 4)) + shard * (unscale + norm + adam + copy_back);
}

Op optimizer_step_op(const Scenario& s, double local_parameters, int dp, bool zero) {
  return elementwise(ComputeKind::OptimizerStep, Phase::Optimizer, optimizer_step_bytes(s, local_parameters, dp, zero),
                     1);
}

}  // namespace twin::model
