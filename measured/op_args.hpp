// What PyTorch's profiler records on an operator (record_shapes=True) says about the work of the kernels it launches.
// The operator's "args" (torch/csrc/profiler/standalone/execution_trace_observer.cpp and profiler_kineto.cpp write
// them):
//   "Input Dims"        the inputs' shapes, [[m, k], [k, n]] ("[]" for a scalar or a list of tensors);
//   "Input type"        their element types: "float", "c10::BFloat16", "c10::Half", "double", "long int", ...;
//   "Concrete Inputs"   scalar arguments as text ("0.0", "True"), PyTorch 2.x;
//   a collective's (record_param_comms, and since PyTorch 2.x the NCCL kernel itself; torch/csrc/distributed/c10d/
//   ParamCommsUtils.hpp): "Collective name", "In msg nelems", "Out msg nelems", "dtype" ("Float", "BFloat16"),
//   "Group size", "Process Group Ranks" ("[0, 1, 2, 3]", truncated with "...]" when long).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "measured/kernel_class.hpp"

namespace twin::measured {

// A GEMM's shape as the operator that ran it was called: [m, k] x [k, n], `batch` times (0: not recorded).
struct MatmulShape {
  std::int64_t m = 0, n = 0, k = 0, batch = 0;
  double flops() const {
    return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) * static_cast<double>(batch);
  }
};

// A collective's size and group as recorded (bytes 0: not recorded).
struct CollectiveCall {
  double bytes = 0;        // the larger of its input and output (nccl-tests' "size"), in bytes
  int group_size = 0;      // ranks in the group
  std::vector<int> ranks;  // the group's global ranks (empty: not recorded)
};

// The shape of a matrix-multiply operator from its input dims: aten::mm [[m,k],[k,n]], aten::addmm [[bias],[m,k],
// [k,n]], aten::bmm [[b,m,k],[b,k,n]], aten::baddbmm [[b,m,n],[b,m,k],[b,k,n]], aten::linear [[..., k], [n, k],
// (bias)], aten::matmul [[..., m, k], [..., k, n]]; nullopt for another operator or shapes that do not fit.
std::optional<MatmulShape> matmul_shape(const std::string& name, const nlohmann::json& args);

// Bytes an operator moves, from its input dims and types: every input read once and an output as large as the
// largest (an elementwise or norm operator's compulsory traffic); 4 bytes an element where no type was recorded.
// 0 when no dims were recorded.
double traffic_bytes(const nlohmann::json& args);

// The FLOPs of a fused attention operator, counted as twin's cost model counts them (sim/cost_model.cpp
// flash_attention_s): forward 4 b h s^2 d, half of it under the causal mask, the backward 2.5 times its forward
// (FlashAttention-2's count, Dao 2023). Read from PyTorch's operators: aten::_scaled_dot_product_flash_attention,
// _efficient_attention, _cudnn_attention and their backward ([b, h, s, d]: the first 4-D input),
// aten::_flash_attention_ forward / backward, aten::_efficient_attention_forward / backward and flash_attn's ([b, s, h,
// d]). The mask from the first boolean of "Concrete Inputs" (is_causal in these signatures); causal when not recorded.
// 0 for another operator.
double attention_flops(const std::string& name, const nlohmann::json& args);

// A collective's size and group from its args; nullopt when "In msg nelems" and "dtype" are not both recorded or the
// dtype is one no table here knows.
std::optional<CollectiveCall> collective_call(const nlohmann::json& args);

// nccl-tests' bus bandwidth factor (github.com/NVIDIA/nccl-tests doc/PERFORMANCE.md): the bytes each rank's links
// carry over the collective's size, so that bus bandwidth = size x factor / time compares across group sizes.
// all-reduce 2 (n-1)/n; all-gather, reduce-scatter, all-to-all (n-1)/n; broadcast, reduce, send/receive 1. `kind` is
// the kernel's (kernel_class.hpp).
double bus_factor(CommKind kind, int group_size);

}  // namespace twin::measured
