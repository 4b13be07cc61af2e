// The host keys' rules: where Megatron-Core's CUDA graphs and Transformer Engine's modules apply.
#include <fmt/format.h>

#include "model/scenario/scenario_rules.hpp"

namespace twin::model {

// framework.cuda_graphs changes only what the host issues: it is Megatron-Core's (--enable-cuda-graph,
// --external-cuda-graph), and with a host that is never behind (cluster.host_us_per_kernel = 0) it has nothing to
// remove, so it would do nothing: refused rather than ignored.
void check_cuda_graphs(const Scenario& scenario, std::vector<std::string>& problems) {
  if (!scenario.framework.cuda_graphs) return;
  const std::string& src = scenario.source;
  const std::string what = "framework.cuda_graphs is Megatron-Core's --enable-cuda-graph";
  if (scenario.framework.name != Framework::Megatron) {
    problems.push_back(fmt::format("{}: {}: it needs framework.name = \"megatron\", got \"{}\"", src, what,
                                   to_string(scenario.framework.name)));
  }
  if (scenario.cluster.host_us_per_kernel && *scenario.cluster.host_us_per_kernel == 0) {
    problems.push_back(fmt::format("{}: {}: it removes host launches, and cluster.host_us_per_kernel = 0 says the "
                                   "host is never behind, so it would change nothing (leave the host key unset for "
                                   "the node's measured host)",
                                   src, what));
  }
}

// framework.transformer_engine is Megatron-Core's --transformer-impl: FP8 needs it (Megatron-Core runs FP8 only
// through TE's modules), other frameworks have no such switch, and with a host that is never behind, turning it on
// for a 16-bit plan (its default there is off) would change nothing: refused rather than ignored.
void check_transformer_engine(const Scenario& scenario, std::vector<std::string>& problems) {
  const FrameworkSpec& f = scenario.framework;
  const std::string& src = scenario.source;
  const std::string what = "framework.transformer_engine is Megatron-Core's --transformer-impl transformer_engine";
  if (f.transformer_engine && f.name != Framework::Megatron) {
    problems.push_back(fmt::format("{}: {}: it needs framework.name = \"megatron\", got \"{}\"", src, what,
                                   to_string(f.name)));
  }
  if (!f.transformer_engine && f.name == Framework::Megatron && scenario.model.fp8 != Fp8Format::None) {
    problems.push_back(fmt::format("{}: framework.transformer_engine = false (--transformer-impl local) with model.fp8 = "
                                   "\"{}\": Megatron-Core runs FP8 only through Transformer Engine's modules",
                                   src, to_string(scenario.model.fp8)));
  }
  if (f.transformer_engine && !transformer_engine_by_default(scenario) && scenario.cluster.host_us_per_kernel &&
      *scenario.cluster.host_us_per_kernel == 0) {
    problems.push_back(fmt::format("{}: {}: it changes only the host's time per module call, and "
                                   "cluster.host_us_per_kernel = 0 says the host is never behind, so it would change "
                                   "nothing (leave the host key unset for the node's measured host)",
                                   src, what));
  }
}

}  // namespace twin::model
