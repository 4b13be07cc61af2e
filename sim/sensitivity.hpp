// How a prediction depends on the hardware model's rates: the same Program simulated with one rate at a time lower
// and higher (the GEMM rate, the streaming kernels' HBM bandwidth, the attention GEMMs' share of it, the kernel launch
// rate, NVLink, the network), and the share of the iteration each rate governs. `twin sim --sensitivity`.
#pragma once

#include <string>
#include <vector>

#include "model/program/program.hpp"
#include "sim/cost_model.hpp"
#include "sim/simulate.hpp"
#include "topology/hardware.hpp"

namespace twin::sim {

struct RateSensitivity {
  std::string rate;                            // JSON name: gemm_rate, hbm_bandwidth, ...
  std::string what;                            // for a table
  double lower_s = 0, higher_s = 0;            // iteration time with the rate lower and higher
  double lower_factor = 1, higher_factor = 1;  // the factors applied (none past the datasheet's rate)
  // -d ln T / d ln rate between the two: the share of the iteration this rate governs (1: all of it).
  double elasticity() const;
};

// Each rate `percent` % lower and higher, but never past its datasheet's (a GEMM at most at peak, HBM and links at
// most at their line rates), with everything else as `parameters`, `node`, `fabric` and `options` say; every
// simulation in a child process (options.isolate is set). Throws SimulationError as simulate() does.
std::vector<RateSensitivity> rate_sensitivities(const model::Program& program, const AnalyticalParameters& parameters,
                                                const topology::NodeSpec& node, const topology::FabricSpec& fabric,
                                                SimOptions options, double percent);

// How many simulations rate_sensitivities runs.
int rate_sensitivity_simulations();

}  // namespace twin::sim
