// FP8 linear layers (fp8_matmul.cuh): per-tensor recipes on cuBLASLt's FP8 GEMM in the "TN" layout, block-scaled ones
// as quantize-dequantize then the bf16 GEMM. In the TN layout both operands hold K contiguously (row-major (m, k) and
// (n, k)), so each GEMM quantizes its operands as follows (D column-major, as gemm_plan.hpp reads row-major products):
//   fprop  out^T (out_f, rows) = weight (out_f, in_f) . inp (rows, in_f)                   rowwise copies
//   dgrad  dinp^T (in_f, rows) = weight^T (in_f, out_f) . dout (rows, out_f)               weight columnwise
//   wgrad  dweight^T (in_f, out_f) += inp^T (in_f, rows) . dout^T (out_f, rows)            inp and dout columnwise
// ("a . b" = a b^T). The columnwise copies are quantize_fp8_transposed's.
#include "kernels/cuda/fp8_matmul.cuh"

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/gemm_plan.hpp"
#include "kernels/cuda/matmul.cuh"
#include "kernels/cuda/reduce.cuh"

namespace twin::kernels::cuda {

using device::bf16;

namespace {

constexpr int kTile = 128;  // Float8BlockScaling: 1 x 128 tiles, 128 x 128 blocks

std::size_t count(int rows, int cols) {
  return static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
}

// Scratch split into parts of the given byte sizes, each 256-byte aligned.
class Parts {
 public:
  Parts(std::size_t a, std::size_t b, cudaStream_t stream)
      : offset_b_(round_up(a)), scratch_(offset_b_ + round_up(b), stream) {}
  template <class T>
  T* first() const {
    return scratch_.as<T>();
  }
  template <class T>
  T* second() const {
    return reinterpret_cast<T*>(scratch_.as<char>() + offset_b_);
  }

