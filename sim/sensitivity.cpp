#include "sim/sensitivity.hpp"

#include <algorithm>
#include <cmath>
#include <functional>

namespace twin::sim {
namespace {

// One rate of the hardware model moved by a factor: the cost model's constants, or the node's and fabric's links.
// `scale` returns the factor it applied.
struct Rate {
  const char* key;
  const char* what;
  std::function<double(AnalyticalParameters&, topology::NodeSpec&, topology::FabricSpec&, double)> scale;
};

// value * factor, at most `ceiling`; returns the factor applied.
double scale_capped(double& value, double factor, double ceiling) {
  const double before = value;
  value = std::min(ceiling, value * factor);
  return before > 0 ? value / before : factor;
}

const std::vector<Rate>& rates() {
  static const std::vector<Rate> list = {
      {"gemm_rate", "GEMM rate",
       [](AnalyticalParameters& p, topology::NodeSpec&, topology::FabricSpec&, double f) {
         return scale_capped(p.gemm_efficiency, f, 1.0);
       }},
      {"hbm_bandwidth", "HBM bandwidth (streaming kernels)",
       [](AnalyticalParameters& p, topology::NodeSpec&, topology::FabricSpec&, double f) {
         return scale_capped(p.hbm_efficiency, f, 1.0);
       }},
      {"attention_gemm_hbm_fraction", "attention GEMMs' share of HBM",
       [](AnalyticalParameters& p, topology::NodeSpec&, topology::FabricSpec&, double f) {
         return scale_capped(p.attention_gemm_hbm_fraction, f, 1.0);
       }},
      {"kernel_launch", "kernel launch rate",
       [](AnalyticalParameters& p, topology::NodeSpec&, topology::FabricSpec&, double f) {
         p.kernel_launch_s /= f;
         return f;
       }},
      {"nvlink_bandwidth", "NVLink bandwidth",
       [](AnalyticalParameters&, topology::NodeSpec& n, topology::FabricSpec&, double f) {
         return scale_capped(n.nvlink_effective_bytes_per_s, f, n.nvlink_bytes_per_s);
       }},
      {"network_bandwidth", "network bandwidth (NICs and fabric)",
       [](AnalyticalParameters&, topology::NodeSpec& n, topology::FabricSpec& fabric, double f) {
         const double applied = scale_capped(n.nic_effective_bytes_per_s, f, n.nic_bytes_per_s);
         fabric.link_bytes_per_s *= applied;
         return applied;
       }},
  };
  return list;
}

}  // namespace

double RateSensitivity::elasticity() const {
  const double span = std::log(higher_factor) - std::log(lower_factor);
  return span > 0 ? (std::log(lower_s) - std::log(higher_s)) / span : 0.0;
}

int rate_sensitivity_simulations() {
  return 2 * static_cast<int>(rates().size());
}

std::vector<RateSensitivity> rate_sensitivities(const model::Program& program, const AnalyticalParameters& parameters,
                                                const topology::NodeSpec& node, const topology::FabricSpec& fabric,
                                                SimOptions options, double percent) {
  options.isolate = true;
  options.progress = false;
  const double f = percent / 100;
  std::vector<RateSensitivity> out;
  for (const Rate& rate : rates()) {
    RateSensitivity one{rate.key, rate.what};
    for (const double factor : {1 - f, 1 + f}) {
      AnalyticalParameters moved = parameters;
      topology::NodeSpec moved_node = node;
      topology::FabricSpec moved_fabric = fabric;
      const double applied = rate.scale(moved, moved_node, moved_fabric, factor);
      options.node = moved_node;
      options.fabric = moved_fabric;
      const double t = simulate(program, AnalyticalCostModel(node.gpu, moved), options).timeline.iteration_time_s;
      (factor < 1 ? one.lower_factor : one.higher_factor) = applied;
      (factor < 1 ? one.lower_s : one.higher_s) = t;
    }
    out.push_back(one);
  }
  return out;
}

}  // namespace twin::sim
