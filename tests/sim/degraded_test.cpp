// Stragglers and degraded parts (sim/degraded.hpp): a slow GPU lengthens the iteration by what its stage or its
// data-parallel collective must absorb; a link at half bandwidth slows only the collectives that cross it; each form
// moves the prediction on every plan family it applies to and is refused by name where it does not.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "report/summary.hpp"
#include "sim/degraded.hpp"
#include "sim/simulate.hpp"
#include "tests/sim/context_parallel_scenarios.hpp"
#include "tests/sim/support.hpp"
#include "topology/hardware.hpp"

namespace twin::sim {
namespace {

using testing::Plan;

constexpr double kForwardS = 1e-3, kBackwardS = 2e-3;  // per layer op (FixedCostModel)

SimResult run(const model::Program& program, const CostModel& cost, Fidelity fidelity, Degradations degradations,
              bool ideal_network = true, double oversubscription = 1) {
  SimOptions options;
  options.ideal_network = ideal_network;
  topology::FabricSpec fabric = topology::infiniband_hdr_fat_tree();  // DGX A100's
  fabric.oversubscription = oversubscription;
  options.fabric = fabric;
  options.fidelity = fidelity;
  options.degradations = std::move(degradations);
  return simulate(program, cost, options);
}

double iteration_s(const model::Program& program, Fidelity fidelity, Degradations degradations,
                   bool ideal_network = true) {
  const FixedCostModel cost(kForwardS, kBackwardS);
  return run(program, cost, fidelity, std::move(degradations), ideal_network).timeline.iteration_time_s;
}

// The plan on one node's part holding its GPUs, or on whole nodes.
model::Scenario scenario_of(Plan plan) {
  const int gpus = plan.tp * plan.pp * plan.dp;
  if (gpus < 8) plan.gpus_per_node = gpus;
  return testing::make_scenario(plan);
}

model::Program program_of(const Plan& plan) {
  return model::build_program(scenario_of(plan), model::Granularity::Layer);
}

// 1F1B, p stages of one layer, m micro-batches, ideal network: the last stage slowed by f runs its m forwards and
// backwards back to back (nothing downstream delays its backwards) while the others keep up, so the iteration is
// (p - 1) (f + b) of fill and drain at the healthy pace plus m f (f + b): longer by m (f - 1) (f + b), exactly the
// slow stage's extra compute. A TP group meets at its collectives: one slow member slows the group the same way.
TEST(SlowGpu, LengthensAPipelineByItsStagesExtraCompute) {
  for (const auto& [tp, fidelity] : {std::pair{1, Fidelity::Rank}, {2, Fidelity::Rank}, {2, Fidelity::Group}}) {
    Plan plan;
    plan.layers = 4, plan.pp = 4, plan.tp = tp, plan.global_batch = 8;
    const model::Program program = program_of(plan);
    const int m = 8, p = 4;
    const double factor = 1.5;
    const int last_stage_rank = program.layout.rank_of({0, p - 1, tp - 1});  // its TP group's last member
    const double healthy = iteration_s(program, fidelity, {});
    const double slow = iteration_s(program, fidelity, {{{last_stage_rank, factor}}, {}});
    EXPECT_NEAR(healthy, (m + p - 1) * (kForwardS + kBackwardS), 1e-9) << tp << to_string(fidelity);
    EXPECT_NEAR(slow - healthy, m * (factor - 1) * (kForwardS + kBackwardS), 1e-9) << tp << to_string(fidelity);
  }
}

// Data parallel: the slow replica reaches the gradient all-reduce (f - 1) x its compute late and every other replica
// waits there; the report says so.
TEST(SlowGpu, LengthensDataParallelTrainingAtItsAllReduce) {
  Plan plan;
  plan.layers = 8, plan.dp = 2, plan.global_batch = 8;  // 4 micro-batches per replica
  const model::Program program = program_of(plan);
  const double compute_s = 4 * 8 * (kForwardS + kBackwardS);
  const FixedCostModel cost(kForwardS, kBackwardS);
  const SimResult healthy = run(program, cost, Fidelity::Rank, {});
  const SimResult slow = run(program, cost, Fidelity::Rank, {{{1, 2.0}}, {}});
  EXPECT_NEAR(slow.timeline.iteration_time_s - healthy.timeline.iteration_time_s, compute_s, 1e-9);
  // The report's first line after its heading: rank 0 (traced) waited that long in the gradient all-reduce.
  const std::string report = slowdown_report(program, healthy.timeline, slow.timeline);
  const std::string first = report.substr(report.find('\n', report.find("absorbed by")) + 1);
  EXPECT_THAT(first.substr(0, first.find('\n')), ::testing::HasSubstr("+0.0960 s  stage 0 (rank 0): in all_reduce"))
      << report;
}

// Every plan family, both fidelities: a slow GPU never shortens the iteration and here lengthens it.
TEST(SlowGpu, MovesThePredictionOnEveryPlanFamily) {
  std::vector<std::pair<std::string, model::Scenario>> families;
  Plan dp;
  dp.layers = 2, dp.dp = 2, dp.global_batch = 4;
  families.emplace_back("pp 1", scenario_of(dp));
  Plan pp = dp;
  pp.pp = 2, pp.dp = 1;
  families.emplace_back("pp 2", scenario_of(pp));
  Plan interleaved = pp;
  interleaved.layers = 4, interleaved.schedule = "interleaved", interleaved.virtual_stages = 2;
  families.emplace_back("interleaved", scenario_of(interleaved));
  families.emplace_back("cp 2", cp_scenarios::llama3_8b(8192, 2));
  families.emplace_back("ep 2", model::parse_scenario("[model]\nname = \"moe\"\nlayers = 2\nhidden = 512\nheads = 8\n"
                                                      "seq_len = 512\nvocab = 1000\nexperts = 4\ntop_k = 2\n"
                                                      "[parallel]\nep = 2\ndp = 2\nglobal_batch = 4\n[cluster]\n"
                                                      "nodes = 1\ngpus_per_node = 2\nnode = \"dgx-a100\"\n",
                                                      "moe.toml"));
  for (const auto& [name, scenario] : families) {
    const model::Program program = model::build_program(scenario, model::Granularity::Layer);
    const int last = program.layout.world_size() - 1;
    for (Fidelity fidelity : {Fidelity::Rank, Fidelity::Group}) {
      const double healthy = iteration_s(program, fidelity, {});
      EXPECT_GT(iteration_s(program, fidelity, {{{last, 1.5}}, {}}), healthy * 1.05) << name << to_string(fidelity);
    }
  }
}

// 16 GPUs on 2 DGX A100 nodes, TP 8 inside each, DP 2 across them: TP collectives move on NVLink, the gradient
// all-reduce over the NICs.
model::Program two_node_program() {
  Plan plan;
  plan.layers = 2, plan.hidden = 2048, plan.heads = 16, plan.seq = 1024, plan.vocab = 1024;
  plan.tp = 8, plan.dp = 2, plan.nodes = 2, plan.global_batch = 2;
  return program_of(plan);
}

// Seconds rank 0 spent in its collectives of `group` (from each one's start to its end).
double collective_s(const model::Program& program, const SimResult& result, model::Group group) {
  double seconds = 0;
  for (const report::RankTimeline& rank : result.timeline.ranks) {
    if (rank.rank != 0) continue;
    for (const report::OpSpan& span : rank.spans) {
      const model::Op& op = program.stage_ops[0][static_cast<std::size_t>(span.op)];
      if (op.kind == model::OpKind::Collective && op.group == group) seconds += span.end_s - span.start_s;
    }
  }
  return seconds;
}

TEST(SlowLink, HalfANicSlowsOnlyTheCollectivesThatCrossIt) {
  const model::Program program = two_node_program();
  const AnalyticalCostModel cost(topology::a100_sxm4_80gb());
  const SimResult healthy = run(program, cost, Fidelity::Rank, {}, false);
  const SimResult nic = run(program, cost, Fidelity::Rank, {{}, {parse_slow_link("nic:0:0.5")}}, false);
  const SimResult nvlink = run(program, cost, Fidelity::Rank, {{}, {parse_slow_link("nvlink:0:0.5")}}, false);
  const double tp = collective_s(program, healthy, model::Group::Tensor);
  const double data = collective_s(program, healthy, model::Group::Data);
  ASSERT_GT(tp, 0);
  ASSERT_GT(data, 0);
  // The NIC carries rank 0's share of the gradient all-reduce: bandwidth-bound, it takes close to twice as long
  // (its latency terms and the NVLink part of the ring do not double); the TP collectives never touch it.
  EXPECT_NEAR(collective_s(program, nic, model::Group::Tensor), tp, 1e-9 * tp);
  EXPECT_GT(collective_s(program, nic, model::Group::Data), 1.5 * data);
  // The NVLink port carries the TP collectives, not the inter-node all-reduce.
  EXPECT_GT(collective_s(program, nvlink, model::Group::Tensor), 1.3 * tp);
  EXPECT_NEAR(collective_s(program, nvlink, model::Group::Data), data, 0.02 * data);
  // Group fidelity: the NIC is one rail of rank 0's TP group, whose bundle then runs at its pace; the NVLink is
  // refused by name (TP collectives are analytical there).
  const double group_healthy = run(program, cost, Fidelity::Group, {}, false).timeline.iteration_time_s;
  EXPECT_GT(run(program, cost, Fidelity::Group, {{}, {parse_slow_link("nic:3:0.5")}}, false).timeline.iteration_time_s,
            group_healthy);
  try {
    run(program, cost, Fidelity::Group, {{}, {parse_slow_link("nvlink:0:0.5")}}, false);
    FAIL() << "expected a refusal";
  } catch (const SimulationError& error) {
    EXPECT_NE(std::string(error.what()).find("--slow-link nvlink"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("--fidelity rank"), std::string::npos) << error.what();
  }
}

// Four nodes under two leaves (DGX A100 on HDR: two nodes per leaf, two spines), DP 4 across them, the up-links at
// half the nodes' rate (2:1 oversubscribed, so that the ring's steps across leaves fill them): leaf 0's up-links at a
// quarter of their rate slow the all-reduce; a failed one, routed around at (spines - 1) / spines of the leaf's rate,
// too; a one-leaf tree has no up-link to fail.
TEST(SlowLink, UpLinksSlowedAndFailedAtBothFidelities) {
  Plan plan;
  plan.layers = 2, plan.hidden = 2048, plan.heads = 16, plan.seq = 1024, plan.vocab = 1024;
  plan.tp = 8, plan.dp = 4, plan.nodes = 4, plan.global_batch = 4;
  const model::Program program = program_of(plan);
  const AnalyticalCostModel cost(topology::a100_sxm4_80gb());
  for (Fidelity fidelity : {Fidelity::Rank, Fidelity::Group}) {
    const double healthy = run(program, cost, fidelity, {}, false, 2).timeline.iteration_time_s;
    const double slow = run(program, cost, fidelity,
                            {{}, {parse_slow_link("uplink:0:0:0.25"), parse_slow_link("uplink:0:1:0.25")}}, false, 2)
                            .timeline.iteration_time_s;
    const double failed =
        run(program, cost, fidelity, {{}, {parse_failed_uplink("1:1")}}, false, 2).timeline.iteration_time_s;
    EXPECT_GT(slow, healthy) << to_string(fidelity);
    EXPECT_GT(failed, healthy) << to_string(fidelity);
    EXPECT_THROW(run(program, cost, fidelity, {{}, {parse_failed_uplink("2:0")}}, false), SimulationError);
  }
  const model::Program one_leaf = two_node_program();
  try {
    run(one_leaf, cost, Fidelity::Group, {{}, {parse_failed_uplink("0:0")}}, false);
    FAIL() << "expected a refusal";
  } catch (const SimulationError& error) {
    EXPECT_NE(std::string(error.what()).find("no other route"), std::string::npos) << error.what();
  }
}

// A NIC carries what crosses nodes: on every family whose plan spans two nodes (DP, PP, interleaved, CP, EP across
// them), at both fidelities, half of one rank's NIC lengthens the iteration.
TEST(SlowLink, ANicMovesThePredictionOnEveryPlanFamilyAcrossNodes) {
  Plan across;
  across.layers = 4, across.hidden = 2048, across.heads = 16, across.seq = 1024, across.vocab = 1024;
  across.tp = 8, across.nodes = 2, across.global_batch = 4;
  std::vector<std::pair<std::string, model::Scenario>> families;
  Plan dp = across;
  dp.dp = 2;
  families.emplace_back("pp 1", scenario_of(dp));
  Plan pp = across;
  pp.pp = 2;
  families.emplace_back("pp 2", scenario_of(pp));
  Plan interleaved = pp;
  interleaved.schedule = "interleaved", interleaved.virtual_stages = 2;
  families.emplace_back("interleaved", scenario_of(interleaved));
  families.emplace_back("cp 2", cp_scenarios::llama3_8b(8192, 2));
  families.emplace_back("ep 16", model::parse_scenario("[model]\nname = \"moe\"\nlayers = 2\nhidden = 1024\n"
                                                       "heads = 8\nseq_len = 1024\nvocab = 1000\nexperts = 16\n"
                                                       "top_k = 2\n[parallel]\nep = 16\nglobal_batch = 64\n"
                                                       "[cluster]\nnodes = 2\nnode = \"dgx-a100\"\n",
                                                       "moe.toml"));
  const AnalyticalCostModel cost(topology::a100_sxm4_80gb());
  for (const auto& [name, scenario] : families) {
    const model::Program program = model::build_program(scenario, model::Granularity::Layer);
    for (Fidelity fidelity : {Fidelity::Rank, Fidelity::Group}) {
      const double healthy = run(program, cost, fidelity, {}, false).timeline.iteration_time_s;
      const double slow =
          run(program, cost, fidelity, {{}, {parse_slow_link("nic:0:0.5")}}, false).timeline.iteration_time_s;
      EXPECT_GT(slow, healthy * 1.001) << name << " " << to_string(fidelity);
    }
  }
}

TEST(Degradations, ParsedOrRefusedNamingWhatIsWrong) {
  EXPECT_EQ(parse_slow_gpu("3:1.5").rank, 3);
  EXPECT_EQ(parse_slow_gpu("3:1.5").factor, 1.5);
  EXPECT_THROW(parse_slow_gpu("3:0.5"), std::invalid_argument);  // faster is not slow
  EXPECT_THROW(parse_slow_gpu("x:2"), std::invalid_argument);
  EXPECT_THROW(parse_slow_link("nic:1:1.5"), std::invalid_argument);
  EXPECT_THROW(parse_slow_link("pcie:1:0.5"), std::invalid_argument);
  EXPECT_EQ(parse_slow_link("uplink:2:3:0.25").spine, 3);
  EXPECT_EQ(parse_failed_uplink("2:3").factor, 0);
  // the seeded draw: the same ranks for the same seed, distinct, the fraction's count
  const auto drawn = draw_slow_gpus(1000, 0.01, 2, 42);
  ASSERT_EQ(drawn.size(), 10u);
  const auto ranks = [](const std::vector<SlowGpu>& gpus) {
    std::vector<int> out;
    for (const SlowGpu& gpu : gpus) out.push_back(gpu.rank);
    return out;
  };
  EXPECT_EQ(ranks(drawn), ranks(draw_slow_gpus(1000, 0.01, 2, 42)));
  EXPECT_NE(ranks(drawn), ranks(draw_slow_gpus(1000, 0.01, 2, 43)));
  for (std::size_t i = 1; i < drawn.size(); ++i) EXPECT_LT(drawn[i - 1].rank, drawn[i].rank);
}

}  // namespace
}  // namespace twin::sim
