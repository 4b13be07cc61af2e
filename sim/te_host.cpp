#include "sim/te_host.hpp"

#include "topology/host_launch.hpp"

namespace twin::sim {

namespace {

// One module's host time per call, microseconds, forward and forward plus backward.
struct ModuleHostUs {
  double forward_us;
  double forward_backward_us;
};

// Transformer Engine pull request #3523 ("Remove the view() calls from Linear/LNLinear/LNMLP modules",
// github.com/NVIDIA/TransformerEngine/pull/3523, September 2026) measured the CPU time of each module's forward and of
// its forward plus backward on GB200 (Grace), before and after the change. twin takes the "before" column: the code
// the releases of 2025-26 that the published Megatron-Bridge runs used had, and the lower of the two public
// measurements of it (TE issue #2053 timed te.Linear's BF16 forward at 99.66 us on GB200 in August 2025, where the
// table's before is 59.19 us: the module got faster between them). MXFP8 is the only FP8 recipe measured; the other
// recipes (delayed, tensorwise, blockwise) take its times.
constexpr ModuleHostUs kLinearBf16{59.19, 311.30};
constexpr ModuleHostUs kLinearFp8{114.51, 440.93};
constexpr ModuleHostUs kLayerNormLinearBf16{83.48, 397.73};
constexpr ModuleHostUs kLayerNormLinearFp8{135.42, 518.67};

}  // namespace

double te_module_host_s(model::TeModule module, model::Phase phase, bool fp8, double host_s_per_kernel) {
  ModuleHostUs measured{};
  switch (module) {
    case model::TeModule::Linear:
    case model::TeModule::GroupedLinear:
      measured = fp8 ? kLinearFp8 : kLinearBf16;
      break;
    case model::TeModule::LayerNormLinear:
      measured = fp8 ? kLayerNormLinearFp8 : kLayerNormLinearBf16;
      break;
    case model::TeModule::None:
    case model::TeModule::FusedIntoModule:
      return 0;
  }
  const double us = phase == model::Phase::Backward ? measured.forward_backward_us - measured.forward_us
                                                    : measured.forward_us;
  // Measured on Grace; another host is as much faster or slower as its time for one plain kernel (torch.nn.Linear's
  // forward, TE issue #2053: 37.08 us on GB200's Grace, 13.48 us on a DGX H100's Xeon 8480C) says: the same Python
  // and launch path, so the same ratio.
  return us * 1e-6 * (host_s_per_kernel / (topology::kGb200GraceHostUsPerKernel * 1e-6));
}

}  // namespace twin::sim
