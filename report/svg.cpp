#include "report/svg.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace twin::report {

namespace {

enum class BoxKind { Forward, Backward, WeightGrad, Sync };

struct Box {
  double start_s, end_s;
  int micro_batch, chunk;
  BoxKind kind;
};

// Consecutive compute-stream ops of one (micro-batch, chunk, pass) form a box, as long as they follow each other
// without a wait (a collective's wait for its other members is bubble, not part of a box).
std::vector<Box> boxes_of(const model::Program& program, const RankTimeline& rank, double tolerance_s) {
  const auto& ops = program.stage_ops[rank.stage];
  std::vector<Box> boxes;
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

const char* colour(BoxKind kind, int chunk) {
  const bool odd = chunk % 2 == 1;
  switch (kind) {
    case BoxKind::Forward:
      return odd ? "#a0cbe8" : "#4e79a7";
    case BoxKind::Backward:
      return odd ? "#8cd17d" : "#59a14f";
    case BoxKind::WeightGrad:  // a zero-bubble schedule's W, apart from its B
      return odd ? "#ffbe7d" : "#f28e2b";
    case BoxKind::Sync:
      return "#bab0ac";
  }
  return "#000000";
}

}  // namespace

std::string pipeline_svg(const model::Program& program, const Timeline& timeline) {
  std::vector<const RankTimeline*> rows(program.stages(), nullptr);
  for (const RankTimeline& rank : timeline.ranks) {
    if (rows[rank.stage] == nullptr) rows[rank.stage] = &rank;
  }
  const double T = std::max(timeline.iteration_time_s, 1e-12);
  const double left = 80, top = 44, row = 22, gap = 4, plot_width = 1400, right = 20;
  const double height = top + program.stages() * (row + gap) + 40;
  const double width = left + plot_width + right;
  const auto x_of = [&](double seconds) { return left + plot_width * seconds / T; };

  std::string out;
  auto it = std::back_inserter(out);
  fmt::format_to(it,
                 "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" "
                 "font-family=\"Helvetica,Arial,sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
                 width, height);
  fmt::format_to(
      it,
      "<text x=\"{:.0f}\" y=\"20\" font-size=\"14\">{}: one iteration, {:.3f} s ({} stages, {} "
      "micro-batches; blue forward, green backward, orange weight gradient (W), grey gradient sync and optimizer, "
      "white bubble)</text>\n",
      left, program.scenario.model.name, timeline.iteration_time_s, program.stages(),
      program.scenario.parallel.micro_batches());
  for (int stage = 0; stage < program.stages(); ++stage) {
    const double y = top + stage * (row + gap);
    fmt::format_to(it, "<text x=\"8\" y=\"{:.1f}\" font-size=\"11\">stage {}</text>\n", y + row * 0.7, stage);
    fmt::format_to(it,
                   "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" "
                   "stroke=\"#dddddd\"/>\n",
                   left, y, plot_width, row);
    if (rows[stage] == nullptr) continue;
    for (const Box& box : boxes_of(program, *rows[stage], T * 1e-6)) {
      const double x0 = x_of(box.start_s), x1 = x_of(box.end_s);
      const double w = std::max(0.5, x1 - x0);
      fmt::format_to(it,
                     "<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" fill=\"{}\" stroke=\"white\" "
                     "stroke-width=\"0.3\"/>\n",
                     x0, y, w, row, colour(box.kind, box.chunk));
      const std::string label = box.kind == BoxKind::Sync ? "" : std::to_string(box.micro_batch + 1);
      if (!label.empty() && w >= 6.0 * static_cast<double>(label.size()) + 2) {
        fmt::format_to(it,
                       "<text x=\"{:.2f}\" y=\"{:.1f}\" font-size=\"10\" fill=\"white\" "
                       "text-anchor=\"middle\">{}</text>\n",
                       x0 + w / 2, y + row * 0.68, label);
      }
    }
  }
  // Time axis: ten ticks.
  const double axis_y = top + program.stages() * (row + gap) + 4;
  fmt::format_to(it, "<line x1=\"{:.0f}\" y1=\"{:.1f}\" x2=\"{:.0f}\" y2=\"{:.1f}\" stroke=\"black\"/>\n", left, axis_y,
                 left + plot_width, axis_y);
  for (int tick = 0; tick <= 10; ++tick) {
    const double seconds = T * tick / 10, x = x_of(seconds);
    fmt::format_to(it,
                   "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"black\"/>\n"
                   "<text x=\"{0:.1f}\" y=\"{3:.1f}\" font-size=\"10\" text-anchor=\"middle\">{4:.3g} s</text>\n",
                   x, axis_y, axis_y + 4, axis_y + 16, seconds);
  }
  out += "</svg>\n";
  return out;
}

}  // namespace twin::report
