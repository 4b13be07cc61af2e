// What the host issues and where it waits (model/ops/host_issue.hpp): each node's measured host as the default,
// Megatron-Core's synchronize after each batched pipeline exchange, and CUDA graphs (framework.cuda_graphs), which
// issue a layer's kernels with one launch.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/ops/host_issue.hpp"
#include "model/program/program.hpp"
#include "sim/cost_model.hpp"
#include "sim/simulate.hpp"
#include "tests/sim/support.hpp"
#include "topology/host_launch.hpp"

namespace twin::sim {
namespace {

using testing::make_scenario;
using testing::Plan;
using testing::tiny_kernels;

AnalyticalCostModel cost_of(const model::Scenario& scenario) {
  const topology::GpuSpec gpu = topology::node_spec(scenario.cluster.node).gpu;
  return AnalyticalCostModel(gpu, analytical_parameters(gpu, scenario.cluster));
}

double iteration_s(const model::Scenario& scenario, model::Granularity granularity = model::Granularity::Layer,
                   Fidelity fidelity = Fidelity::Rank) {
  const model::Program program = model::build_program(scenario, granularity);
  SimOptions options;
  options.fidelity = fidelity;
  return simulate(program, cost_of(scenario), options).timeline.iteration_time_s;
}

TEST(HostDefault, EachNodeTakesItsMeasuredHostUnlessTheScenarioGivesOne) {
  Plan plan = tiny_kernels();
  for (const char* node : {"dgx-a100", "dgx-h100", "dgx-h200", "dgx-b200", "hgx-h800"}) {
    plan.node = node;
    EXPECT_DOUBLE_EQ(cost_of(make_scenario(plan)).parameters().host_s_per_kernel,
                     topology::kXeon8480cHostUsPerKernel * 1e-6)
        << node;
  }
  plan.node = "gb200-nvl72";
  EXPECT_DOUBLE_EQ(cost_of(make_scenario(plan)).parameters().host_s_per_kernel,
                   topology::kGb200GraceHostUsPerKernel * 1e-6);
  EXPECT_DOUBLE_EQ(cost_of(make_scenario(plan, {"cluster.host_us_per_kernel=5"})).parameters().host_s_per_kernel, 5e-6);
  EXPECT_EQ(cost_of(make_scenario(plan, {"cluster.host_us_per_kernel=0"})).parameters().host_s_per_kernel, 0);
  // The default paces a host-bound plan as the key set to the same value does, and more than a host never behind.
  plan.node = "dgx-h100";
  const double measured = iteration_s(make_scenario(plan));
  EXPECT_DOUBLE_EQ(measured, iteration_s(make_scenario(plan, {"cluster.host_us_per_kernel=13.48"})));
  EXPECT_GT(measured, 1.2 * iteration_s(make_scenario(plan, {"cluster.host_us_per_kernel=0"})));
}

// Megatron-Core outside the interleaved schedule: torch.cuda.synchronize() after every batched exchange.
TEST(PipelineSync, MegatronWaitsAfterEachPipelineExchangeOutsideTheInterleavedSchedule) {
  Plan plan = tiny_kernels();
  plan.pp = 2;
  plan.layers = 8;
  plan.global_batch = 8;
  plan.gpus_per_node = 2;
  const auto waits = [](const model::Scenario& s) {
    int messages = 0, waited = 0;
    const model::Program program = model::build_program(s, model::Granularity::Layer);
    for (const auto& ops : program.stage_ops) {
      for (const model::Op& op : ops) {
        messages += op.kind == model::OpKind::Send || op.kind == model::OpKind::Recv;
        waited += model::host_waits_for(s, op);
      }
    }
    return std::pair{messages, waited};
  };
  const auto [messages, waited] = waits(make_scenario(plan));
  EXPECT_GT(messages, 0);
  EXPECT_EQ(waited, messages);
  plan.schedule = "interleaved";
  plan.virtual_stages = 2;
  EXPECT_EQ(waits(make_scenario(plan)).second, 0);  // overlap_p2p_comm: unbatched, no synchronize
  plan.schedule = "1f1b";
  plan.virtual_stages = 1;
  EXPECT_EQ(waits(make_scenario(plan, {"framework.name=\"deepspeed\""})).second, 0);

  // What the waits cost: the last stage's host cannot issue the first forward before its input has arrived, which
  // takes at least the first stage's host issuing its first forward; after that it issues everything it has. So the
  // iteration lasts at least those two host times; a host that ran ahead would hide the last stage's issuing under
  // the first stage's (the two take about as long).
  const model::Scenario scenario = make_scenario(plan, {"cluster.host_us_per_kernel=100"});
  const AnalyticalCostModel cost = cost_of(scenario);
  const model::Program program = model::build_program(scenario, model::Granularity::Layer);
  double first_forward_s = 0, last_stage_s = 0;
  for (const model::Op& op : program.stage_ops[0]) {
    if (op.kind == model::OpKind::Send) break;
    first_forward_s += cost.host_cost(scenario, op).seconds;
  }
  for (const model::Op& op : program.stage_ops[1]) last_stage_s += cost.host_cost(scenario, op).seconds;
  SimOptions options;
  options.fidelity = Fidelity::Rank;
  const double simulated = simulate(program, cost, options).timeline.iteration_time_s;
  EXPECT_GE(simulated, first_forward_s + last_stage_s);
}

TEST(CudaGraphs, ALayerIsOneLaunchAndAHostBoundPlanRunsFaster) {
  Plan plan = tiny_kernels();
  const model::Scenario eager = make_scenario(plan, {"cluster.host_us_per_kernel=100"});
  const model::Scenario graphs = make_scenario(plan, {"cluster.host_us_per_kernel=100", "framework.cuda_graphs=true"});
  const AnalyticalCostModel cost = cost_of(graphs);
  const model::Program program = model::build_program(graphs, model::Granularity::Layer);
  int layer_ops = 0;
  for (const model::Op& op : program.stage_ops[0]) {
    if (op.what != model::ComputeKind::TransformerLayer) continue;
    ++layer_ops;
    const HostCost host = cost.host_cost(graphs, op);
    EXPECT_EQ(host.kernels, 0);  // a dense layer: all of it in the graph
    EXPECT_DOUBLE_EQ(host.graph_launch_s, 100e-6);
    EXPECT_GT(cost_of(eager).host_cost(eager, op).kernels, 5);
  }
  EXPECT_GT(layer_ops, 0);
  for (const model::Granularity granularity : {model::Granularity::Layer, model::Granularity::Op}) {
    for (const Fidelity fidelity : {Fidelity::Rank, Fidelity::Group}) {
      const double before = iteration_s(eager, granularity, fidelity);
      const double after = iteration_s(graphs, granularity, fidelity);
      // The layers' launches were most of a host-bound iteration; the embedding, the head, the loss and the
      // optimizer stay eager, so not all of it goes.
      EXPECT_LT(after, 0.7 * before) << model::to_string(granularity) << " " << to_string(fidelity);
    }
  }
  // Layer and op granularity issue the same launches: one graph per layer and pass either way.
  EXPECT_NEAR(iteration_s(graphs, model::Granularity::Op), iteration_s(graphs), 0.05 * iteration_s(graphs));
}

TEST(CudaGraphs, DroplessRoutingKeepsTheTokenPathOutOfTheGraph) {
  Plan plan = tiny_kernels();
  plan.gpus_per_node = 2;
  plan.dp = 2;
  const std::vector<std::string> moe = {"cluster.host_us_per_kernel=100", "model.experts=4", "model.top_k=2",
                                        "model.moe_ffn_hidden=256", "parallel.ep=2", "framework.cuda_graphs=true"};
  const model::Scenario dropless = make_scenario(plan, moe);
  std::vector<std::string> capped = moe;
  capped.push_back("model.capacity_factor=1.0");
  const model::Scenario capacity = make_scenario(plan, capped);
  const auto forward_layer_kernels = [](const model::Scenario& s) {
    const AnalyticalCostModel cost = cost_of(s);
    const model::Program program = model::build_program(s, model::Granularity::Layer);
    for (const model::Op& op : program.stage_ops[0]) {
      if (op.what == model::ComputeKind::TransformerLayer && op.phase == model::Phase::Forward) {
        return cost.host_cost(s, op).kernels;
      }
    }
    return -1;
  };
  EXPECT_GT(forward_layer_kernels(dropless), 3);  // permute, the experts' GEMMs, unpermute, the split sync
  EXPECT_EQ(forward_layer_kernels(capacity), 0);  // static sizes: the whole layer in the graph
  // The dropless layer still waits for its split sizes under graphs: the host sync is outside the graph.
  int syncs = 0;
  const model::Program program = model::build_program(dropless, model::Granularity::Layer);
  for (const model::Op& op : program.stage_ops[0]) {
    syncs += model::host_waits_for(dropless, op);
  }
  EXPECT_GT(syncs, 0);
}

TEST(CudaGraphs, RefusedWhereTheyWouldChangeNothing) {
  Plan plan = tiny_kernels();
  try {
    make_scenario(plan, {"cluster.host_us_per_kernel=0", "framework.cuda_graphs=true"});
    ADD_FAILURE() << "a host never behind with CUDA graphs was accepted";
  } catch (const model::ScenarioError& error) {
    EXPECT_NE(std::string(error.what()).find("framework.cuda_graphs"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("cluster.host_us_per_kernel = 0"), std::string::npos) << error.what();
  }
  try {
    make_scenario(plan, {"framework.name=\"deepspeed\"", "framework.cuda_graphs=true"});
    ADD_FAILURE() << "CUDA graphs under DeepSpeed were accepted";
  } catch (const model::ScenarioError& error) {
    EXPECT_NE(std::string(error.what()).find("framework.name = \"megatron\""), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace twin::sim
