// A pipeline diagram of one iteration, like the 1F1B figures of the Megatron papers: one row per stage (its
// representative rank), time flowing right, one box per (micro-batch, chunk, pass) numbered by micro-batch, forward
// and backward in two colours (a lighter shade for odd chunks of an interleaved schedule), gradient synchronisation
// and optimizer in grey; white space is the bubble.
#pragma once

#include <string>

#include "model/program/program.hpp"
#include "report/timeline.hpp"

namespace twin::report {

std::string pipeline_svg(const model::Program& program, const Timeline& timeline);

}  // namespace twin::report
