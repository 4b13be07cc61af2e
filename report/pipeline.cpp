// Boxes of the pipeline diagram from a rank's op spans, and their compact JSON form.
#include "report/pipeline.hpp"

#include <algorithm>
#include <stdexcept>

namespace twin::report {

namespace {

std::vector<PipelineBox> boxes_of(const model::Program& program, const RankTimeline& rank, double tolerance_s) {
  const auto& ops = program.stage_ops[rank.stage];
  std::vector<PipelineBox> boxes;
  for (const OpSpan& span : rank.spans) {
    const model::Op& op = ops[span.op];
    if (op.stream != model::Stream::Compute) continue;
    const BoxKind kind = op.micro_batch < 0                     ? BoxKind::Sync
                         : op.phase == model::Phase::Forward    ? BoxKind::Forward
                         : op.phase == model::Phase::WeightGrad ? BoxKind::WeightGrad
                                                                : BoxKind::Backward;
    const double start = span.active_s;  // a compute op waiting for the host is not drawn busy
    if (!boxes.empty() && boxes.back().kind == kind && boxes.back().micro_batch == op.micro_batch &&
        boxes.back().chunk == op.chunk && start <= boxes.back().end_s + tolerance_s) {
      boxes.back().end_s = std::max(boxes.back().end_s, span.end_s);
      continue;
    }
    if (span.end_s > start) boxes.push_back({start, span.end_s, op.micro_batch, op.chunk, kind});
  }
  return boxes;
}

const char* kind_letter(BoxKind kind) {
  switch (kind) {
    case BoxKind::Forward:
      return "F";
    case BoxKind::Backward:
      return "B";
    case BoxKind::WeightGrad:
      return "W";
    case BoxKind::Sync:
      return "S";
  }
  return "S";
}

BoxKind kind_of_letter(const std::string& letter) {
  if (letter == "F") return BoxKind::Forward;
  if (letter == "B") return BoxKind::Backward;
  if (letter == "W") return BoxKind::WeightGrad;
  if (letter == "S") return BoxKind::Sync;
  throw std::invalid_argument("pipeline.rows[].boxes[][0] is '" + letter + "', not F, B, W or S");
}

}  // namespace

Pipeline pipeline_of(const model::Program& program, const Timeline& timeline) {
  Pipeline pipeline;
  pipeline.model = program.scenario.model.name;
  pipeline.iteration_time_s = timeline.iteration_time_s;
  pipeline.stages = program.stages();
  pipeline.micro_batches = static_cast<int>(program.scenario.parallel.micro_batches());
  pipeline.chunks = static_cast<int>(std::max<std::int64_t>(1, program.scenario.parallel.virtual_stages));
  const double tolerance_s = std::max(timeline.iteration_time_s, 1e-12) * 1e-6;
  for (int stage = 0; stage < program.stages(); ++stage) {
    for (const RankTimeline& rank : timeline.ranks) {
      if (rank.stage != stage) continue;
      pipeline.rows.push_back({stage, rank.rank, boxes_of(program, rank, tolerance_s)});
      break;  // the first recorded rank of the stage
    }
  }
  return pipeline;
}

nlohmann::json pipeline_to_json(const Pipeline& pipeline) {
  nlohmann::json rows = nlohmann::json::array();
  for (const PipelineRow& row : pipeline.rows) {
    nlohmann::json boxes = nlohmann::json::array();
    for (const PipelineBox& box : row.boxes) {
      boxes.push_back({kind_letter(box.kind), box.micro_batch, box.chunk, box.start_s, box.end_s});
    }
    rows.push_back({{"stage", row.stage}, {"rank", row.rank}, {"boxes", std::move(boxes)}});
  }
  return {{"iteration_time_s", pipeline.iteration_time_s},
          {"stages", pipeline.stages},
          {"micro_batches", pipeline.micro_batches},
          {"chunks", pipeline.chunks},
          {"rows", std::move(rows)}};
}

Pipeline pipeline_from_json(const nlohmann::json& json, const std::string& model_name) {
  Pipeline pipeline;
  pipeline.model = model_name;
  try {
    pipeline.iteration_time_s = json.at("iteration_time_s").get<double>();
    pipeline.stages = json.at("stages").get<int>();
    pipeline.micro_batches = json.at("micro_batches").get<int>();
    pipeline.chunks = std::max(1, json.at("chunks").get<int>());
    for (const nlohmann::json& row : json.at("rows")) {
      PipelineRow out{row.at("stage").get<int>(), row.at("rank").get<int>(), {}};
      for (const nlohmann::json& box : row.at("boxes")) {
        out.boxes.push_back({box.at(3).get<double>(), box.at(4).get<double>(), box.at(1).get<int>(),
                             box.at(2).get<int>(), kind_of_letter(box.at(0).get<std::string>())});
      }
      pipeline.rows.push_back(std::move(out));
    }
  } catch (const nlohmann::json::exception& error) {
    throw std::invalid_argument(std::string("pipeline: ") + error.what());
  }
  return pipeline;
}

}  // namespace twin::report
