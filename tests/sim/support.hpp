// Helpers for the simulator tests: scenarios from TOML text, and hand-made Programs.
#pragma once

#include <string>
#include <vector>

#include <fmt/format.h>

#include "model/program/program.hpp"
#include "model/scenario/scenario.hpp"
#include "sim/cost_model.hpp"
#include "sim/simulate.hpp"
#include "topology/hardware.hpp"

namespace twin::testing {

// A small GPT on DGX A100 nodes; every argument is a scenario key.
struct Plan {
  int layers = 8, hidden = 1024, heads = 16, seq = 1024, vocab = 50257;
  int tp = 1, pp = 1, dp = 1, micro_batch = 1, global_batch = 8, virtual_stages = 1, nodes = 1;
  int gpus_per_node = 0;  // 0: the node's (8)
  std::string schedule = "1f1b", recompute = "none", node = "dgx-a100";
  bool dp_overlap = false, sequence_parallel = false;
  int zero_stage = 0;
};

// `sets`: overrides on top, as --set takes them ("model.experts=8").
// 16 DGX A100 nodes: TP 8 x PP 4 x DP 4 (ZeRO-1, full recompute), real costs, real network.
inline Plan sixteen_nodes() {
  Plan plan;
  plan.layers = 16;
  plan.hidden = 4096;
  plan.heads = 32;
  plan.seq = 2048;
  plan.tp = 8;
  plan.pp = 4;
  plan.dp = 4;
  plan.nodes = 16;
  plan.global_batch = 64;
  plan.recompute = "full";
  plan.zero_stage = 1;
  return plan;
}

// Microsecond kernels: 4 layers of hidden 256 on sequences of 256, one sequence per micro-batch, on one GPU (a host
// at tens of microseconds a kernel sets the pace: tests/sim/host_test.cpp, host_issue_test.cpp).
inline Plan tiny_kernels() {
  Plan plan;
  plan.layers = 4;
  plan.hidden = 256;
  plan.heads = 4;
  plan.seq = 256;
  plan.vocab = 1024;
  plan.global_batch = 4;
  plan.gpus_per_node = 1;
  return plan;
}

inline model::Scenario make_scenario(const Plan& p, const std::vector<std::string>& sets = {}) {
  const std::string toml = fmt::format(R"(
[model]
name = "test-gpt"
layers = {}
hidden = {}
heads = {}
seq_len = {}
vocab = {}
dtype = "bf16"
[parallel]
tp = {}
pp = {}
dp = {}
micro_batch = {}
global_batch = {}
schedule = "{}"
virtual_stages = {}
recompute = "{}"
dp_overlap = {}
sequence_parallel = {}
zero_stage = {}
[cluster]
nodes = {}
node = "{}"
{}
)",
                                       p.layers, p.hidden, p.heads, p.seq, p.vocab, p.tp, p.pp, p.dp, p.micro_batch,
                                       p.global_batch, p.schedule, p.virtual_stages, p.recompute, p.dp_overlap,
                                       p.sequence_parallel, p.zero_stage, p.nodes, p.node,
                                       p.gpus_per_node > 0 ? fmt::format("gpus_per_node = {}", p.gpus_per_node) : "");
  std::vector<model::Override> overrides;
  for (const std::string& set : sets) overrides.push_back(model::parse_override(set));
  return model::parse_scenario(toml, "test", overrides);
}

// 4 MoE layers of 64 experts of width 256 (16 a rank over ep 4: 16 GEMM launches per grouped GEMM), top 2, hidden
// 2048, on 4 GPUs of one A100 node, 2 micro-batches: the MoE host-sync tests' plan (moe_host_sync_test.cpp,
// pad_to_capacity_test.cpp); `sets` on top (another plan family: "parallel.pp=2", ...).
inline model::Scenario small_moe_scenario(const std::vector<std::string>& sets = {}) {
  Plan plan;
  plan.layers = 4;
  plan.hidden = 2048;
  plan.heads = 16;
  plan.seq = 2048;
  plan.vocab = 4096;
  plan.dp = 4;
  plan.global_batch = 8;
  plan.gpus_per_node = 4;
  std::vector<std::string> all = {"model.experts=64", "model.top_k=2", "model.moe_ffn_hidden=256", "parallel.ep=4"};
  all.insert(all.end(), sets.begin(), sets.end());
  return make_scenario(plan, all);
}

// `s`'s iteration on A100s with the host issuing each kernel in `host_us_per_kernel` (0: a host never behind), at one
// granularity and fidelity: the MoE mechanisms' tests (pad_to_capacity_test.cpp, flex_dispatcher_test.cpp).
inline double moe_iteration_s(const model::Scenario& s, double host_us_per_kernel,
                              model::Granularity granularity = model::Granularity::Op,
                              sim::Fidelity fidelity = sim::Fidelity::Rank) {
  model::ClusterSpec cluster = s.cluster;
  cluster.host_us_per_kernel = host_us_per_kernel;
  const topology::GpuSpec gpu = topology::a100_sxm4_80gb();
  const sim::AnalyticalCostModel cost(gpu, sim::analytical_parameters(gpu, cluster));
  sim::SimOptions options;
  options.fidelity = fidelity;
  return sim::simulate(model::build_program(s, granularity), cost, options).timeline.iteration_time_s;
}

// A Program whose every stage runs `ops` (hand-written), on the scenario's layout.
inline model::Program hand_program(const model::Scenario& scenario, std::vector<std::vector<model::Op>> stage_ops) {
  model::Program program;
  program.scenario = scenario;
  program.granularity = model::Granularity::Layer;
  program.layout = model::RankLayout(static_cast<int>(scenario.parallel.tp), static_cast<int>(scenario.parallel.pp),
                                     static_cast<int>(scenario.parallel.dp));
  program.stage_ops = std::move(stage_ops);
  program.exchange_issue = model::exchange_issue(scenario);
  for (int stage = 0; stage < program.stages(); ++stage) {
    program.stage_exchanges.push_back(model::pipeline_exchanges(scenario, program.stage_ops[stage], stage));
  }
  return program;
}

inline model::Op collective(model::CollectiveKind kind, model::Group group, double bytes) {
  model::Op op;
  op.kind = model::OpKind::Collective;
  op.collective = kind;
  op.group = group;
  op.bytes = bytes;
  return op;
}

}  // namespace twin::testing
