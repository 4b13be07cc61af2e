// What one call of a Transformer Engine module costs the host thread (framework.transformer_engine): Python, TE's
// module and autograd code, and the launches of the module's kernels, as TE's own benchmark measured it.
#pragma once

#include "model/ops/host_issue.hpp"
#include "model/ops/op.hpp"

namespace twin::sim {

// Seconds of one call of `module` in `phase` (Forward or Recompute: its forward; Backward: its backward), FP8 or
// 16-bit, on a host that takes `host_s_per_kernel` to issue one plain PyTorch kernel (the measured host's time scales
// the measurement, see te_host.cpp). A GroupedLinear call is costed here as one Linear call; the caller adds its
// further experts' GEMM launches. 0 for None and FusedIntoModule.
double te_module_host_s(model::TeModule module, model::Phase phase, bool fp8, double host_s_per_kernel);

}  // namespace twin::sim
