// Fp8Kernels: the FP8 GEMMs a backend may provide (Backend::fp8()), apart from the dense core. A backend without them
// trains no model.fp8 scenario: check_supported (exec/train/check_supported.hpp) refuses it by name before training.
// As Backend, the public methods check shapes (fp8_kernels.cpp) and call the protected do_ kernels.
#pragma once

#include "exec/core/kernel_hook.hpp"
#include "exec/core/tensor.hpp"

namespace twin::exec {

// How one operand of an FP8 GEMM is quantized (model.fp8, framework.fp8_recipe; kernels/cpu/fp8_matmul.hpp).
struct Fp8Operand {
  enum class Scaling : unsigned char {
    PerTensor,  // one given scale (delayed scaling)
    Current,    // one scale from the tensor's own amax (tensorwise)
    Tiles,      // a power-of-2 scale per 1 x 128 tile along K (blockwise: activations and gradients)
    Blocks,     // a power-of-2 scale per 128 x 128 block (blockwise: weights)
    Mx,         // an E8M0 scale per 32 elements along K (mxfp8)
  };
  bool e5m2 = false;  // E5M2 (the output gradient under the hybrid format), else E4M3
  Scaling scaling = Scaling::Current;
  float scale = 1.0f;  // PerTensor only
};
// The amaxes of the high-precision operands an FP8 GEMM call quantized (what delayed scaling records).
struct Fp8Amaxes {
  float input = 0, weight = 0, gradient = 0;
};

class Fp8Kernels : public HookPoint {
 public:
  virtual ~Fp8Kernels() = default;

  // The same GEMMs with FP8 operands: each operand quantized as its Fp8Operand says, along the GEMM's own K (TE's
  // rowwise / columnwise copies), and multiplied in fp32; the bias gradient from the unquantized dout. Returns the
  // amaxes of what it quantized. Backward, where splits_fp8_backward(): an empty dinp or dweight skips that GEMM (a
  // zero-bubble schedule's B and W call it once each, exec/interpreter/fp8_linear.hpp).
  Fp8Amaxes fp8_matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias, int rows,
                               int in_features, int out_features, const Fp8Operand& input, const Fp8Operand& weights);
  Fp8Amaxes fp8_matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                                const Tensor& inp, const Tensor& weight, int rows, int in_features, int out_features,
                                const Fp8Operand& input, const Fp8Operand& weights, const Fp8Operand& gradient);
  // Whether fp8_matmul_backward takes an empty dweight (the cpu backend's; the cuda backend's FP8 GEMMs compute the
  // weight gradient with the input's).
  virtual bool splits_fp8_backward() const { return false; }

 protected:
  virtual Fp8Amaxes do_fp8_matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight,
                                          const Tensor& bias, int rows, int in_features, int out_features,
                                          const Fp8Operand& input, const Fp8Operand& weights) = 0;
  virtual Fp8Amaxes do_fp8_matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                                           const Tensor& dout, const Tensor& inp, const Tensor& weight, int rows,
                                           int in_features, int out_features, const Fp8Operand& input,
                                           const Fp8Operand& weights, const Fp8Operand& gradient) = 0;
};

}  // namespace twin::exec
