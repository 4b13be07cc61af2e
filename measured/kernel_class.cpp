// Kernel names, read from what the libraries call their kernels: NCCL's ncclKernel_<Coll>_<Algo>_<Proto>_<Op>_<Type>
// and ncclDevKernel_<Coll>_... (nccl src/device/generate.py), cuBLAS's <arch>_<s|h>gemm_<tile>_<layout> and
// sm90_xmma_gemm_..., cuBLASLt's nvjet_*, CUTLASS's cutlass::Kernel<cutlass_80_tensorop_...gemm...>, cuDNN's
// implicit-GEMM convolutions (sm80_xmma_fprop_implicit_gemm_..., ..._dgrad_..., ..._wgrad_...), FlashAttention's
// flash_fwd_kernel / flash_bwd_dq_dk_dv_loop_kernel (github.com/Dao-AILab/flash-attention csrc/flash_attn/src),
// PyTorch's ATen kernels (at::native::vectorized_elementwise_kernel<...Functor...>, at::native::(anonymous
// namespace)::vectorized_layer_norm_kernel, cunn_SoftMaxForward, multi_tensor_apply_kernel<...AdamFunctor...>), and
// Triton's generated triton_poi_ / triton_red_ / triton_per_ kernels (torch/_inductor/codegen/triton.py).
#include "measured/kernel_class.hpp"

#include <algorithm>
#include <cctype>
#include <initializer_list>

