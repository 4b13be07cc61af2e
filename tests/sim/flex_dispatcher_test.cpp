// framework.moe_dispatcher = "flex" (Megatron-Core's flex token dispatcher, DeepEP / HybridEP) on every MoE plan
// family it applies to, at both fidelities and granularities: a token crosses once to each rank holding any of its
// experts (model/ops/moe_ops.hpp), so the all-to-alls carry fewer bytes and the iteration is shorter.
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include <fmt/format.h>

#include "model/ops/moe_ops.hpp"
#include "model/program/program.hpp"
#include "sim/cost_model.hpp"
#include "sim/simulate.hpp"
#include "tests/sim/support.hpp"

namespace twin::sim {
namespace {

// The MoE host-sync tests' plan (tests/sim/support.hpp: 64 experts, top 2, EP 4) in plan family `family`.
model::Scenario small_moe(bool flex, const std::vector<std::string>& family) {
  model::Scenario s = testing::small_moe_scenario(family);
  s.framework.moe_dispatcher = flex ? model::MoeDispatcher::Flex : model::MoeDispatcher::AllToAll;
  return s;
}

// With a host never behind (0 us a kernel): on these small layers a paced host (the A100's default) holds the
// op-granularity iteration on cp2, where the exchange's bytes then change nothing.
double iteration_s(const model::Scenario& s, model::Granularity granularity, Fidelity fidelity) {
  return testing::moe_iteration_s(s, 0, granularity, fidelity);
}

double all_to_all_bytes(const model::Program& program) {
  double bytes = 0;
  for (const model::Op& op : program.stage_ops[0]) {
    if (op.kind == model::OpKind::Collective && op.collective == model::CollectiveKind::AllToAll &&
        op.payload == model::Payload::Tokens) {  // the rows' (the all-to-all dispatcher's probabilities apart)
      bytes += std::accumulate(op.peer_bytes->begin(), op.peer_bytes->end(), 0.0);
    }
  }
  return bytes;
}

// 16 of the 64 experts on a rank: a token reaches it with chance 1 - C(48, 2) / C(64, 2) = 0.4405, where the all-to-all
// sends it 2 x 16 / 64 = 0.5 rows. Within one node every byte shrinks by that ratio; over two nodes (two EP ranks a
// node) the other node's share shrinks more, to 1 - C(32, 2) / C(64, 2) = 0.754 of a token against 1 row.
TEST(FlexDispatcherFamilies, MovesThePredictionOnEveryMoePlanFamily) {
  const std::vector<std::pair<const char*, std::vector<std::string>>> families = {
      {"pp1 ep4", {}},
      {"pp1 ep4 over two nodes", {"cluster.gpus_per_node=2", "cluster.nodes=2"}},
      {"pp2 1f1b ep4", {"parallel.pp=2", "cluster.gpus_per_node=8"}},
      {"pp2 interleaved vp2 ep4",
       {"parallel.pp=2", "cluster.gpus_per_node=8", "parallel.schedule=\"interleaved\"", "parallel.virtual_stages=2"}},
      {"cp2 ep4", {"parallel.cp=2", "parallel.dp=2", "framework.attention=\"flash2\""}},
  };
  for (const auto& [name, family] : families) {
    const double ratio = all_to_all_bytes(model::build_program(small_moe(true, family))) /
                         all_to_all_bytes(model::build_program(small_moe(false, family)));
    if (family.size() == 2 && family[0] == std::string("cluster.gpus_per_node=2")) {
      // Rank 0 to its node's other rank 0.4405 x T, to each of the other node's two 0.754 / 2 x T; itself 0.4405 x T.
      EXPECT_NEAR(ratio, (2 * 0.44048 + 0.75397) / (4 * 0.5), 1e-4) << name;
    } else {
      EXPECT_NEAR(ratio, 0.44048 / 0.5, 1e-4) << name;
    }
    for (const Fidelity fidelity : {Fidelity::Rank, Fidelity::Group}) {
      for (const auto granularity : {model::Granularity::Op, model::Granularity::Layer}) {
        SCOPED_TRACE(fmt::format("{} x {} x {}", name, to_string(fidelity), model::to_string(granularity)));
        const double all = iteration_s(small_moe(false, family), granularity, fidelity);
        const double flex = iteration_s(small_moe(true, family), granularity, fidelity);
        EXPECT_LT(flex, all * (1 - 1e-4)) << all << " s all-to-all, " << flex << " s flex";
      }
    }
  }
}

}  // namespace
}  // namespace twin::sim
