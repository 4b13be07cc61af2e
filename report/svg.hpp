// A pipeline diagram of one iteration, like the 1F1B figures of the Megatron papers: one row per stage (its
// representative rank), time flowing right, one box per (micro-batch, chunk, pass) numbered by micro-batch, forward
// and backward in two colours (a lighter shade for odd chunks of an interleaved schedule), gradient synchronisation
// and optimizer in grey; white space is the bubble.
#pragma once

#include <string>

#include "model/program/program.hpp"
#include "report/pipeline.hpp"
#include "report/timeline.hpp"

namespace twin::report {

// `twin sim --svg`: a row per stage, 1400 px of time.
std::string pipeline_svg(const model::Program& program, const Timeline& timeline);

// How a diagram is laid out. The default is `twin sim --svg`'s; `twin report` draws one row per stage and chunk, as
// wide as it takes for a typical box to hold its micro-batch number, with the chunks named in the legend.
struct PipelineLayout {
  bool row_per_chunk = false;
  bool fit_boxes = false;    // widen the time axis past 1400 px so that the median box is at least 14 px wide
  bool escape_text = false;  // XML-escape the model's name (an SVG inside HTML)
};
std::string pipeline_svg(const Pipeline& pipeline, const PipelineLayout& layout);

}  // namespace twin::report
