#include "model/program/program_json.hpp"

namespace twin::model {

nlohmann::json op_to_json(const Op& op) {
  nlohmann::json j;
  j["kind"] = to_string(op.kind);
  j["phase"] = to_string(op.phase);
  j["stream"] = to_string(op.stream);
  j["what"] = to_string(op.what);
  if (op.kind == OpKind::Collective) {
    j["collective"] = to_string(op.collective);
    j["group"] = to_string(op.group);
    j["payload"] = to_string(op.payload);
  }
  if (op.layer >= 0) j["layer"] = op.layer;
  if (op.micro_batch >= 0) j["micro_batch"] = op.micro_batch;
  if (op.chunk >= 0) j["chunk"] = op.chunk;
  if (op.cp_ring_step >= 0) j["cp_ring_step"] = op.cp_ring_step;
  if ((op.kind == OpKind::Send || op.kind == OpKind::Recv) && op.group == Group::Context) {
    j["group"] = to_string(op.group);
  } else if (op.kind == OpKind::Send || op.kind == OpKind::Recv) {
    j["peer_stage"] = op.peer_stage;
    j["tag_virtual_stage"] = op.tag_virtual_stage;
  }
  if (op.flops > 0) j["flops"] = op.flops;
  j["bytes"] = op.bytes;
  if (op.gemm.count > 0) j["gemm"] = {{"m", op.gemm.m}, {"n", op.gemm.n}, {"k", op.gemm.k}, {"count", op.gemm.count}};
  if (op.frees_parameters) j["frees_parameters"] = true;
  if (!op.deps.empty()) j["deps"] = op.deps;
  return j;
}

nlohmann::json program_to_json(const Program& program) {
  const Scenario& s = program.scenario;
  nlohmann::json j;
  j["scenario"] = {{"source", s.source},
                   {"model", s.model.name},
                   {"tp", s.parallel.tp},
                   {"pp", s.parallel.pp},
                   {"dp", s.parallel.dp},
                   {"micro_batches", s.parallel.micro_batches()},
                   {"schedule", to_string(s.parallel.schedule)},
                   {"virtual_stages", s.parallel.virtual_stages}};
  j["granularity"] = to_string(program.granularity);
  j["world_size"] = program.layout.world_size();
  j["rank_order"] = "global rank = tp + TP * (dp + DP * pp)";
  j["total_flops"] = program.total_flops();
  nlohmann::json stages = nlohmann::json::array();
  for (int stage = 0; stage < program.stages(); ++stage) {
    nlohmann::json schedule = nlohmann::json::array();
    for (const auto& step : program.schedule[stage]) {
      schedule.push_back({{"micro_batch", step.micro_batch}, {"chunk", step.chunk}, {"pass", to_string(step.pass)}});
    }
    nlohmann::json ops = nlohmann::json::array();
    for (const auto& op : program.stage_ops[stage]) ops.push_back(op_to_json(op));
    stages.push_back({{"stage", stage}, {"schedule", std::move(schedule)}, {"ops", std::move(ops)}});
  }
  j["stages"] = std::move(stages);
  return j;
}

}  // namespace twin::model
