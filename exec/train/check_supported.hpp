// Whether a backend can train a Program, decided before training: the one place that refuses a plan for what a
// backend lacks, so that no kernel throws mid-step.
#pragma once

#include "exec/core/backend.hpp"
#include "model/program/program.hpp"

namespace twin::exec {

// Throws one RunError naming the scenario key and the backend when `program` needs a kernel capability `backend` does
// not provide: model.experts > 0 needs MoeKernels, parallel.cp > 1 ContextKernels, model.fp8 Fp8Kernels
// (exec/core/*_kernels.hpp); then what the executor does not run of those features on any backend
// (refuse_unsupported_moe, refuse_unsupported_context_parallelism). Nothing when it can train it.
void check_supported(const model::Program& program, const Backend& backend);

}  // namespace twin::exec
