// The Program: one training iteration as, for every rank, an ordered list of ops (compute, collective,
// point-to-point). Built once from a Scenario; the simulator replays it, the executor runs it.
//
// Every rank of a pipeline stage runs the same list (its TP and DP peers follow the same schedule), so the Program
// stores one list per stage; groups and peers are named relative to the rank's coordinates (see ranks.hpp).
//
// Execution semantics, which both engines honour:
//   - a rank issues its ops in list order without waiting for them;
//   - an op starts once every op in its `deps` has finished and, on an ordered stream (Compute, DataParallel), once
//     the previous op of that stream has finished;
//   - Pipeline-stream ops (Send/Recv) are unordered: a Send starts when its deps finish and completes when its bytes
//     arrive; a Recv completes when the matching Send's bytes have arrived (matched by P2PTag, never by order);
//   - a collective completes when every member of its group has reached it; all members issue the same collectives
//     in the same order.
// A sequential interpreter (the CPU executor) may simply run the list in order: that is one valid execution.
// What the framework adds, the simulator replays: each compute op's kernels (Op::breakdown) and how the framework
// issues its Send/Recv ops, in which order and whether they wait for their peer (stage_exchanges, exchanges.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "model/ops/exchanges.hpp"
#include "model/ops/op.hpp"
#include "model/plan/rank_shapes.hpp"
#include "model/plan/ranks.hpp"
#include "model/plan/schedule.hpp"
#include "model/scenario/scenario.hpp"

namespace twin::model {

struct Program {
  Scenario scenario;
  Granularity granularity = Granularity::Op;
  RankLayout layout{1, 1, 1};
  RankShapes shapes;  // the widths every rank works on (rank_shapes), which the ops and the executor size by
  std::vector<StageSchedule> schedule;     // per stage, as build_schedule gave it
  std::vector<std::vector<Op>> stage_ops;  // per stage: the op list every rank of the stage runs
  // How the framework issues its pipeline exchanges, and per stage each exchange's Send/Recv ops in the order the
  // framework issues them (exchanges.hpp).
  ExchangeIssue exchange_issue = ExchangeIssue::Batched;
  std::vector<std::vector<PipelineExchange>> stage_exchanges;

  int stages() const { return static_cast<int>(stage_ops.size()); }
  const std::vector<Op>& ops_of_rank(int rank) const { return stage_ops[layout.coord_of(rank).pp]; }
  std::size_t ops_per_rank(int stage) const { return stage_ops[stage].size(); }
  std::size_t total_ops() const;  // over every rank
  // Matrix-multiply FLOPs of the whole iteration, summed over every rank.
  double total_flops() const;
};

// The rank grid of a scenario's plan: tp, pp, dp, cp and the expert grid's ep, etp (the layout build_program gives
// its Program; a checkpoint's plan is compared and re-sharded by it).
RankLayout rank_layout(const Scenario& scenario);

Program build_program(const Scenario& scenario, Granularity granularity = Granularity::Op);

// Ops build_program would put in the stage lists (one rank per stage), from one layer's op count times the layers
// and micro-batches each stage runs, without building anything: what a caller checks against the memory it has
// before building a Program (about kProgramBytesPerOp each) for a scenario with absurd sizes.
double estimated_stage_ops(const Scenario& scenario, Granularity granularity);
// Measured: `twin graph mtnlg-530b` (0.94 M stage ops at op granularity) peaks at 300 MB resident.
inline constexpr double kProgramBytesPerOp = 300;

// The op-granularity compute ops of one transformer layer (global index `layer`) in one phase, for one micro-batch,
// each with its kernels: what a `TransformerLayer` op fuses (its KernelBreakdown's parts).
std::vector<Op> layer_compute_ops(const Scenario& scenario, int layer, Phase phase);
// The (first) `TransformerLayer` op of that layer and phase, as a layer-granularity Program has it: the whole layer's
// compute, except in a MoE layer's forward, where the host's split-size sync ends the first one.
Op fused_layer_op(const Scenario& scenario, int layer, Phase phase);

// The shape of the GEMM of weight `what` (QkvProjection, AttentionProjection, MlpUp, MlpDown, LmHead) for one
// micro-batch on one rank, as its forward runs it; empty (count 0) for any other kind.
GemmShape weight_gemm_shape(const Scenario& scenario, ComputeKind what);

// Bytes of the copies the framework makes around the attention core in `phase` for one micro-batch (the context's
// layout copy forward, the Q/K/V gradients' concatenation backward): part of an AttentionCore op's bytes.
double attention_layout_copy_bytes(const Scenario& scenario, Phase phase);

std::string_view to_string(Pass pass);

}  // namespace twin::model
