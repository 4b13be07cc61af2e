// The backend factory: the one place that knows every device backend the build has.
#pragma once

#include <memory>
#include <string_view>

#include "exec/core/backend.hpp"

namespace twin::exec {

// "cpu" (always); "cuda" when built with the CUDA toolkit (exec/cuda/). Throws RunError naming the known backends
// otherwise.
std::unique_ptr<Backend> make_backend(std::string_view name, const BackendOptions& options = {});

}  // namespace twin::exec
