// The FP8 GEMMs' public methods: the shapes every backend's kernels need, checked once, then the kernel.
#include "exec/core/fp8_kernels.hpp"

#include "exec/core/check.hpp"
#include "exec/core/sizes.hpp"

namespace twin::exec {

Fp8Amaxes Fp8Kernels::fp8_matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,
                                         int rows, int in_features, int out_features, const Fp8Operand& input,
                                         const Fp8Operand& weights) {
  TWIN_EXEC_CHECK(out.numel == numel(rows, out_features) && inp.numel == numel(rows, in_features) &&
                      weight.numel == numel(out_features, in_features) &&
                      (bias.empty() || bias.numel == sz(out_features)),
                  "fp8_matmul_forward: out {} inp {} weight {} bias {} for rows {} in {} out {}", out.numel, inp.numel,
                  weight.numel, bias.numel, rows, in_features, out_features);
  before_kernel("fp8_matmul_forward", {{out, "out"}, {inp, "inp"}, {weight, "weight"}, {bias, "bias"}});
  return do_fp8_matmul_forward(out, inp, weight, bias, rows, in_features, out_features, input, weights);
}

Fp8Amaxes Fp8Kernels::fp8_matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                                          const Tensor& dout, const Tensor& inp, const Tensor& weight, int rows,
                                          int in_features, int out_features, const Fp8Operand& input,
                                          const Fp8Operand& weights, const Fp8Operand& gradient) {
  TWIN_EXEC_CHECK(dout.numel == numel(rows, out_features) && inp.numel == numel(rows, in_features) &&
                      weight.numel == numel(out_features, in_features) &&
                      (dweight.numel == weight.numel || (dweight.empty() && splits_fp8_backward())) &&
                      (dinp.empty() || dinp.numel == inp.numel) && (dbias.empty() || dbias.numel == sz(out_features)),
                  "fp8_matmul_backward: dinp {} dweight {} dbias {} dout {} inp {} for rows {} in {} out {}",
                  dinp.numel, dweight.numel, dbias.numel, dout.numel, inp.numel, rows, in_features, out_features);
  before_kernel(
      "fp8_matmul_backward",
      {{dinp, "dinp"}, {dweight, "dweight"}, {dbias, "dbias"}, {dout, "dout"}, {inp, "inp"}, {weight, "weight"}});
  return do_fp8_matmul_backward(dinp, dweight, dbias, dout, inp, weight, rows, in_features, out_features, input,
                                weights, gradient);
}

}  // namespace twin::exec
