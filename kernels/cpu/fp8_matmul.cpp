// FP8 GEMMs emulated: quantize each operand for the GEMM at hand (fp8.hpp), then matmul.hpp's fp32 GEMM. Quantizing
// "along columns" transposes, quantizes rows, and transposes back: the same blocks a column-major copy would hold.
#include "kernels/cpu/fp8_matmul.hpp"

#include <cstddef>
#include <vector>

#include "kernels/cpu/check.hpp"
#include "kernels/cpu/elementwise.hpp"
#include "kernels/cpu/matmul.hpp"

namespace twin::kernels::cpu {

namespace {

constexpr int kTile = 128;  // Float8BlockScaling: 1 x 128 tiles, 128 x 128 blocks

void transpose(float* out, const float* inp, int rows, int cols) {
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c)
      out[static_cast<std::size_t>(c) * rows + r] = inp[static_cast<std::size_t>(r) * cols + c];
  }
}

void quantize_rows(float* out, const float* inp, int rows, int cols, const Fp8Operand& operand) {
  const std::size_t n = static_cast<std::size_t>(rows) * cols;
  switch (operand.scaling) {
    case Fp8Scaling::PerTensor:
      fp8_quantize_dequantize(out, inp, n, operand.scale, operand.format);
      return;
    case Fp8Scaling::Current:
      fp8_quantize_dequantize(out, inp, n, fp8_scale_from_amax(absolute_max(inp, n), fp8_max(operand.format), 1.0f),
                              operand.format);
      return;
    case Fp8Scaling::Tiles:
      fp8_quantize_dequantize_row_tiles(out, inp, rows, cols, kTile, operand.format);
      return;
    case Fp8Scaling::Blocks:
      fp8_quantize_dequantize_blocks(out, inp, rows, cols, kTile, operand.format);
      return;
    case Fp8Scaling::Mx:
      mxfp8_quantize_dequantize(out, inp, rows, cols, operand.format);
      return;
  }
}

std::vector<float> quantized(const float* inp, int rows, int cols, const Fp8Operand& operand, bool along_columns) {
  std::vector<float> out(static_cast<std::size_t>(rows) * cols);
  fp8_quantize_operand(out.data(), inp, rows, cols, operand, along_columns);
  return out;
}

}  // namespace

void fp8_quantize_operand(float* out, const float* inp, int rows, int cols, const Fp8Operand& operand,
                          bool along_columns) {
  TWIN_KERNEL_CHECK(rows >= 0 && cols >= 0 && out != inp);
  const bool directed = operand.scaling == Fp8Scaling::Tiles || operand.scaling == Fp8Scaling::Mx;
  if (!along_columns || !directed) {  // per-tensor scales and square blocks look the same either way
    quantize_rows(out, inp, rows, cols, operand);
    return;
  }
  std::vector<float> columns(static_cast<std::size_t>(rows) * cols), done(columns.size());
  transpose(columns.data(), inp, rows, cols);
  quantize_rows(done.data(), columns.data(), cols, rows, operand);
  transpose(out, done.data(), cols, rows);
}

void fp8_matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int rows, int in_features,
                        int out_features, const Fp8Operand& input, const Fp8Operand& weights) {
  const std::vector<float> x = quantized(inp, rows, in_features, input, false);
  const std::vector<float> w = quantized(weight, out_features, in_features, weights, false);
  matmul_forward(out, x.data(), w.data(), bias, rows, in_features, out_features);
}

void fp8_matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                         const float* weight, int rows, int in_features, int out_features, const Fp8Operand& input,
                         const Fp8Operand& weights, const Fp8Operand& gradient) {
  TWIN_KERNEL_CHECK(rows > 0 && in_features > 0 && out_features > 0 && dout != nullptr && inp != nullptr);
  TWIN_KERNEL_CHECK(dinp == nullptr || (weight != nullptr && dinp != dout && dinp != inp && dinp != weight));
  if (dbias != nullptr) bias_backward(dbias, dout, rows, out_features);
  if (dinp != nullptr) {  // dgrad, K = out_features: dinp (rows, in) = dout (rows, out) @ weight (out, in)
    const std::vector<float> g = quantized(dout, rows, out_features, gradient, false);
    const std::vector<float> w = quantized(weight, out_features, in_features, weights, true);
    detail::gemm(false, false, rows, in_features, out_features, g.data(), w.data(), 0.0f, dinp);
  }
  if (dweight != nullptr) {  // wgrad, K = rows: dweight (out, in) += dout^T (out, rows) @ inp (rows, in)
    const std::vector<float> g = quantized(dout, rows, out_features, gradient, true);
    const std::vector<float> x = quantized(inp, rows, in_features, input, true);
    detail::gemm(true, false, out_features, in_features, rows, g.data(), x.data(), 1.0f, dweight);
  }
}

}  // namespace twin::kernels::cpu
