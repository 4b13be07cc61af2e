// The cuda backend's FP8 linear layers (cuda_backend.hpp's FP8 block): the Backend's Fp8Operand mapped onto
// kernels/cuda/fp8_matmul.cuh's, the amaxes written on the device and read back for the interpreter's scaling state,
// and the sm_90 requirement the trainer checks before a run.
#include <fmt/core.h>

#include <memory>
#include <string>

#include "exec/core/check.hpp"
#include "exec/core/errors.hpp"
#include "exec/cuda/cuda_backend.hpp"
#include "exec/cuda/cuda_exec.hpp"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/fp8_matmul.cuh"
#include "kernels/cuda/matmul.cuh"

namespace twin::exec::cuda {

namespace k = twin::kernels::cuda;

namespace {

constexpr int kFp8GemmCapability = 90;  // Hopper: the FP8 GEMMs this backend was written for (issue 27)

k::Fp8Operand kernel_operand(const Fp8Operand& operand) {
  k::Fp8Scaling scaling = k::Fp8Scaling::Current;
  switch (operand.scaling) {
    case Fp8Operand::Scaling::PerTensor:
      scaling = k::Fp8Scaling::PerTensor;
      break;
    case Fp8Operand::Scaling::Current:
      scaling = k::Fp8Scaling::Current;
      break;
    case Fp8Operand::Scaling::Tiles:
      scaling = k::Fp8Scaling::Tiles;
      break;
    case Fp8Operand::Scaling::Blocks:
      scaling = k::Fp8Scaling::Blocks;
      break;
    case Fp8Operand::Scaling::Mx:
      scaling = k::Fp8Scaling::Mx;
      break;
  }
  return k::Fp8Operand{operand.e5m2 ? k::Fp8Format::E5M2 : k::Fp8Format::E4M3, scaling, operand.scale};
}

}  // namespace

std::string fp8_gemm_refusal(int compute_capability) {
  if (compute_capability >= kFp8GemmCapability) return "";
  return fmt::format("model.fp8: the cuda backend's FP8 GEMMs need sm_{} or later (this GPU is sm_{})",
                     kFp8GemmCapability, compute_capability);
}

void require_fp8_gemms(const Backend& backend, const std::string& source) {
  const auto* cuda = dynamic_cast<const CudaBackend*>(&backend);
  if (cuda == nullptr) return;
  const std::string refusal = fp8_gemm_refusal(cuda->compute_capability());
  if (!refusal.empty()) throw RunError(fmt::format("{}: {} (the cpu backend emulates FP8)", source, refusal));
}

int CudaBackend::compute_capability() const {
  int major = 0, minor = 0;
  TWIN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, context_->device()));
  TWIN_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, context_->device()));
  return 10 * major + minor;
}

Fp8Amaxes CudaBackend::do_fp8_matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight,
                                             const Tensor& bias, int rows, int in_features, int out_features,
                                             const Fp8Operand& input, const Fp8Operand& weights) {
  if (!fp8_plans_) fp8_plans_ = std::make_shared<k::Fp8GemmPlans>();
  if (fp8_amaxes_.empty()) fp8_amaxes_ = allocate(3, DType::F32);
  const char* kernel = "fp8_matmul_forward";
  float* amaxes = f32(fp8_amaxes_, kernel, "amaxes");
  k::fp8_matmul_forward(b16(out, kernel, "out"), b16(inp, kernel, "inp"), b16(weight, kernel, "weight"),
                        optional_b16(bias, kernel, "bias"), rows, in_features, out_features, kernel_operand(input),
                        kernel_operand(weights), amaxes, *blas_, *fp8_plans_, context_->compute());
  float host[2] = {0, 0};
  TWIN_CUDA_CHECK(cudaMemcpyAsync(host, amaxes, sizeof(host), cudaMemcpyDeviceToHost, context_->compute()));
  synchronize();
  return {host[0], host[1], 0};
}

Fp8Amaxes CudaBackend::do_fp8_matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                                              const Tensor& dout, const Tensor& inp, const Tensor& weight, int rows,
                                              int in_features, int out_features, const Fp8Operand& input,
                                              const Fp8Operand& weights, const Fp8Operand& gradient) {
  if (!fp8_plans_) fp8_plans_ = std::make_shared<k::Fp8GemmPlans>();
  if (fp8_amaxes_.empty()) fp8_amaxes_ = allocate(3, DType::F32);
  const char* kernel = "fp8_matmul_backward";
  float* amax = f32(fp8_amaxes_, kernel, "amaxes") + 2;
  k::fp8_matmul_backward(optional_b16(dinp, kernel, "dinp"), f32(dweight, kernel, "dweight"),
                         optional_f32(dbias, kernel, "dbias"), b16(dout, kernel, "dout"), b16(inp, kernel, "inp"),
                         b16(weight, kernel, "weight"), rows, in_features, out_features, kernel_operand(input),
                         kernel_operand(weights), kernel_operand(gradient), amax, *blas_, *fp8_plans_,
                         context_->compute());
  float host = 0;
  TWIN_CUDA_CHECK(cudaMemcpyAsync(&host, amax, sizeof(host), cudaMemcpyDeviceToHost, context_->compute()));
  synchronize();
  return {0, 0, host};
}

}  // namespace twin::exec::cuda
