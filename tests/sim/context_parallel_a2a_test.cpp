// Context parallelism's a2a way (framework.cp_comm = "a2a", DeepSpeed-Ulysses; model/ops/context_parallel_a2a.cpp) in the
// Program and the simulator: four all-to-alls over the Context group per pass whose bytes equal
// model/context_parallel's closed form, the attention core over the whole sequence for heads / (tp cp) heads, and at
// 128k tokens each exchange timed as its bytes over the group's NVLink or NIC bandwidth, blocking the attention.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "context_parallel_scenarios.hpp"
#include "model/ops/context_parallel.hpp"
#include "model/program/program.hpp"
#include "sim/collectives.hpp"
#include "sim/cost_model.hpp"
#include "sim/measured_tables.hpp"
#include "sim/simulate.hpp"
#include "topology/hardware.hpp"

namespace twin::sim {
namespace {

using cp_scenarios::cp_attention;
using model::Op;
using model::Payload;
using model::Phase;

// A Llama on DGX H100s (flash attention, rotary, SwiGLU, bf16), one sequence per micro-batch, two micro-batches.
// Llama 3 8B (Meta's model card: 32 layers, hidden 4096, 32 heads, 8 key/value heads, FFN 14336) by default;
// kv_heads = 32 gives a Llama 2 7B-like model whose heads split over more than 8 ranks.
model::Scenario llama(std::int64_t seq, std::int64_t tp, std::int64_t cp, std::string_view cp_comm = "a2a",
                      std::int64_t kv_heads = 8, std::string_view recompute = "none") {
  const std::int64_t nodes = (tp * cp + 7) / 8, dp = nodes * 8 / (tp * cp);
  const std::string toml =
      fmt::format(R"(
[model]
name = "llama"
layers = 32
hidden = 4096
heads = 32
kv_heads = {}
ffn_hidden = 14336
seq_len = {}
vocab = 128256
dtype = "bf16"
norm = "rmsnorm"
activation = "swiglu"
position_embedding = "rope"
linear_bias = false
[parallel]
tp = {}
cp = {}
micro_batch = 1
global_batch = {}
sequence_parallel = {}
recompute = "{}"
[cluster]
nodes = {}
node = "dgx-h100"
[framework]
name = "megatron"
tied_embeddings = false
dropout = false
attention = "flash2"
cp_comm = "{}"
)",
                  kv_heads, seq, tp, cp, 2 * dp, tp > 1 ? "true" : "false", recompute, nodes, cp_comm);
  return model::parse_scenario(toml, "test");
}

// The Context group's ops of one layer and micro-batch in one phase, in issue order (compute ops as well).
std::vector<Op> layer_ops_of(const model::Program& program, int layer, int micro_batch, Phase phase) {
  std::vector<Op> ops;
  for (const Op& op : program.stage_ops[0]) {
    if (op.layer == layer && op.micro_batch == micro_batch && op.phase == phase) ops.push_back(op);
  }
  return ops;
}

std::vector<Payload> context_payloads(const std::vector<Op>& ops) {
  std::vector<Payload> payloads;
  for (const Op& op : ops) {
    if (op.kind == model::OpKind::Collective && op.group == model::Group::Context) {
      EXPECT_EQ(op.collective, model::CollectiveKind::AllToAll);
      EXPECT_EQ(op.stream, model::Stream::Compute);  // TE runs them on the compute stream: nothing overlaps them
      payloads.push_back(op.payload);
    }
  }
  return payloads;
}

double context_bytes(const std::vector<Op>& ops) {
  double bytes = 0;
  for (const Op& op : ops) {
    if (op.kind == model::OpKind::Collective && op.group == model::Group::Context) bytes += op.bytes;
  }
  return bytes;
}

TEST(ContextParallelA2aProgram, ExchangeBytesEqualTheClosedFormAtBothGranularities) {
  for (auto [tp, cp] : {std::pair<std::int64_t, std::int64_t>{1, 2}, {1, 8}, {2, 4}, {4, 8}}) {
    const model::Scenario s = llama(8192, tp, cp, "a2a", 32);
    const model::CpTraffic forward = model::cp_forward_traffic(cp_attention(s), model::CpComm::AllToAll);
    const model::CpTraffic backward = model::cp_backward_traffic(cp_attention(s), model::CpComm::AllToAll);
    for (model::Granularity granularity : {model::Granularity::Op, model::Granularity::Layer}) {
      const model::Program program = model::build_program(s, granularity);
      for (int micro_batch : {0, 1}) {
        const auto fwd = layer_ops_of(program, 5, micro_batch, Phase::Forward);
        const auto bwd = layer_ops_of(program, 5, micro_batch, Phase::Backward);
        EXPECT_DOUBLE_EQ(context_bytes(fwd), forward.collective_input_bytes) << "tp " << tp << " cp " << cp;
        EXPECT_DOUBLE_EQ(context_bytes(bwd), backward.collective_input_bytes) << "tp " << tp << " cp " << cp;
        EXPECT_EQ(static_cast<int>(context_payloads(fwd).size()), forward.all_to_alls);
        EXPECT_EQ(static_cast<int>(context_payloads(bwd).size()), backward.all_to_alls);
        EXPECT_TRUE(layer_ops_of(program, 5, micro_batch, Phase::Recompute).empty());
      }
    }
  }
}

// Transformer Engine's order: q, k, v to heads, the core, the output back; backward dout, the core, dq, dk, dv.
TEST(ContextParallelA2aProgram, AllToAllsSurroundTheAttentionCoreInTransformerEnginesOrder) {
  const model::Program program = model::build_program(llama(8192, 2, 4), model::Granularity::Op);
  const auto around_core = [](const std::vector<Op>& ops) {
    std::vector<std::string> order;
    for (const Op& op : ops) {
      if (op.what != model::ComputeKind::AttentionCore) continue;
      order.emplace_back(op.kind == model::OpKind::Compute ? "core" : std::string(model::to_string(op.payload)));
    }
    return order;
  };
  EXPECT_EQ(around_core(layer_ops_of(program, 0, 0, Phase::Forward)),
            (std::vector<std::string>{"ulysses_queries", "ulysses_keys", "ulysses_values", "core", "ulysses_output"}));
  EXPECT_EQ(around_core(layer_ops_of(program, 0, 0, Phase::Backward)),
            (std::vector<std::string>{"ulysses_output_grad", "core", "ulysses_query_grads", "ulysses_key_grads",
                                      "ulysses_value_grads"}));
  // A selective recompute reruns the checkpointed attention whole, its four all-to-alls included; a full one too.
  for (std::string_view recompute : {"selective", "full"}) {
    const model::Program again = model::build_program(llama(8192, 2, 4, "a2a", 8, recompute), model::Granularity::Op);
    EXPECT_EQ(around_core(layer_ops_of(again, 0, 0, Phase::Recompute)),
              (std::vector<std::string>{"ulysses_queries", "ulysses_keys", "ulysses_values", "core", "ulysses_output"}))
        << recompute;
  }
}

// After the all-to-all each rank runs whole-sequence causal attention for heads / (tp cp) heads: the FLOPs of
// 1 / (tp cp) of the sequence's heads (what all_gather's share of the causal pairs also comes to), on a GEMM of the
// whole sequence's queries and keys.
TEST(ContextParallelA2aProgram, TheCoreAttendsTheWholeSequenceForItsHeadGroup) {
  const auto core = [](const model::Program& program, Phase phase) {
    for (const Op& op : layer_ops_of(program, 0, 0, phase)) {
      if (op.kind == model::OpKind::Compute && op.what == model::ComputeKind::AttentionCore) return op;
    }
    return Op{};
  };
  const model::Program one = model::build_program(llama(8192, 2, 1), model::Granularity::Op);
  const model::Program ulysses = model::build_program(llama(8192, 2, 4), model::Granularity::Op);
  const model::Program gathered = model::build_program(llama(8192, 2, 4, "all_gather"), model::Granularity::Op);
  for (Phase phase : {Phase::Forward, Phase::Backward}) {
    EXPECT_DOUBLE_EQ(core(ulysses, phase).flops * 4, core(one, phase).flops);
    EXPECT_DOUBLE_EQ(core(ulysses, phase).flops, core(gathered, phase).flops);
    EXPECT_EQ(core(ulysses, phase).gemm.m, 8192);                                 // the whole sequence's queries ...
    EXPECT_EQ(core(ulysses, phase).gemm.n, 8192);                                 // ... against its keys
    EXPECT_EQ(core(ulysses, phase).gemm.count * 4, core(one, phase).gemm.count);  // a quarter of the heads
  }
}

// a2a gives every rank whole heads: Llama 3 8B's 8 key/value heads do not split over TP 8 x CP 2, refused by name.
TEST(ContextParallelA2aProgram, HeadsThatDoNotSplitOverTpTimesCpAreRefused) {
  try {
    model::build_program(llama(8192, 8, 2), model::Granularity::Layer);
    FAIL() << "a2a over tp x cp = 16 ranks with 8 key/value heads";
  } catch (const model::ScenarioError& error) {
    EXPECT_NE(std::string(error.what()).find("framework.cp_comm = \"a2a\" gives each of the tp * cp = 16 ranks"),
              std::string::npos)
        << error.what();
  }
  EXPECT_NO_THROW(model::build_program(llama(8192, 8, 2, "a2a", 32), model::Granularity::Layer));
}

// One all-to-all over the Context group as the simulator times it, against its bytes over the group's bandwidth:
// each member keeps 1 / cp of its tensor and sends the rest, the share to members of its own node over NVLink and
// the rest through its NIC (the slower port sets the time), plus NCCL's Simple-protocol base latency and one step
// (sim/all_to_all.cpp); inside one node, no faster than the all-to-all OpenXLA measured there at the member's bytes
// (sim/data/collectives_by_size.csv).
double closed_form_s(const Op& op, int cp, int members_per_node) {
  const topology::NodeSpec node = topology::dgx_h100();
  const NcclTuning nccl;
  const double share = op.bytes / cp;
  const double nvlink_s = (members_per_node - 1) * share / node.nvlink_effective_bytes_per_s;
  const double nic_s = (cp - members_per_node) * share / node.nic_effective_bytes_per_s;
  const bool across = members_per_node < cp;
  const double modelled_s = nccl.ring_simple_base_s +
                            (across ? nccl.ring_simple_net_step_s : nccl.ring_simple_nvlink_step_s) +
                            std::max(nvlink_s, nic_s);
  if (across) return modelled_s;
  return std::max(modelled_s, all_to_all_table(node.gpu.name, cp)->seconds(op.bytes));
}

struct ExchangeTimes {
  double measured_s = 0, closed_form_s = 0;
};

// Layer 5's forward and backward all-to-alls on global rank 0, with the checks that they block the attention core.
ExchangeTimes simulate_exchanges(const model::Scenario& s, int members_per_node) {
  const model::Program program = model::build_program(s, model::Granularity::Layer);
  const AnalyticalCostModel cost(topology::h100_sxm5_80gb());
  SimOptions options;
  options.fidelity = Fidelity::Rank;
  const SimResult result = simulate(program, cost, options);
  const report::RankTimeline* rank0 = result.timeline.find(0);
  EXPECT_NE(rank0, nullptr);
  ExchangeTimes times;
  if (rank0 == nullptr) return times;
  const report::OpSpan* core = nullptr;
  for (const report::OpSpan& span : rank0->spans) {
    const Op& op = program.stage_ops[0][static_cast<std::size_t>(span.op)];
    if (op.layer != 5 || op.micro_batch != 1 || op.phase == Phase::Recompute) continue;
    if (op.kind == model::OpKind::Compute) core = &span;  // the fused layer: its compute between the exchanges
    if (op.kind != model::OpKind::Collective || op.group != model::Group::Context) continue;
    times.measured_s += span.end_s - span.active_s;
    times.closed_form_s += closed_form_s(op, static_cast<int>(s.parallel.cp), members_per_node);
    // Not overlapped: on the compute stream's critical path, after the compute before it
    if (core != nullptr) {
      EXPECT_GE(span.start_s, core->end_s) << model::to_string(op.payload);
    }
  }
  return times;
}

TEST(ContextParallelA2aSim, At128kTokensEachAllToAllTakesItsBytesOverTheGroupsBandwidth) {
  // Llama 3 8B, CP 8 on one DGX H100 (8 key/value heads: tp x cp = 8 at most): NVLink.
  const ExchangeTimes nvlink = simulate_exchanges(llama(131072, 1, 8), 8);
  // A 32 key/value head Llama at TP 4, CP 8 on four nodes: 2 of each CP group's 8 members per node, the NICs.
  const ExchangeTimes fabric = simulate_exchanges(llama(131072, 4, 8, "a2a", 32), 2);
  std::printf(
      "[ a2a ] 128k tokens, layer 5's 8 all-to-alls: CP 8 on NVLink %.3f ms (closed form %.3f ms); "
      "TP 4 CP 8 across nodes %.3f ms (closed form %.3f ms)\n",
      nvlink.measured_s * 1e3, nvlink.closed_form_s * 1e3, fabric.measured_s * 1e3, fabric.closed_form_s * 1e3);
  EXPECT_GT(nvlink.closed_form_s, 0);
  EXPECT_NEAR(nvlink.measured_s, nvlink.closed_form_s, 0.01 * nvlink.closed_form_s);
  EXPECT_NEAR(fabric.measured_s, fabric.closed_form_s, 0.01 * fabric.closed_form_s);
}

// Per layer a rank sends 4 (cp - 1) / cp (q + kv) bytes with a2a and 6 (cp - 1) kv with all_gather (K and V shards in
// the forward's gather, the backward's re-gather, the reduce-scatter of dK, dV). With Llama 3's 4 query heads per
// key/value head (q = 4 kv) that is 17.5 against 42 kv at CP 8: a2a exchanges less, and the iteration is shorter.
TEST(ContextParallelA2aSim, A2aExchangesLessThanAllGatherWithGroupedQueries) {
  const AnalyticalCostModel cost(topology::h100_sxm5_80gb());
  const auto iteration_s = [&](std::string_view comm) {
    return simulate(model::build_program(llama(131072, 1, 8, comm), model::Granularity::Layer), cost)
        .timeline.iteration_time_s;
  };
  const double ulysses = iteration_s("a2a"), gathered = iteration_s("all_gather");
  std::printf("[ a2a ] llama3-8b 128k tokens, CP 8 on one node: a2a %.3f s, all_gather %.3f s\n", ulysses, gathered);
  EXPECT_GT(ulysses, 0);
  EXPECT_LT(ulysses, gathered);
}

}  // namespace
}  // namespace twin::sim
