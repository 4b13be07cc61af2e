// Replica fidelity (sim/replica.cpp): one pipeline replica replayed, the others mirroring it, every replica's
// collectives on the fabric. Against group fidelity, which replays every replica.
#include <gtest/gtest.h>

#include "model/program/program.hpp"
#include "sim/simulate.hpp"
#include "tests/sim/context_parallel_scenarios.hpp"
#include "tests/sim/support.hpp"

namespace twin::sim {
namespace {

using testing::make_scenario;
using testing::Plan;

// sixteen_nodes with its gradients reduce-scattered under the backward (ZeRO-1, overlapped).
Plan sixteen_nodes_overlapped() {
  Plan plan = testing::sixteen_nodes();
  plan.dp_overlap = true;
  return plan;
}

SimResult run(const model::Program& program, Fidelity fidelity, SimOptions options = {}) {
  const AnalyticalCostModel cost(topology::h100_sxm5_80gb());
  options.fidelity = fidelity;
  return simulate(program, cost, options);
}

// The data-parallel reduce-scatters hold every replica (one instance, flows between all 16 nodes, as at group
// fidelity); the pipeline messages are replica 0's alone, each on its own nodes' NICs.
TEST(ReplicaFidelity, AgreesWithGroupFidelityOnSixteenNodes) {
  Plan plan = sixteen_nodes_overlapped();
  plan.node = "dgx-h100";
  const model::Program program = model::build_program(make_scenario(plan), model::Granularity::Layer);
  const SimResult group = run(program, Fidelity::Group);
  const SimResult replica = run(program, Fidelity::Replica);
  EXPECT_EQ(replica.fidelity, Fidelity::Replica);
  EXPECT_EQ(group.stats.actors, 16);
  EXPECT_EQ(replica.stats.actors, 4);  // one per stage of replica 0
  const double t_group = group.timeline.iteration_time_s, t_replica = replica.timeline.iteration_time_s;
  EXPECT_NEAR(t_replica, t_group, 1e-6 * t_group);
}

// A rank of another replica is recorded as the replayed rank it mirrors: the same spans.
TEST(ReplicaFidelity, ARecordedRankOfAnotherReplicaHasItsMirrorsTimeline) {
  const model::Program program =
      model::build_program(make_scenario(sixteen_nodes_overlapped()), model::Granularity::Layer);
  SimOptions options;
  const int other = program.layout.rank_of({3, 2, 5});  // dp 3, stage 2, tp 5
  const int mirror = program.layout.rank_of({0, 2, 0});
  options.record_ranks = {other};
  const SimResult replica = run(program, Fidelity::Replica, options);
  const report::RankTimeline* of_other = nullptr;
  const report::RankTimeline* of_mirror = nullptr;
  for (const report::RankTimeline& rank : replica.timeline.ranks) {
    if (rank.rank == other) of_other = &rank;
    if (rank.rank == mirror) of_mirror = &rank;
  }
  ASSERT_NE(of_other, nullptr);
  ASSERT_NE(of_mirror, nullptr);
  ASSERT_EQ(of_other->spans.size(), of_mirror->spans.size());
  ASSERT_FALSE(of_other->spans.empty());
  EXPECT_EQ(of_other->stage, 2);
  EXPECT_EQ(of_other->spans.back().end_s, of_mirror->spans.back().end_s);
}

// Llama 3 8B at 32K tokens, TP 4 x CP 8 x DP 2 on 8 DGX H100 nodes (four to a leaf), placed with dp inside cp: each
// node holds both replicas' TP groups of one CP rank, so each replica's CP group spans both leaves, and the leaves'
// up-links run at a quarter of their nodes' rate. Replica 1's CP all-gathers, a mirror group's flows, share the
// up-links with replica 0's: replica fidelity gives group fidelity's time only if it sends them too.
TEST(ReplicaFidelity, AnotherReplicasContextParallelFlowsStillShareTheFabric) {
  model::Scenario s = cp_scenarios::llama3_8b(32768, 8);
  s.parallel.tp = 4;
  s.parallel.dp = 2;
  s.parallel.global_batch = 4;
  const model::Program program = model::build_program(s, model::Granularity::Layer);
  SimOptions options;
  options.placement = "tp-dp-cp-pp";
  const double open_s = run(program, Fidelity::Group, options).timeline.iteration_time_s;
  topology::FabricSpec fabric = topology::fabric_spec(s.cluster);
  fabric.oversubscription = 4;
  options.fabric = fabric;
  const double group_s = run(program, Fidelity::Group, options).timeline.iteration_time_s;
  const SimResult replica = run(program, Fidelity::Replica, options);
  EXPECT_GT(group_s, 1.001 * open_s);
  EXPECT_EQ(replica.stats.actors, 8);  // the CP ranks of replica 0
  EXPECT_NEAR(replica.timeline.iteration_time_s, group_s, 1e-6 * group_s);
}

TEST(ReplicaFidelity, AutoTakesItAboveItsThresholdWhereReplicasAreAlike) {
  const model::Program program =
      model::build_program(make_scenario(sixteen_nodes_overlapped()), model::Granularity::Layer);
  SimOptions options;
  EXPECT_EQ(parse_fidelity("replica"), Fidelity::Replica);
  EXPECT_EQ(choose_fidelity(program, options), Fidelity::Group);  // 128 GPUs: below replica's threshold
  options.replica_fidelity_above_gpus = 64;
  EXPECT_EQ(choose_fidelity(program, options), Fidelity::Replica);
  options.degradations.gpus.push_back(parse_slow_gpu("9:2"));  // replica 1 unlike replica 0
  EXPECT_EQ(choose_fidelity(program, options), Fidelity::Group);
  options.fidelity = Fidelity::Replica;
  try {
    choose_fidelity(program, options);
    FAIL() << "replica fidelity with a slow GPU";
  } catch (const SimulationError& error) {
    EXPECT_NE(std::string(error.what()).find("--fidelity replica"), std::string::npos) << error.what();
  }
  options.degradations = {};
  options.placement = "dp-tp-pp";  // TP groups across nodes
  EXPECT_THROW(choose_fidelity(program, options), SimulationError);
  Plan one = sixteen_nodes_overlapped();  // a single replica: nothing to mirror, group fidelity
  one.pp = 16;
  one.dp = 1;
  one.global_batch = 16;
  SimOptions low;
  low.replica_fidelity_above_gpus = 64;
  EXPECT_EQ(choose_fidelity(model::build_program(make_scenario(one), model::Granularity::Layer), low), Fidelity::Group);
}

}  // namespace
}  // namespace twin::sim
