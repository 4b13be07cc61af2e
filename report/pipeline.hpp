// The boxes of a pipeline diagram, as data: for each stage's representative rank, one box per (micro-batch, chunk,
// pass) of compute, in time order. Computed once from a Program and a Timeline (pipeline_of); kept in `twin sim --json`
// under "pipeline" (pipeline_to_json) so that `twin report` draws the diagram from the JSON alone.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/program/program.hpp"
#include "report/timeline.hpp"

namespace twin::report {

enum class BoxKind { Forward, Backward, WeightGrad, Sync };

struct PipelineBox {
  double start_s = 0, end_s = 0;
  int micro_batch = -1;  // -1: gradient synchronisation and optimizer (no micro-batch)
  int chunk = 0;
  BoxKind kind = BoxKind::Forward;
};

struct PipelineRow {
  int stage = 0;
  int rank = 0;  // the rank drawn for the stage
  std::vector<PipelineBox> boxes;
};

struct Pipeline {
  std::string model;  // the model's name, for the title
  double iteration_time_s = 0;
  int stages = 0;
  int micro_batches = 0;          // per pipeline
  int chunks = 1;                 // model chunks per stage (interleaved schedule)
  std::vector<PipelineRow> rows;  // one per stage that has a recorded rank, by stage
};

// Consecutive compute-stream ops of one (micro-batch, chunk, pass) form a box, as long as they follow each other
// without a wait (a collective's wait for its other members is bubble, not part of a box).
Pipeline pipeline_of(const model::Program& program, const Timeline& timeline);

// {"iteration_time_s", "stages", "micro_batches", "chunks", "rows": [{"stage", "rank", "boxes": [[kind,
// micro_batch, chunk, start_s, end_s], ...]}]}, kind one of "F" (forward), "B" (backward), "W" (weight gradient),
// "S" (sync and optimizer). Compact: a box is one short array.
nlohmann::json pipeline_to_json(const Pipeline& pipeline);
// The same back; throws std::invalid_argument naming the field when the JSON is not of that shape.
Pipeline pipeline_from_json(const nlohmann::json& json, const std::string& model_name);

}  // namespace twin::report
