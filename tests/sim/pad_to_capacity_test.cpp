// model.pad_to_capacity (Megatron-Core's --moe-pad-expert-input-to-capacity, the drop-and-pad dispatch): every expert
// computes its whole capacity, and the host neither gathers the token counts nor waits for them
// (model/ops/moe_host_sync.hpp, model/ops/moe_ops.cpp).
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include <fmt/format.h>

#include "model/ops/moe_host_sync.hpp"
#include "model/ops/moe_ops.hpp"
#include "model/program/program.hpp"
#include "sim/cost_model.hpp"
#include "sim/simulate.hpp"
#include "tests/sim/support.hpp"

namespace twin::sim {
namespace {

// The MoE host-sync tests' plan (tests/sim/support.hpp) with a capacity factor, in plan family `family` (its keys).
model::Scenario small_moe(double capacity_factor, bool pad, const std::vector<std::string>& family = {}) {
  model::Scenario s = testing::small_moe_scenario(family);
  s.model.capacity_factor = capacity_factor;
  s.model.pad_to_capacity = pad;
  return s;
}

using testing::moe_iteration_s;

struct Counted {
  int syncs = 0, count_gathers = 0;
  double expert_flops = 0, dispatched_bytes = 0;
};

Counted count(const model::Program& program) {
  Counted c;
  for (const model::Op& op : program.stage_ops[0]) {
    c.syncs += model::host_waits_for(op);
    if (op.kind == model::OpKind::Collective && op.payload == model::Payload::ExpertCounts &&
        op.collective == model::CollectiveKind::AllGather) {
      ++c.count_gathers;
    }
    if (op.kind == model::OpKind::Compute &&
        (op.what == model::ComputeKind::ExpertUp || op.what == model::ComputeKind::ExpertDown)) {
      c.expert_flops += op.flops;
    }
    if (op.kind == model::OpKind::Collective && op.collective == model::CollectiveKind::AllToAll) {
      c.dispatched_bytes += std::accumulate(op.peer_bytes->begin(), op.peer_bytes->end(), 0.0);
    }
  }
  return c;
}

TEST(PadToCapacity, TheHostNeitherGathersTheCountsNorWaitsForThem) {
  for (const auto granularity : {model::Granularity::Op, model::Granularity::Layer}) {
    const Counted dropping = count(model::build_program(small_moe(1, false), granularity));
    const Counted padded = count(model::build_program(small_moe(1, true), granularity));
    EXPECT_EQ(dropping.syncs, 4 * 2);  // 4 MoE layers x 2 micro-batches, forward
    EXPECT_EQ(padded.syncs, 0);
    if (granularity == model::Granularity::Op) {
      EXPECT_EQ(dropping.count_gathers, 4 * 2);
      EXPECT_EQ(padded.count_gathers, 0);
    }
  }
}

// Balanced routing with a capacity factor of 1.5: dropping leaves every expert its even share (under capacity), padding
// fills each to 1.5 times it, so the experts' GEMMs and the all-to-alls carry 1.5 times the rows; a skew padded to
// capacity computes the same (every expert holds its capacity whatever the router sent it).
TEST(PadToCapacity, EveryExpertComputesItsWholeCapacity) {
  const std::vector<double> shares = model::expert_row_shares(small_moe(1.5, true));
  for (double share : shares) EXPECT_DOUBLE_EQ(share, 1.5 / 64);
  const Counted dropping = count(model::build_program(small_moe(1.5, false)));
  const Counted padded = count(model::build_program(small_moe(1.5, true)));
  EXPECT_NEAR(padded.expert_flops / dropping.expert_flops, 1.5, 1e-9);
  EXPECT_NEAR(padded.dispatched_bytes / dropping.dispatched_bytes, 1.5, 1e-9);
  model::Scenario skewed = small_moe(1.5, true);
  skewed.model.expert_load_skew = 1;
  EXPECT_NEAR(count(model::build_program(skewed)).expert_flops, padded.expert_flops, 1e-6 * padded.expert_flops);
  // More rows: slower at both granularities.
  for (const auto granularity : {model::Granularity::Op, model::Granularity::Layer}) {
    EXPECT_GT(moe_iteration_s(small_moe(1.5, true), 0, granularity),
              moe_iteration_s(small_moe(1.5, false), 0, granularity));
  }
}

// At a capacity factor of 1 under balanced routing both compute the same rows; with no sync a host slower than the
// expert kernels keeps its lead (tests/sim/moe_host_sync_test.cpp: it loses over 100 us at each of the 8 syncs), so
// padding is faster by more than that, while with a host never behind only the sync's few launches separate them.
TEST(PadToCapacity, ASlowHostKeepsItsLead) {
  for (const auto granularity : {model::Granularity::Op, model::Granularity::Layer}) {
    const double dropping = moe_iteration_s(small_moe(1, false), 10, granularity);
    const double padded = moe_iteration_s(small_moe(1, true), 10, granularity);
    EXPECT_GT(dropping - padded, 4 * 2 * 10 * 10e-6) << dropping << " " << padded;
    const double free_dropping = moe_iteration_s(small_moe(1, false), 0, granularity);
    const double free_padded = moe_iteration_s(small_moe(1, true), 0, granularity);
    EXPECT_LT(std::abs(free_dropping - free_padded), dropping - padded);
  }
}

// Every MoE plan family the key applies to, at both fidelities and granularities: the padding's two effects move the
// prediction each way. At a capacity of 1 under a 10 us host the sync goes and the host keeps its lead (faster by more
// than a launch's worth at each of the stage's syncs); at a capacity of 1.5 with a host never behind, the padded rows
// cost more than the gather and sync save (tests above: 1.5 times the expert FLOPs and all-to-all bytes).
TEST(PadToCapacity, MovesThePredictionOnEveryMoePlanFamily) {
  const std::vector<std::pair<const char*, std::vector<std::string>>> families = {
      {"pp1 ep4", {}},
      {"pp2 1f1b ep4", {"parallel.pp=2", "cluster.gpus_per_node=8"}},
      {"pp2 interleaved vp2 ep4",
       {"parallel.pp=2", "cluster.gpus_per_node=8", "parallel.schedule=\"interleaved\"", "parallel.virtual_stages=2"}},
      {"cp2 ep4", {"parallel.cp=2", "parallel.dp=2", "framework.attention=\"flash2\""}},
  };
  for (const auto& [name, family] : families) {
    for (const Fidelity fidelity : {Fidelity::Rank, Fidelity::Group}) {
      for (const auto granularity : {model::Granularity::Op, model::Granularity::Layer}) {
        SCOPED_TRACE(fmt::format("{} x {} x {}", name, to_string(fidelity), model::to_string(granularity)));
        const double dropping = moe_iteration_s(small_moe(1, false, family), 10, granularity, fidelity);
        const double padded = moe_iteration_s(small_moe(1, true, family), 10, granularity, fidelity);
        EXPECT_GT(dropping - padded, 10 * 10e-6) << dropping << " s dropping, " << padded << " s padded";
        const double wide_dropping = moe_iteration_s(small_moe(1.5, false, family), 0, granularity, fidelity);
        const double wide_padded = moe_iteration_s(small_moe(1.5, true, family), 0, granularity, fidelity);
        EXPECT_GT(wide_padded, wide_dropping) << name;
      }
    }
  }
}

}  // namespace
}  // namespace twin::sim
