// Context parallelism's data: which tokens of a micro-batch a CP rank trains on (model/context_parallel.hpp).
#pragma once

#include <string>

#include "exec/backend.hpp"
#include "exec/interpreter.hpp"
#include "model/scenario.hpp"

namespace twin::exec {

// The tokens and targets CP rank `cp_rank` of `cp` holds of a micro-batch of `batch` whole sequences of `seq` tokens:
// its two chunks of each sequence (model::cp_sequence_chunk), in order: (batch, seq / cp) each.
MicroBatch context_parallel_share(const MicroBatch& whole, int batch, int seq, int cp, int cp_rank);

// What the executor does not run with parallel.cp > 1 yet, as one RunError naming the key: a backend other than the
// cpu and cuda ones, and checkpoints (`checkpoint_dir` not empty). Nothing when cp == 1.
void refuse_unsupported_context_parallelism(const model::Scenario& scenario, const Backend& backend,
                                            const std::string& checkpoint_dir);

}  // namespace twin::exec