namespace twin::measured {
namespace {

std::string lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

bool has_any(const std::string& text, std::initializer_list<std::string_view> parts) {
  return std::any_of(parts.begin(), parts.end(), [&text](std::string_view part) {
    return text.find(part) != std::string::npos;
  });
}

CommKind comm_kind(const std::string& name) {
  if (has_any(name, {"allreduce", "all_reduce"})) return CommKind::AllReduce;
  if (has_any(name, {"reducescatter", "reduce_scatter"})) return CommKind::ReduceScatter;
  if (has_any(name, {"allgather", "all_gather"})) return CommKind::AllGather;
  if (has_any(name, {"alltoall", "all_to_all"})) return CommKind::AllToAll;
  if (has_any(name, {"sendrecv", "send", "recv"})) return CommKind::SendRecv;
  if (has_any(name, {"broadcast"})) return CommKind::Broadcast;
  if (has_any(name, {"reduce"})) return CommKind::Reduce;
  return CommKind::Other;
}

// The order matters: an implicit-GEMM convolution is a convolution before it is a GEMM, a softmax inside a
// cross-entropy is the loss's, a multi-tensor kernel is the optimizer's before it is elementwise, cuDNN's batch norm
// is a norm before it is cuDNN's.
KernelClass kernel_class(const std::string& n) {
  if (has_any(n, {"flash_fwd", "flash_bwd", "flash::", "flash_attn", "flashattn", "fmha", "attention", "_attn_fwd",
                  "_attn_bwd", "sdpa", "mha_fwd", "mha_bwd"})) {
    return KernelClass::Attention;
  }
  if (has_any(n, {"log_softmax", "logsoftmax", "cross_entropy", "crossentropy", "nll_loss", "nllloss"})) {
    return KernelClass::Loss;
  }
  if (has_any(n, {"softmax"})) return KernelClass::Attention;
  if (has_any(n, {"adam", "multi_tensor", "sgd_", "lamb_", "lion_", "l2norm", "foreach"})) return KernelClass::Optimizer;
  if (has_any(n, {"layer_norm", "layernorm", "rms_norm", "rmsnorm", "ln_fwd", "ln_bwd", "cuapplylayernorm",
                  "cucomputegradinput", "cucomputepartgradgammabeta", "cucomputegradgammabeta", "gammabeta", "rowwisemoments", "batch_norm",
                  "batchnorm", "bn_fw", "bn_bw", "group_norm", "groupnorm", "welford"})) {
    return KernelClass::Norm;
  }
  if (has_any(n, {"nchwtonhwc", "nhwctonchw"})) return KernelClass::Copy;  // cuDNN's layout transposes
  if (has_any(n, {"implicit_gemm", "implicitgemm", "conv", "cudnn", "dgrad", "wgrad", "fprop", "winograd", "fft",
                  "im2col", "col2im"})) {
    return KernelClass::Convolution;
  }
  if (has_any(n, {"gemm", "gemv", "nvjet", "cublas", "cutlass", "xmma", "matmul", "splitkreduce", "dot_kernel",
                  "epilogue::impl"})) {
    return KernelClass::Gemm;
  }
  if (has_any(n, {"embedding", "indexselect", "index_select", "embedding_bag", "embeddingbag", "bounds_check_indices"})) {
    return KernelClass::Embedding;
  }
  if (has_any(n, {"memcpy", "memset", "copy", "cat_array", "catarray", "transpose", "permute", "nchwtonhwc",
                  "nhwctonchw", "gather", "scatter", "index_put", "indexing_backward", "_index_", "flip", "to_dense"})) {
    return KernelClass::Copy;
  }
  if (has_any(n, {"reduce", "pool", "cub::", "radixsort", "sort", "scan", "bucketize", "histogram", "unique",
                  "triton_red", "triton_per", "norm_kernel", "cumsum", "argmax", "topk"})) {
    return KernelClass::Reduction;
  }
  if (has_any(n, {"elementwise", "vectorized", "gelu", "silu", "swiglu", "relu", "dropout", "bias", "add", "mul",
                  "fill", "functor", "triton_poi", "triton_", "cast", "where", "masked", "clamp", "bernoulli",
                  "distribution", "rotary", "rope", "tanh", "sigmoid", "exp", "pow"})) {
    return KernelClass::Elementwise;
  }
  return KernelClass::Unclassified;
}

}  // namespace

std::string_view to_string(KernelClass kind) {
  switch (kind) {
    case KernelClass::Gemm:
      return "gemm";
    case KernelClass::Attention:
      return "attention";
    case KernelClass::Norm:
      return "norm";
    case KernelClass::Elementwise:
      return "elementwise";
    case KernelClass::Embedding:
      return "embedding";
    case KernelClass::Loss:
      return "loss";
    case KernelClass::Optimizer:
      return "optimizer";
    case KernelClass::Communication:
      return "communication";
    case KernelClass::Convolution:
      return "convolution";
    case KernelClass::Copy:
      return "copy";
    case KernelClass::Reduction:
      return "reduction";
    case KernelClass::Unclassified:
      return "unclassified";
  }
  return "unclassified";
}

std::string_view to_string(CommKind kind) {
  switch (kind) {
    case CommKind::AllReduce:
      return "all_reduce";
    case CommKind::ReduceScatter:
      return "reduce_scatter";
    case CommKind::AllGather:
      return "all_gather";
    case CommKind::Broadcast:
      return "broadcast";
    case CommKind::Reduce:
      return "reduce";
    case CommKind::AllToAll:
      return "all_to_all";
    case CommKind::SendRecv:
      return "send_recv";
    case CommKind::Other:
      return "other";
  }
  return "other";
}

Classified classify_kernel(std::string_view name) {
  const std::string n = lower(name);
  // NCCL's kernels, and the collectives of gloo / MPI as a CPU trace names them (c10d's record_param_comms).
  if (has_any(n, {"nccl", "c10d::", "gloo", "record_param_comms"})) return {KernelClass::Communication, comm_kind(n)};
  return {kernel_class(n), CommKind::Other};
}

std::optional<KernelClass> classify_cpu_op(std::string_view name) {
  const std::string n = lower(name);
  if (has_any(n, {"optimizer.step", "optimizer.zero_grad", "clip_grad", "_foreach_", "adam"})) {
    return KernelClass::Optimizer;
  }
  if (has_any(n, {"c10d::", "nccl:", "gloo:", "record_param_comms", "allreduce", "all_reduce", "allgather",
                  "all_gather", "reduce_scatter", "broadcast"})) {
    return KernelClass::Communication;
  }
  if (has_any(n, {"scaled_dot_product", "flash_attention", "efficient_attention", "attention"})) {
    return KernelClass::Attention;
  }
  if (has_any(n, {"log_softmax", "nll_loss", "cross_entropy", "logsoftmax", "nllloss", "crossentropy"})) {
    return KernelClass::Loss;
  }
  if (has_any(n, {"softmax"})) return KernelClass::Attention;
  if (has_any(n, {"layer_norm", "layernorm", "rms_norm", "rmsnorm", "batch_norm", "group_norm"})) {
    return KernelClass::Norm;
  }
  if (has_any(n, {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "mmbackward",
                  "addmmbackward", "bmmbackward", "aten::_addmm_activation", "aten::dot", "aten::mv"})) {
    return KernelClass::Gemm;
  }
  if (has_any(n, {"embedding"})) return KernelClass::Embedding;
  if (has_any(n, {"conv"})) return KernelClass::Convolution;
  // Wrappers that only dispatch: their children carry the time.
  if (has_any(n, {"aten::linear", "aten::matmul", "aten::to", "aten::_to_copy", "aten::contiguous", "aten::view",
                  "aten::reshape", "aten::t", "aten::transpose", "aten::permute", "aten::expand", "aten::split",
                  "aten::chunk", "aten::slice", "aten::select", "aten::unsqueeze", "aten::squeeze", "aten::as_strided",
                  "aten::empty", "aten::detach", "aten::alias", "aten::unbind", "aten::numpy_t", "aten::resolve"})) {
    return std::nullopt;
  }
  if (has_any(n, {"aten::copy_", "aten::clone", "aten::cat", "aten::stack", "aten::index", "aten::gather",
                  "aten::scatter", "aten::zero_", "aten::fill_", "aten::masked_fill", "aten::tril", "aten::triu",
                  "aten::set_", "copybackward", "aten::new_zeros", "aten::zeros", "aten::ones"})) {
    return KernelClass::Copy;
  }
  if (has_any(n, {"aten::sum", "aten::mean", "aten::max", "aten::min", "aten::norm", "aten::linalg_vector_norm",
                  "aten::argmax", "aten::topk", "aten::sort", "aten::cumsum", "sumbackward", "meanbackward"})) {
    return KernelClass::Reduction;
  }
  if (has_any(n, {"aten::", "backward0", "backward1"})) return KernelClass::Elementwise;
  return std::nullopt;
}

std::optional<KernelClass> class_of(model::ComputeKind kind) {
  using model::ComputeKind;
  switch (kind) {
    case ComputeKind::Embedding:
      return KernelClass::Embedding;
    case ComputeKind::LayerNormAttention:
    case ComputeKind::LayerNormMlp:
    case ComputeKind::FinalLayerNorm:
      return KernelClass::Norm;
    case ComputeKind::QkvProjection:
    case ComputeKind::AttentionProjection:
    case ComputeKind::MlpUp:
    case ComputeKind::MlpDown:
    case ComputeKind::LmHead:
    case ComputeKind::Router:
    case ComputeKind::ExpertUp:
    case ComputeKind::ExpertDown:
      return KernelClass::Gemm;
    case ComputeKind::AttentionCore:
      return KernelClass::Attention;
    case ComputeKind::AttentionResidual:
    case ComputeKind::MlpResidual:
    case ComputeKind::Gelu:
    case ComputeKind::Swiglu:
    case ComputeKind::ExpertPermute:
    case ComputeKind::ExpertUnpermute:
      return KernelClass::Elementwise;
    case ComputeKind::ExpertSplitsSync:  // a device-to-host memcpy of the counts
      return KernelClass::Copy;
    case ComputeKind::CrossEntropy:
      return KernelClass::Loss;
    case ComputeKind::OptimizerStep:
      return KernelClass::Optimizer;
    case ComputeKind::TransformerLayer:
      return std::nullopt;
  }
  return std::nullopt;
}

bool modelled_by_twin(KernelClass kind) {
  switch (kind) {
    case KernelClass::Convolution:
    case KernelClass::Copy:
    case KernelClass::Reduction:
    case KernelClass::Unclassified:
      return false;
    default:
      return true;
  }
}

}  // namespace twin::measured
