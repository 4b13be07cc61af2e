// Transformer Engine's modules on the host (framework.transformer_engine, model::te_module, sim/te_host.hpp): each
// linear layer's call costs the host its measured time, a grouped one a call plus a launch per further expert, and a
// host-bound plan runs slower for it at both granularities and fidelities.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/ops/host_issue.hpp"
#include "model/program/program.hpp"
#include "sim/cost_model.hpp"
#include "sim/simulate.hpp"
#include "sim/te_host.hpp"
#include "tests/sim/support.hpp"
#include "topology/host_launch.hpp"

namespace twin::sim {
namespace {

using testing::make_scenario;
using testing::Plan;
using testing::tiny_kernels;

AnalyticalCostModel te_cost_of(const model::Scenario& scenario) {
  const topology::GpuSpec gpu = topology::node_spec(scenario.cluster.node).gpu;
  return AnalyticalCostModel(gpu, analytical_parameters(gpu, scenario.cluster));
}

double te_iteration_s(const model::Scenario& scenario, model::Granularity granularity, Fidelity fidelity) {
  const model::Program program = model::build_program(scenario, granularity);
  SimOptions options;
  options.fidelity = fidelity;
  return simulate(program, te_cost_of(scenario), options).timeline.iteration_time_s;
}

// The first op of stage 0 at op granularity that is `what` in `phase`.
model::Op first_op(const model::Scenario& s, model::ComputeKind what, model::Phase phase) {
  const model::Program program = model::build_program(s, model::Granularity::Op);
  for (const model::Op& op : program.stage_ops[0]) {
    if (op.kind == model::OpKind::Compute && op.what == what && op.phase == phase) return op;
  }
  ADD_FAILURE() << "no " << model::to_string(what) << " op";
  return {};
}

TEST(TeHost, ModulesCostTheirMeasuredCallsOnTheHostAndTheFusedNormNothing) {
  Plan plan = tiny_kernels();
  plan.node = "dgx-h100";
  const model::Scenario te = make_scenario(plan, {"framework.transformer_engine=true"});
  const model::Scenario local = make_scenario(plan);
  const double per_kernel_s = topology::kXeon8480cHostUsPerKernel * 1e-6;  // the DGX H100's host
  const AnalyticalCostModel cost = te_cost_of(te);
  using model::ComputeKind;
  using model::Phase;
  // The TE table, scaled to the node's host: a LayerNormLinear call costs more than a Linear one, a backward more
  // than a forward, and a Linear forward more than one plain torch.nn.Linear call (59.19 against 37.08 us on Grace).
  const auto host = [&](ComputeKind what, Phase phase) {
    return cost.host_cost(te, first_op(te, what, phase)).seconds;
  };
  const double qkv = host(ComputeKind::QkvProjection, Phase::Forward);
  const double proj = host(ComputeKind::AttentionProjection, Phase::Forward);
  EXPECT_DOUBLE_EQ(qkv, te_module_host_s(model::TeModule::LayerNormLinear, Phase::Forward, false, per_kernel_s));
  EXPECT_GT(qkv, proj);
  EXPECT_GT(host(ComputeKind::AttentionProjection, Phase::Backward), 2 * proj);
  EXPECT_GT(proj, 1.5 * per_kernel_s);
  EXPECT_GT(cost.host_cost(local, first_op(local, ComputeKind::AttentionProjection, Phase::Forward)).seconds, 0);
  EXPECT_EQ(host(ComputeKind::LayerNormAttention, Phase::Forward), 0);  // issued by the QKV module's call
  EXPECT_EQ(host(ComputeKind::MlpUp, Phase::Forward), qkv);             // the MLP's LayerNormLinear
  // Outside the modules, kernel by kernel as before.
  EXPECT_DOUBLE_EQ(host(ComputeKind::AttentionCore, Phase::Forward),
                   cost.host_cost(local, first_op(local, ComputeKind::AttentionCore, Phase::Forward)).seconds);
  // FP8 modules cost more (quantizers, scale bookkeeping); Grace's host as much more as its plain launch.
  EXPECT_GT(te_module_host_s(model::TeModule::Linear, Phase::Forward, true, per_kernel_s),
            te_module_host_s(model::TeModule::Linear, Phase::Forward, false, per_kernel_s));
  EXPECT_NEAR(
      te_module_host_s(model::TeModule::Linear, Phase::Forward, false, topology::kGb200GraceHostUsPerKernel * 1e-6) /
          te_module_host_s(model::TeModule::Linear, Phase::Forward, false, per_kernel_s),
      topology::kGb200GraceHostUsPerKernel / topology::kXeon8480cHostUsPerKernel, 1e-12);
  // No module, no host: a host never behind stays so.
  EXPECT_EQ(te_module_host_s(model::TeModule::Linear, Phase::Backward, true, 0), 0);
}

TEST(TeHost, AGroupedLinearIsOneCallAndALaunchForEachFurtherExpert) {
  Plan plan = tiny_kernels();
  plan.gpus_per_node = 2;
  plan.dp = 2;
  const std::vector<std::string> moe = {"model.experts=8", "model.top_k=2", "model.moe_ffn_hidden=256", "parallel.ep=2",
                                        "framework.transformer_engine=true"};
  const model::Scenario s = make_scenario(plan, moe);
  const double per_kernel_s = te_cost_of(s).parameters().host_s_per_kernel;
  for (const model::Phase phase : {model::Phase::Forward, model::Phase::Backward}) {
    const model::Op up = first_op(s, model::ComputeKind::ExpertUp, phase);
    ASSERT_EQ(up.gemm.count, 4);  // 8 experts over EP 2
    const int gemms_per_expert = phase == model::Phase::Backward ? 2 : 1;
    // Beside the module, the dispatcher's sort of the 4 experts' rows (model/ops/moe_ops.cpp): its map kernel and copy
    // forward, one copy backward, launched by Megatron-Core's Python around the call.
    const int sort_launches = phase == model::Phase::Backward ? 1 : 2;
    EXPECT_NEAR(te_cost_of(s).host_cost(s, up).seconds,
                te_module_host_s(model::TeModule::GroupedLinear, phase, false, per_kernel_s) +
                    (3 * gemms_per_expert + sort_launches) * per_kernel_s,
                1e-12)
        << model::to_string(phase);
  }
  // An MoE layer's norm before the experts stands alone (a TENorm): kernel by kernel.
  EXPECT_EQ(model::te_module(s, first_op(s, model::ComputeKind::LayerNormMlp, model::Phase::Forward)),
            model::TeModule::None);
}

TEST(TeHost, AHostBoundPlanRunsSlowerAtBothGranularitiesAndFidelities) {
  Plan plan = tiny_kernels();
  plan.pp = 2;
  plan.gpus_per_node = 2;
  plan.global_batch = 8;
  const model::Scenario local = make_scenario(plan, {"cluster.host_us_per_kernel=20"});
  const model::Scenario te =
      make_scenario(plan, {"cluster.host_us_per_kernel=20", "framework.transformer_engine=true"});
  for (const model::Granularity granularity : {model::Granularity::Layer, model::Granularity::Op}) {
    for (const Fidelity fidelity : {Fidelity::Rank, Fidelity::Group}) {
      // Each linear layer's call costs 1.6 to 8.5 plain launches' time (TE's table over torch.nn.Linear's 37.08 us)
      // where its one or two launches cost one each, on a plan whose host already paces it: a fifth slower at least.
      EXPECT_GT(te_iteration_s(te, granularity, fidelity), 1.2 * te_iteration_s(local, granularity, fidelity))
          << model::to_string(granularity) << " " << to_string(fidelity);
    }
  }
  // Layer and op granularity issue the same module calls.
  const double op = te_iteration_s(te, model::Granularity::Op, Fidelity::Rank);
  EXPECT_NEAR(te_iteration_s(te, model::Granularity::Layer, Fidelity::Rank), op, 0.05 * op);
}

TEST(TeHost, OnWithFp8ByDefaultAndRefusedWhereItCannotBe) {
  Plan plan = tiny_kernels();
  plan.node = "dgx-h100";  // FP8 tensor cores
  EXPECT_FALSE(make_scenario(plan).framework.transformer_engine);
  const model::Scenario fp8 = make_scenario(plan, {"model.fp8=\"hybrid\""});
  EXPECT_TRUE(fp8.framework.transformer_engine);
  // The key round-trips where it differs from its default, and only there.
  const model::Scenario on = make_scenario(plan, {"framework.transformer_engine=true"});
  EXPECT_NE(model::to_toml(on).find("transformer_engine = true"), std::string::npos);
  EXPECT_EQ(model::to_toml(fp8).find("transformer_engine"), std::string::npos);
  EXPECT_TRUE(model::parse_scenario(model::to_toml(on), "round trip").framework.transformer_engine);
  const auto refused = [&](const std::vector<std::string>& sets, const std::string& says) {
    try {
      make_scenario(plan, sets);
      ADD_FAILURE() << "accepted: " << sets.back();
    } catch (const model::ScenarioError& error) {
      EXPECT_NE(std::string(error.what()).find(says), std::string::npos) << error.what();
    }
  };
  refused({"model.fp8=\"hybrid\"", "framework.transformer_engine=false"}, "framework.transformer_engine = false");
  refused({"framework.name=\"deepspeed\"", "framework.transformer_engine=true"}, "framework.name = \"megatron\"");
  refused({"cluster.host_us_per_kernel=0", "framework.transformer_engine=true"}, "cluster.host_us_per_kernel = 0");
}

}  // namespace
}  // namespace twin::sim
