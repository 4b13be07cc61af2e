// Scenarios built in code for model tests.
#pragma once

#include <string>
#include <vector>

#include "model/program/program.hpp"
#include "model/scenario/scenario.hpp"

namespace twin::model::testing {

// A valid scenario: a GPT with the given shape and plan on a cpu-host cluster sized to the plan.
inline Scenario make_scenario(int layers, int hidden, int heads, int seq, int vocab, int tp, int pp, int dp,
                              int micro_batch, int global_batch) {
  Scenario s;
  s.source = "test";
  s.model.layers = layers;
  s.model.hidden = hidden;
  s.model.heads = heads;
  s.model.seq_len = seq;
  s.model.vocab = vocab;
  s.parallel.tp = tp;
  s.parallel.pp = pp;
  s.parallel.dp = dp;
  s.parallel.micro_batch = micro_batch;
  s.parallel.global_batch = global_batch;
  s.cluster.node = NodeKind::DgxA100;
  s.cluster.gpus_per_node = 8;
  s.cluster.nodes = 1;
  if ((tp * pp * dp) % 8 == 0) {
    s.cluster.nodes = tp * pp * dp / 8;
  } else {
    s.cluster.gpus_per_node = tp * pp * dp;
  }
  return s;
}

// The problems a scenario text is refused for (none: it loads).
inline std::vector<std::string> problems_of(const std::string& text) {
  try {
    parse_scenario(text, "case.toml");
  } catch (const ScenarioError& error) {
    return error.problems();
  }
  return {};
}

// Bytes the compute ops of kind `what` move in layer 0's `phase`, for one micro-batch.
inline double bytes_of(const Scenario& s, Phase phase, ComputeKind what) {
  double bytes = 0;
  for (const Op& op : layer_compute_ops(s, 0, phase)) {
    if (op.what == what) bytes += op.bytes;
  }
  return bytes;
}

// Layer 0's ops of micro-batch 0 in `phase`, compute and collectives, as build_program lays them out on stage 0.
inline std::vector<Op> first_layer_ops(const Scenario& s, Phase phase) {
  const Program program = build_program(s, Granularity::Op);
  std::vector<Op> ops;
  for (const Op& op : program.stage_ops[0]) {
    if (op.layer == 0 && op.micro_batch == 0 && op.phase == phase) ops.push_back(op);
  }
  return ops;
}

inline std::string source_dir() {
  const char* dir = std::getenv("TWIN_SOURCE_DIR");
  return dir ? dir : TWIN_SOURCE_DIR_FALLBACK;
}

}  // namespace twin::model::testing
