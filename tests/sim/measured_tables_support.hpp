// Shared by the tests of the measured in-node tables (sim/measured_tables.hpp): a node whose GPU no table names, and
// the engine-level check that the tables lengthen a plan at every fidelity and granularity.
#pragma once

#include <functional>
#include <string>

#include <gtest/gtest.h>

#include "model/program/program.hpp"
#include "sim/cost_model.hpp"
#include "sim/simulate.hpp"
#include "topology/hardware.hpp"

namespace twin::testing {

// The same node under a GPU name no measured table holds: the models as they were before the tables.
inline topology::NodeSpec untabled(topology::NodeSpec node) {
  node.gpu.name = "untabled " + node.gpu.name;
  return node;
}

// `plan(pp)` on one stage and on two, at both fidelities and granularities, on H100 nodes: with the measured tables
// the iteration takes more than 1 % longer than on the untabled node.
inline void expect_tables_lengthen_every_cell(const std::function<model::Scenario(int pp)>& plan) {
  const sim::AnalyticalCostModel cost(topology::h100_sxm5_80gb());
  for (const int pp : {1, 2}) {
    const model::Scenario s = plan(pp);
    for (const sim::Fidelity fidelity : {sim::Fidelity::Rank, sim::Fidelity::Group}) {
      for (const model::Granularity granularity : {model::Granularity::Layer, model::Granularity::Op}) {
        const model::Program program = model::build_program(s, granularity);
        sim::SimOptions options;
        options.fidelity = fidelity;
        const double with_s = sim::simulate(program, cost, options).timeline.iteration_time_s;
        options.node = untabled(topology::dgx_h100());
        const double before_s = sim::simulate(program, cost, options).timeline.iteration_time_s;
        EXPECT_GT(with_s, before_s * 1.01) << "pp " << pp << " fidelity " << sim::to_string(fidelity) << " granularity "
                                           << model::to_string(granularity);
      }
    }
  }
}

}  // namespace twin::testing
