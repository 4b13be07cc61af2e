#include "report/svg.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "report/html_parts.hpp"

namespace twin::report {

namespace {

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

// The time axis wide enough that the median box is `min_box_px` wide (a box's micro-batch number fits in 14 px up
// to two digits), at least the default 1400 px and at most 60000 px (beyond that a browser's scroll is the zoom).
double fitted_plot_width(const Pipeline& pipeline, double min_box_px) {
  std::vector<double> durations;
  for (const PipelineRow& row : pipeline.rows) {
    for (const PipelineBox& box : row.boxes) {
      if (box.kind != BoxKind::Sync) durations.push_back(box.end_s - box.start_s);
    }
  }
  if (durations.empty()) return 1400;
  std::nth_element(durations.begin(), durations.begin() + durations.size() / 2, durations.end());
  const double median_s = std::max(durations[durations.size() / 2], 1e-15);
  return std::clamp(min_box_px * pipeline.iteration_time_s / median_s, 1400.0, 60000.0);
}

std::string title_of(const Pipeline& pipeline, const PipelineLayout& layout) {
  const std::string name = layout.escape_text ? html::escaped(pipeline.model) : pipeline.model;
  if (!layout.row_per_chunk) {
    return fmt::format(
        "{}: one iteration, {:.3f} s ({} stages, {} micro-batches; blue forward, green backward, orange weight "
        "gradient (W), grey gradient sync and optimizer, white bubble)",
        name, pipeline.iteration_time_s, pipeline.stages, pipeline.micro_batches);
  }
  return fmt::format(
      "{}: one iteration, {:.3f} s ({} stages x {} chunk{}, {} micro-batches; one row per stage and chunk, boxes "
      "numbered by micro-batch)",
      name, pipeline.iteration_time_s, pipeline.stages, pipeline.chunks, pipeline.chunks > 1 ? "s" : "",
      pipeline.micro_batches);
}

// The legend under the axis of a diagram with a row per chunk: each pass in each chunk's shade.
void draw_legend(std::string& out, const Pipeline& pipeline, double left, double y) {
  auto it = std::back_inserter(out);
  double x = left;
  const auto item = [&](const char* fill, const std::string& text) {
    fmt::format_to(it,
                   "<rect x=\"{:.0f}\" y=\"{:.0f}\" width=\"14\" height=\"12\" fill=\"{}\"/>"
                   "<text x=\"{:.0f}\" y=\"{:.0f}\" font-size=\"11\">{}</text>\n",
                   x, y, fill, x + 18, y + 10, text);
    x += 26 + 6.5 * static_cast<double>(text.size());
  };
  bool weight_grad = false;  // a zero-bubble schedule's W boxes: named only where there are some
  for (const PipelineRow& row : pipeline.rows) {
    for (const PipelineBox& box : row.boxes) weight_grad |= box.kind == BoxKind::WeightGrad;
  }
  for (int chunk = 0; chunk < std::min(pipeline.chunks, 2); ++chunk) {
    const std::string which = pipeline.chunks > 2   ? (chunk == 0 ? " (chunks 0, 2, ...)" : " (chunks 1, 3, ...)")
                              : pipeline.chunks > 1 ? fmt::format(" (chunk {})", chunk)
                                                    : "";
    item(colour(BoxKind::Forward, chunk), "forward" + which);
    item(colour(BoxKind::Backward, chunk), "backward" + which);
    if (weight_grad) item(colour(BoxKind::WeightGrad, chunk), "weight gradient" + which);
  }
  item(colour(BoxKind::Sync, 0), "gradient sync and optimizer");
  item("#ffffff", "bubble (white)");
}

}  // namespace

std::string pipeline_svg(const model::Program& program, const Timeline& timeline) {
  return pipeline_svg(pipeline_of(program, timeline), PipelineLayout{});
}

std::string pipeline_svg(const Pipeline& pipeline, const PipelineLayout& layout) {
  const int per_stage = layout.row_per_chunk ? pipeline.chunks : 1;
  const int rows = pipeline.stages * per_stage;
  const double T = std::max(pipeline.iteration_time_s, 1e-12);
  const double left = layout.row_per_chunk ? 110 : 80, top = 44, row = 22, gap = 4, right = 20;
  const double plot_width = layout.fit_boxes ? fitted_plot_width(pipeline, 14) : 1400;
  const double legend = layout.row_per_chunk ? 24 : 0;
  const double height = top + rows * (row + gap) + 40 + legend;
  const double width = left + plot_width + right;
  const auto x_of = [&](double seconds) { return left + plot_width * seconds / T; };

  std::string out;
  auto it = std::back_inserter(out);
  fmt::format_to(it,
                 "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" "
                 "font-family=\"Helvetica,Arial,sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
                 width, height);
  fmt::format_to(it, "<text x=\"{:.0f}\" y=\"20\" font-size=\"14\">{}</text>\n", left, title_of(pipeline, layout));
  std::vector<const PipelineRow*> of_stage(static_cast<std::size_t>(std::max(pipeline.stages, 0)), nullptr);
  for (const PipelineRow& stage_row : pipeline.rows) {
    if (stage_row.stage >= 0 && stage_row.stage < pipeline.stages) of_stage[stage_row.stage] = &stage_row;
  }
  for (int r = 0; r < rows; ++r) {
    const double y = top + r * (row + gap);
    const int stage = r / per_stage, chunk = r % per_stage;
    const std::string label =
        layout.row_per_chunk ? fmt::format("stage {} chunk {}", stage, chunk) : fmt::format("stage {}", stage);
    fmt::format_to(it, "<text x=\"8\" y=\"{:.1f}\" font-size=\"11\">{}</text>\n", y + row * 0.7, label);
    fmt::format_to(it,
                   "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" "
                   "stroke=\"#dddddd\"/>\n",
                   left, y, plot_width, row);
    if (of_stage[stage] == nullptr) continue;
    for (const PipelineBox& box : of_stage[stage]->boxes) {
      // A row per chunk: the sync and optimizer ops of a stage (chunk 0) are drawn in its first row.
      if (layout.row_per_chunk && std::clamp(box.chunk, 0, per_stage - 1) != chunk) continue;
      const double x0 = x_of(box.start_s), x1 = x_of(box.end_s);
      const double w = std::max(0.5, x1 - x0);
      fmt::format_to(it,
                     "<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" fill=\"{}\" stroke=\"white\" "
                     "stroke-width=\"0.3\"/>\n",
                     x0, y, w, row, colour(box.kind, box.chunk));
      const std::string number = box.kind == BoxKind::Sync ? "" : std::to_string(box.micro_batch + 1);
      if (!number.empty() && w >= 6.0 * static_cast<double>(number.size()) + 2) {
        fmt::format_to(it,
                       "<text x=\"{:.2f}\" y=\"{:.1f}\" font-size=\"10\" fill=\"white\" "
                       "text-anchor=\"middle\">{}</text>\n",
                       x0 + w / 2, y + row * 0.68, number);
      }
    }
  }
  // Time axis: ten ticks.
  const double axis_y = top + rows * (row + gap) + 4;
  fmt::format_to(it, "<line x1=\"{:.0f}\" y1=\"{:.1f}\" x2=\"{:.0f}\" y2=\"{:.1f}\" stroke=\"black\"/>\n", left, axis_y,
                 left + plot_width, axis_y);
  for (int tick = 0; tick <= 10; ++tick) {
    const double seconds = T * tick / 10, x = x_of(seconds);
    fmt::format_to(it,
                   "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"black\"/>\n"
                   "<text x=\"{0:.1f}\" y=\"{3:.1f}\" font-size=\"10\" text-anchor=\"middle\">{4:.3g} s</text>\n",
                   x, axis_y, axis_y + 4, axis_y + 16, seconds);
  }
  if (layout.row_per_chunk) draw_legend(out, pipeline, left, axis_y + 26);
  out += "</svg>\n";
  return out;
}

}  // namespace twin::report
