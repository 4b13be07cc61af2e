// Chrome trace JSON of a Timeline (opens in Perfetto or chrome://tracing): one process per rank, one track (thread)
// per stream: 0 compute, 1 data-parallel, 2 pipeline; each op named by model::op_label. Times in microseconds.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "model/program/program.hpp"
#include "report/timeline.hpp"

namespace twin::report {

// The trace of the recorded ranks listed in `ranks` (all recorded ranks when empty).
std::string chrome_trace(const model::Program& program, const Timeline& timeline, const std::vector<int>& ranks = {});

// "0,5,10-15" -> {0, 5, 10, ..., 15}; throws std::invalid_argument when malformed or out of [0, world_size).
std::vector<int> parse_rank_list(std::string_view text, int world_size);

}  // namespace twin::report