 private:
  static std::size_t round_up(std::size_t bytes) { return (bytes + 255) / 256 * 256; }
  std::size_t offset_b_;
  device::Scratch scratch_;
};

// scale[0], scale[1] = an operand's per-tensor scale and its inverse (from *amax under Current); nothing for the others
void tensor_scale(float* scale, const Fp8Operand& x, const float* amax, cudaStream_t stream) {
  if (!per_tensor(x)) return;
  fp8_tensor_scale(scale, scale + 1, x.scaling == Fp8Scaling::Current ? amax : nullptr, x.scale, x.format, stream);
}

// out (rows, cols) <- inp quantized as `x` says, blocks along rows or down columns, read back (scale: per-tensor ones)
void quantize_dequantize(bf16* out, const bf16* inp, int rows, int cols, const Fp8Operand& x, bool along_columns,
                         const float* scale, cudaStream_t stream) {
  switch (x.scaling) {
    case Fp8Scaling::PerTensor:
    case Fp8Scaling::Current:
      fp8_quantize_dequantize(out, inp, count(rows, cols), scale, x.format, stream);
      return;
    case Fp8Scaling::Tiles:
      fp8_quantize_dequantize_tiles(out, inp, rows, cols, kTile, along_columns, x.format, stream);
      return;
    case Fp8Scaling::Blocks:
      fp8_quantize_dequantize_blocks(out, inp, rows, cols, kTile, x.format, stream);
      return;
    case Fp8Scaling::Mx:
      mxfp8_quantize_dequantize(out, inp, rows, cols, along_columns, x.format, stream);
      return;
  }
}

// Shapes and handles every GEMM of a layer needs.
struct Layer {
  int rows, in_features, out_features;
  Cublas& blas;
  Fp8GemmPlans& plans;
  cudaStream_t stream;
};

// out = q(inp) q(weight)^T + bias on the FP8 GEMM; false when cuBLASLt has no FP8 algorithm for it
bool forward_on_fp8_gemm(const Layer& l, bf16* out, const bf16* inp, const bf16* weight, const bf16* bias,
                         const Fp8Operand& input, const Fp8Operand& weights, const float* input_scale,
                         const float* weight_scale) {
  const Parts bytes(count(l.rows, l.in_features), count(l.out_features, l.in_features), l.stream);
  auto* x8 = bytes.first<std::uint8_t>();
  auto* w8 = bytes.second<std::uint8_t>();
  quantize_fp8(x8, inp, count(l.rows, l.in_features), input_scale, input.format, l.stream);
  quantize_fp8(w8, weight, count(l.out_features, l.in_features), weight_scale, weights.format, l.stream);
  const Fp8Matrix a{w8, weights.format, weight_scale + 1}, b{x8, input.format, input_scale + 1};
  if (try_fp8_gemm(l.blas, l.plans, l.out_features, l.rows, l.in_features, a, b, out, CUDA_R_16BF, false, bias,
                   l.stream)) {
    return true;
  }
  if (bias == nullptr || !try_fp8_gemm(l.blas, l.plans, l.out_features, l.rows, l.in_features, a, b, out, CUDA_R_16BF,
                                       false, nullptr, l.stream)) {
    return false;
  }
  bias_add(out, bias, l.rows, l.out_features, l.stream);  // no FP8 algorithm with the bias epilogue
  return true;
}

// dinp = q(dout) q(weight), K = out_features
void backward_input(const Layer& l, bf16* dinp, const bf16* dout, const bf16* weight, const Fp8Operand& gradient,
                    const Fp8Operand& weights, const float* gradient_scale, const float* weight_scale) {
  const std::size_t n_dout = count(l.rows, l.out_features), n_weight = count(l.out_features, l.in_features);
  if (runs_fp8_gemm(gradient, weights)) {
    const Parts bytes(n_dout, n_weight, l.stream);
    quantize_fp8(bytes.first<std::uint8_t>(), dout, n_dout, gradient_scale, gradient.format, l.stream);
    quantize_fp8_transposed(bytes.second<std::uint8_t>(), weight, l.out_features, l.in_features, weight_scale,
                            weights.format, l.stream);  // (in_f, out_f)
    const Fp8Matrix a{bytes.second<std::uint8_t>(), weights.format, weight_scale + 1};
    const Fp8Matrix b{bytes.first<std::uint8_t>(), gradient.format, gradient_scale + 1};
    if (try_fp8_gemm(l.blas, l.plans, l.in_features, l.rows, l.out_features, a, b, dinp, CUDA_R_16BF, false, nullptr,
                     l.stream)) {
      return;
    }
  }
  const Parts values(n_dout * sizeof(bf16), n_weight * sizeof(bf16), l.stream);
  quantize_dequantize(values.first<bf16>(), dout, l.rows, l.out_features, gradient, false, gradient_scale, l.stream);
  quantize_dequantize(values.second<bf16>(), weight, l.out_features, l.in_features, weights, true, weight_scale,
                      l.stream);
  gemm(l.blas, plan_linear_backward_input(l.rows, l.in_features, l.out_features), values.second<bf16>(),
       values.first<bf16>(), dinp, CUDA_R_16BF, l.stream);
}

// dweight += q(dout)^T q(inp), K = rows
void backward_weight(const Layer& l, float* dweight, const bf16* dout, const bf16* inp, const Fp8Operand& gradient,
                     const Fp8Operand& input, const float* gradient_scale, const float* input_scale) {
  const std::size_t n_dout = count(l.rows, l.out_features), n_inp = count(l.rows, l.in_features);
  if (runs_fp8_gemm(gradient, input)) {
    const Parts bytes(n_dout, n_inp, l.stream);
    quantize_fp8_transposed(bytes.first<std::uint8_t>(), dout, l.rows, l.out_features, gradient_scale, gradient.format,
                            l.stream);  // (out_f, rows)
    quantize_fp8_transposed(bytes.second<std::uint8_t>(), inp, l.rows, l.in_features, input_scale, input.format,
                            l.stream);  // (in_f, rows)
    const Fp8Matrix a{bytes.second<std::uint8_t>(), input.format, input_scale + 1};
    const Fp8Matrix b{bytes.first<std::uint8_t>(), gradient.format, gradient_scale + 1};
    if (try_fp8_gemm(l.blas, l.plans, l.in_features, l.out_features, l.rows, a, b, dweight, CUDA_R_32F, true, nullptr,
                     l.stream)) {
      return;
    }
  }
  const Parts values(n_dout * sizeof(bf16), n_inp * sizeof(bf16), l.stream);
  quantize_dequantize(values.first<bf16>(), dout, l.rows, l.out_features, gradient, true, gradient_scale, l.stream);
  quantize_dequantize(values.second<bf16>(), inp, l.rows, l.in_features, input, true, input_scale, l.stream);
  gemm(l.blas, plan_linear_backward_weight(l.rows, l.in_features, l.out_features), values.second<bf16>(),
       values.first<bf16>(), dweight, CUDA_R_32F, l.stream);
}

}  // namespace

void fp8_matmul_forward(bf16* out, const bf16* inp, const bf16* weight, const bf16* bias, int rows, int in_features,
                        int out_features, const Fp8Operand& input, const Fp8Operand& weights, float* amaxes,
                        Cublas& blas, Fp8GemmPlans& plans, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(rows > 0 && in_features > 0 && out_features > 0);
  TWIN_CUDA_REQUIRE(out != nullptr && inp != nullptr && weight != nullptr && amaxes != nullptr);
  TWIN_CUDA_REQUIRE(out != inp && out != weight);
  const std::size_t n_inp = count(rows, in_features), n_weight = count(out_features, in_features);
  TWIN_CUDA_CHECK(cudaMemsetAsync(amaxes, 0, 2 * sizeof(float), stream));
  absolute_max(amaxes, inp, n_inp, stream);
  absolute_max(amaxes + 1, weight, n_weight, stream);
  const device::Scratch scales(4 * sizeof(float), stream);  // input's scale and inverse, then the weight's
  float* input_scale = scales.as<float>();
  float* weight_scale = input_scale + 2;
  tensor_scale(input_scale, input, amaxes, stream);
  tensor_scale(weight_scale, weights, amaxes + 1, stream);
  const Layer l{rows, in_features, out_features, blas, plans, stream};
  if (runs_fp8_gemm(input, weights) &&
      forward_on_fp8_gemm(l, out, inp, weight, bias, input, weights, input_scale, weight_scale)) {
    return;
  }
  const Parts values(n_inp * sizeof(bf16), n_weight * sizeof(bf16), stream);
  quantize_dequantize(values.first<bf16>(), inp, rows, in_features, input, false, input_scale, stream);
  quantize_dequantize(values.second<bf16>(), weight, out_features, in_features, weights, false, weight_scale, stream);
  matmul_forward(out, values.first<bf16>(), values.second<bf16>(), bias, rows, in_features, out_features, blas, stream);
}

void fp8_matmul_backward(bf16* dinp, float* dweight, float* dbias, const bf16* dout, const bf16* inp,
                         const bf16* weight, int rows, int in_features, int out_features, const Fp8Operand& input,
                         const Fp8Operand& weights, const Fp8Operand& gradient, float* amax, Cublas& blas,
                         Fp8GemmPlans& plans, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(rows > 0 && in_features > 0 && out_features > 0);
  TWIN_CUDA_REQUIRE(dweight != nullptr && dout != nullptr && inp != nullptr && amax != nullptr);
  TWIN_CUDA_REQUIRE(dinp == nullptr || (weight != nullptr && dinp != dout && dinp != inp && dinp != weight));
  TWIN_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream));
  absolute_max(amax, dout, count(rows, out_features), stream);
  if (dbias != nullptr) bias_backward(dbias, dout, rows, out_features, stream);  // the unquantized dout, as TE
  const device::Scratch scales(6 * sizeof(float), stream);  // gradient, weight, input: scale and inverse each
  float* gradient_scale = scales.as<float>();
  float* weight_scale = gradient_scale + 2;
  float* input_scale = gradient_scale + 4;
  tensor_scale(gradient_scale, gradient, amax, stream);
  const Layer l{rows, in_features, out_features, blas, plans, stream};
  if (dinp != nullptr) {
    const device::Scratch weight_amax(sizeof(float), stream);  // tensorwise: the weight's own amax
    if (weights.scaling == Fp8Scaling::Current) {
      TWIN_CUDA_CHECK(cudaMemsetAsync(weight_amax.as<float>(), 0, sizeof(float), stream));
      absolute_max(weight_amax.as<float>(), weight, count(out_features, in_features), stream);
    }
    tensor_scale(weight_scale, weights, weight_amax.as<float>(), stream);
    backward_input(l, dinp, dout, weight, gradient, weights, gradient_scale, weight_scale);
  }
  const device::Scratch input_amax(sizeof(float), stream);
  if (input.scaling == Fp8Scaling::Current) {
    TWIN_CUDA_CHECK(cudaMemsetAsync(input_amax.as<float>(), 0, sizeof(float), stream));
    absolute_max(input_amax.as<float>(), inp, count(rows, in_features), stream);
  }
  tensor_scale(input_scale, input, input_amax.as<float>(), stream);
  backward_weight(l, dweight, dout, inp, gradient, input, gradient_scale, input_scale);
}

}  // namespace twin::kernels::cuda
