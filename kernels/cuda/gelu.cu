#include "kernels/cuda/gelu.cuh"

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/math.hpp"

namespace twin::kernels::cuda {

using device::bf16;

namespace {

struct Gelu {  // out = gelu(inp)
  __device__ float operator()(std::size_t, float x, float) const { return math::gelu(x); }
};
struct GeluGrad {  // dinp = gelu'(inp) dout
  __device__ float operator()(std::size_t, float x, float dy) const { return math::gelu_grad(x) * dy; }
};

}  // namespace

void gelu_forward(bf16* out, const bf16* inp, std::size_t n, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(n == 0 || (out != nullptr && inp != nullptr));
  if (n == 0) return;
  device::launch_map<1>(out, inp, static_cast<const bf16*>(nullptr), n, Gelu{}, stream);
}

void gelu_backward(bf16* dinp, const bf16* inp, const bf16* dout, std::size_t n, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(n == 0 || (dinp != nullptr && inp != nullptr && dout != nullptr));
  if (n == 0) return;
  device::launch_map<2>(dinp, inp, dout, n, GeluGrad{}, stream);
}

}  // namespace twin::kernels::cuda
