#include "exec/train/backend_factory.hpp"

#include <string>

#include "exec/core/errors.hpp"
#include "exec/cpu/cpu_backend.hpp"
#ifdef TWIN_HAVE_CUDA
#include "exec/cuda/cuda_exec.hpp"
#endif

namespace twin::exec {

std::unique_ptr<Backend> make_backend(std::string_view name, const BackendOptions& options) {
  if (name == "cpu") return std::make_unique<cpu::CpuBackend>(options);
#ifdef TWIN_HAVE_CUDA
  if (name == "cuda") return cuda::make_cuda_backend(options);
  throw RunError("unknown backend '" + std::string(name) + "' (this build has: cpu, cuda)");
#else
  if (name == "cuda") throw RunError("--backend cuda: this twin was built without the CUDA toolkit");
  throw RunError("unknown backend '" + std::string(name) + "' (this build has: cpu)");
#endif
}

}  // namespace twin::exec
