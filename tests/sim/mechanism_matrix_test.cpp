// Issue 45, item 1: every cost mechanism engages everywhere it should. Each row switches one mechanism on over a
// plan family's base scenario, at both fidelities and both granularities, and asserts that the prediction moves in the
// mechanism's direction and by its order of magnitude; that layer granularity agrees with op granularity; and, where
// the mechanism does not apply to a family, that the scenario is refused naming the key. A knob that silently does
// nothing here is a failing cell.
//
// The plans are tiny (4 layers, hidden 1024) so that the whole matrix runs in a few seconds; every family has TP 2 and
// DP 2 with the distributed optimizer and gradient overlap, so that TP-communication overlap and the parameter
// gather's overlap apply to each.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "model/program/goodput.hpp"
#include "model/program/program.hpp"
#include "sim/cost_model.hpp"
#include "sim/simulate.hpp"
#include "topology/hardware.hpp"

namespace twin::sim {
namespace {

// A plan family: the keys it sets over the common base.
struct Family {
  const char* name;
  std::vector<const char*> keys;
  bool moe = false;
};

const std::vector<Family>& families() {
  static const std::vector<Family> all = {
      {"pp1", {"parallel.pp=1", "cluster.gpus_per_node=4"}},
      {"gpipe_pp2", {"parallel.pp=2", "cluster.gpus_per_node=8", "parallel.schedule=\"gpipe\""}},
      {"onef1b_pp2", {"parallel.pp=2", "cluster.gpus_per_node=8"}},
      {"interleaved_pp2_vp2",
       {"parallel.pp=2", "cluster.gpus_per_node=8", "parallel.schedule=\"interleaved\"", "parallel.virtual_stages=2"}},
      {"ep2",
       {"parallel.pp=1", "cluster.gpus_per_node=4", "model.experts=4", "model.top_k=2", "model.moe_ffn_hidden=1024",
        "parallel.ep=2", "parallel.sequence_parallel=true"},
       true},
      {"cp2", {"parallel.pp=1", "cluster.gpus_per_node=8", "parallel.cp=2", "framework.attention=\"flash2\""}},
  };
  return all;
}

// One mechanism: the keys that switch it on (off is the family's base), the direction it moves the iteration time
// (+1 slower, -1 faster), and the order of magnitude of that move as bounds on |on / off - 1|, from the mechanism's
// own unit test and its size on these plans.
struct Mechanism {
  const char* name;
  std::vector<const char*> on;
  int direction;
  double least, most;
  bool moe_only = false;  // refused on dense families (checked by the key's name in the error)
  const char* refused_key = "";
  // Applies with parallel.cp > 1 only. Not refused at cp 1: a single-rank reference run with the multi-rank runs'
  // keys is how the executor's context-parallel parity tests work (tests/exec/context_parallel_parity.hpp); there the
  // cell asserts that it changes nothing.
  bool cp_only = false;
  std::vector<const char*> both = {};  // keys of the family's base for this row, set with the mechanism off and on
  double layer_vs_op = 0.04;            // how far layer granularity may be from op granularity (see check_cell)
};

const std::vector<Mechanism>& mechanisms() {
  static const std::vector<Mechanism> all = {
      // 20 us a kernel against kernels of a few to tens of us: the host paces most of the iteration (+96 % to +227 %
      // when the matrix was written; +49 % to +227 % once the measured in-node collective floors (sim/data/
      // collectives_by_size.csv) lengthened the base iterations; each bound below likewise brackets what was measured
      // by a factor of about 2 to 3).
      {"host", {"cluster.host_us_per_kernel=20"}, +1, 0.2, 5.0},
      // CUDA graphs under that host: a layer's launches become one, so most of what the host added goes (the
      // embedding, the head, the optimizer and, on ep2, the dropless token path stay eager).
      // Layer against op granularity within 10 %, not 4: a fused MoE layer op holds the graph's part and the eager
      // token path as one block whose kernels the paced host issues as if of equal length, while the graph's part is
      // most of the layer's GPU time, so the fused op ends a little early (8.0 % on ep2 when this row was written,
      // 11.5 % once the dispatcher's row sorts joined the eager token path: model/ops/moe_ops.cpp; the dense families
      // within 4 %).
      {"cuda_graphs", {"framework.cuda_graphs=true"}, -1, 0.1, 0.8, false, "", false,
       {"cluster.host_us_per_kernel=20"}, 0.15},
      // Transformer Engine's modules under that host: each linear layer's call costs the host 1.6 to 8.5 plain
      // launches' time (sim/te_host.cpp) where the local path launched one or two kernels (+19 to +23 % on every
      // family when the row was written).
      {"transformer_engine", {"framework.transformer_engine=true"}, +1, 0.08, 0.6, false, "", false,
       {"cluster.host_us_per_kernel=20"}},
      // Full recompute runs every layer's forward again: up to a third more compute, less where communication and
      // the bubble hold the time; an MoE layer's forward repeats its two all-to-alls too (+46 % on ep2 with the
      // measured in-node floors), and one forward more stays under half an iteration whose backward costs at least
      // its forward.
      {"recompute", {"parallel.recompute=\"full\""}, +1, 0.15, 0.5},
      // Backward TP all-reduces under the independent GEMM: part of the exposed TP time, never more than it.
      {"tp_comm_overlap", {"framework.tp_comm_overlap=true"}, -1, 0.01, 0.1},
      // The MoE dispatch and combine all-to-alls under the other micro-batch's compute (1F1B, no pipeline).
      {"moe_a2a_overlap", {"framework.moe_a2a_overlap=true"}, -1, 0.03, 0.3, true, "framework.moe_a2a_overlap"},
      // Padding every expert to a capacity of 3 times its even share (drop and pad): balanced routing then computes
      // and sends 3 times the rows, less the counts' gather and the sync it saves (+2.3 % on ep2, whose 1024-wide
      // experts are short next to its all-to-alls' floors, when the row was written; at a capacity of 1.5 the saved
      // gather outweighed the padding there: tests/sim/pad_to_capacity_test.cpp prices the rows alone).
      {"pad_to_capacity", {"model.pad_to_capacity=true"}, +1, 0.007, 0.07, true, "model.pad_to_capacity", false,
       {"model.capacity_factor=3"}},
      // At a capacity of one balanced routing pads nothing; what goes is the split-size sync, after which a host of
      // 20 us a kernel no longer loses its lead at every MoE layer (-7.0 % to -9.3 % on ep2 when the row was written).
      {"pad_to_capacity_sync", {"model.pad_to_capacity=true"}, -1, 0.03, 0.3, true, "model.pad_to_capacity", false,
       {"model.capacity_factor=1", "cluster.host_us_per_kernel=20"}},
      // Megatron-Core's flex dispatcher (DeepEP / HybridEP): a token once to each rank holding any of its experts,
      // where the all-to-all sends a row per (token, expert): on ep2 (2 of 4 experts a token, 2 experts a rank) 5/6 of
      // the all-to-all's bytes each way, so faster by part of the exposed expert-parallel time (-1.5 % on ep2 at both
      // fidelities and granularities when the row was written).
      {"moe_dispatcher_flex", {"framework.moe_dispatcher=\"flex\""}, -1, 0.005, 0.1, true,
       "framework.moe_dispatcher"},
      // The distributed optimizer's parameter all-gather under the next forward instead of after the step.
      {"param_gather_overlap", {"parallel.overlap_param_gather=true"}, -1, 0.002, 0.1},
      // Transformer Engine's FP8 GEMMs on H100: at most the GEMMs' share of the time, halved. On a 4096-wide model,
      // where the GEMMs hold most of the time, as FP8 is used (on the 1024-wide base its casts nearly cancel it). At
      // least 1.5 %: ep2 gains least, since FP8 also pads every expert's rows to its GEMM's alignment and unpads them
      // (Transformer Engine's Fp8Padding, model/ops/moe_ops.cpp) and its experts' GEMMs (1024 wide) carry a cast per
      // expert: 4.2 % faster on ep2 once the experts' GEMMs ran in FP8 (issue 45; 1.9 % when only the dense GEMMs
      // did), 8.3 to 12.9 % on the dense families; 50 % is the GEMMs' rate ratio's most.
      {"fp8", {"model.fp8=\"hybrid\""}, -1, 0.015, 0.5, false, "", false, {"model.hidden=4096", "model.heads=32"}},
      // Megatron-Core's bf16 gradient buffer: the data-parallel reduction moves half the bytes, of which only what the
      // overlap leaves exposed shows (0.7 to 1.2 % faster on these plans when the row was written).
      {"grad_reduce_in_fp32", {"framework.grad_reduce_in_fp32=false"}, -1, 0.003, 0.05},
      // FP8 weights gathered in FP8 by the distributed optimizer: half the parameter all-gather's bytes after the step
      // (0.5 to 0.8 % faster when the row was written), on the FP8 plans it applies to.
      {"fp8_param_gather", {"framework.fp8_param_gather=true"}, -1, 0.002, 0.05, false, "", false,
       {"model.fp8=\"hybrid\""}},
      // Context parallelism's exchange: gathering every rank's K, V before the attention (all_gather) exposes what
      // the p2p ring hides under its blocks.
      {"cp_exchange", {"framework.cp_comm=\"all_gather\""}, +1, 0.02, 0.3, false, "", true},
  };
  return all;
}

model::Scenario scenario_of(const Family& family, const std::vector<const char*>& more) {
  static const std::string base = R"(
[model]
name = "matrix-gpt"
layers = 4
hidden = 1024
heads = 8
seq_len = 1024
vocab = 8192
dtype = "bf16"
activation = "swiglu"
norm = "rmsnorm"
position_embedding = "rope"
linear_bias = false
[parallel]
tp = 2
dp = 2
micro_batch = 1
global_batch = 8
zero_stage = 1
dp_overlap = true
[cluster]
node = "dgx-h100"
host_us_per_kernel = 0
[framework]
name = "megatron"
tied_embeddings = false
dropout = false
tp_comm_overlap = false
)";
  std::vector<model::Override> overrides;
  for (const char* key : family.keys) overrides.push_back(model::parse_override(key));
  for (const char* key : more) overrides.push_back(model::parse_override(key));
  return model::parse_scenario(base, fmt::format("matrix-{}", family.name), overrides);
}

// Iteration times, each simulated once (a family's base serves every mechanism of its row).
double iteration_s(const Family& family, const std::vector<const char*>& on, Fidelity fidelity,
                   model::Granularity granularity) {
  static std::map<std::string, double> cache;
  std::string key = fmt::format("{} {} {}", family.name, to_string(fidelity), model::to_string(granularity));
  for (const char* k : on) key += std::string(" ") + k;
  const auto found = cache.find(key);
  if (found != cache.end()) return found->second;
  const model::Scenario s = scenario_of(family, on);
  const topology::GpuSpec gpu = topology::node_spec(s.cluster).gpu;
  const AnalyticalCostModel cost(gpu, analytical_parameters(gpu, s.cluster));
  SimOptions options;
  options.fidelity = fidelity;
  const double t = simulate(model::build_program(s, granularity), cost, options).timeline.iteration_time_s;
  cache.emplace(key, t);
  return t;
}

// One cell: mechanism `m` on family `f` at one fidelity and granularity.
void check_cell(std::size_t m, std::size_t f, Fidelity fidelity, model::Granularity granularity) {
  const Mechanism& mechanism = mechanisms()[m];
  const Family& family = families()[f];
  if (mechanism.moe_only && !family.moe) {
    // Does not apply: refused, naming the key (the family's base itself loads).
    ASSERT_NO_THROW(scenario_of(family, {}));
    try {
      scenario_of(family, mechanism.on);
      ADD_FAILURE() << mechanism.name << " accepted on the dense family " << family.name;
    } catch (const model::ScenarioError& error) {
      EXPECT_NE(std::string(error.what()).find(mechanism.refused_key), std::string::npos) << error.what();
    }
    return;
  }
  std::vector<const char*> with = mechanism.both;
  with.insert(with.end(), mechanism.on.begin(), mechanism.on.end());
  const double off = iteration_s(family, mechanism.both, fidelity, granularity);
  const double on = iteration_s(family, with, fidelity, granularity);
  if (mechanism.cp_only && scenario_of(family, {}).parallel.cp == 1) {
    EXPECT_DOUBLE_EQ(on, off) << mechanism.name << " on " << family.name;
    return;
  }
  const double change = on / off - 1;
  EXPECT_GT(mechanism.direction * change, mechanism.least)
      << mechanism.name << " on " << family.name << ": " << off << " s -> " << on << " s";
  EXPECT_LT(std::abs(change), mechanism.most)
      << mechanism.name << " on " << family.name << ": " << off << " s -> " << on << " s";
  // Layer granularity against op granularity, the mechanism on. A fused layer op sums its kernels' times exactly
  // (tests/sim/models_test.cpp); what differs is the order: a layer's collectives run after its fused compute rather
  // than between its kernels, and a paced host issues a fused op's kernels as one block. On these plans that moved
  // the iteration by 0.8 % at most (CP 2, rank fidelity) when the matrix was written, and by 2.6 % (EP 2 with a paced
  // host, whose all-to-alls the measured in-node floors lengthened) once they came: 4 % is the bound, unless a row
  // states its own with its reason.
  if (granularity == model::Granularity::Layer) {
    const double op = iteration_s(family, with, fidelity, model::Granularity::Op);
    EXPECT_NEAR(on / op, 1.0, mechanism.layer_vs_op) << mechanism.name << " on " << family.name << ": layer " << on << " s, op " << op
                                    << " s";
  }
}

// One test per family (each a process under ctest, so that a family's base is simulated once for all its cells):
// every mechanism x fidelity x granularity, each cell named in its failures.
class MechanismMatrix : public ::testing::TestWithParam<std::size_t> {};

TEST_P(MechanismMatrix, EveryMechanismMovesThePredictionAsItsUnitTestSays) {
  const std::size_t f = GetParam();
  for (std::size_t m = 0; m < mechanisms().size(); ++m) {
    for (const Fidelity fidelity : {Fidelity::Rank, Fidelity::Group}) {
      for (const auto granularity : {model::Granularity::Op, model::Granularity::Layer}) {
        SCOPED_TRACE(fmt::format("cell {} x {} x {} x {}", mechanisms()[m].name, families()[f].name,
                                 to_string(fidelity), model::to_string(granularity)));
        check_cell(m, f, fidelity, granularity);
      }
    }
  }
}

// The failure model's keys (cluster.*_failures_per_gpu_hour) move no iteration time: they enter the goodput, at the
// iteration time each plan family, fidelity and granularity simulates (twin sim --goodput, twin goodput). Each key,
// set through the scenario's own override path, must raise the interruptions per day and lower the goodput on every
// cell; a key the reader dropped, or one the goodput never summed, fails here.
TEST_P(MechanismMatrix, EachFailureRateKeyLowersTheGoodputAtTheSimulatedTime) {
  const Family& family = families()[GetParam()];
  const char* keys[] = {"cluster.gpu_failures_per_gpu_hour", "cluster.host_failures_per_gpu_hour",
                        "cluster.nic_failures_per_gpu_hour", "cluster.switch_failures_per_gpu_hour",
                        "cluster.software_failures_per_gpu_hour"};
  // 32 GB/s: the host copy of an asynchronous checkpoint (PCIe 4 x16); these plans checkpoint blocking, unused.
  const auto estimate = [](const model::Scenario& s, double t) {
    return model::goodput_closed_form(model::goodput_inputs(s, t, model::checkpoint_cost(s, 32e9)));
  };
  for (const Fidelity fidelity : {Fidelity::Rank, Fidelity::Group}) {
    for (const auto granularity : {model::Granularity::Op, model::Granularity::Layer}) {
      const double t = iteration_s(family, {}, fidelity, granularity);
      const model::GoodputEstimate base = estimate(scenario_of(family, {}), t);
      for (const char* key : keys) {
        SCOPED_TRACE(fmt::format("{} x {} x {} x {}", key, family.name, to_string(fidelity),
                                 model::to_string(granularity)));
        // 1e-3 per GPU-hour: far above every default (Llama 3's GPU rate is about 2e-5), so the move is clear.
        const std::string set = fmt::format("{}=1e-3", key);
        const model::GoodputEstimate raised = estimate(scenario_of(family, {set.c_str()}), t);
        EXPECT_GT(raised.failures_per_day, base.failures_per_day);
        EXPECT_LT(raised.goodput_fraction, base.goodput_fraction);
      }
    }
  }
}

std::string family_name(const ::testing::TestParamInfo<std::size_t>& param) {
  return families()[param.param].name;
}

INSTANTIATE_TEST_SUITE_P(Families, MechanismMatrix, ::testing::Range<std::size_t>(0, families().size()), family_name);

}  // namespace
}  // namespace twin::sim
