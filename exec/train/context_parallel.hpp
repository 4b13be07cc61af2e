// Context parallelism's data: which tokens of a micro-batch a CP rank trains on (model/ops/context_parallel.hpp).
#pragma once

#include <string>

#include "exec/core/backend.hpp"
#include "exec/core/micro_batch.hpp"
#include "model/scenario/scenario.hpp"

namespace twin::exec {

// The tokens and targets CP rank `cp_rank` of `cp` holds of a micro-batch of `batch` whole sequences of `seq` tokens:
// its two chunks of each sequence (model::cp_sequence_chunk), in order: (batch, seq / cp) each.
MicroBatch context_parallel_share(const MicroBatch& whole, int batch, int seq, int cp, int cp_rank);

// What the executor does not run with parallel.cp > 1 yet, as one RunError naming the key: a backend without
// ContextKernels (Backend::context()). Nothing when cp == 1. (FP8 and checkpoints run under CP: the amaxes of delayed
// scaling reduce over DP x CP too, and CP ranks save and restore their shards as DP replicas do.)
void refuse_unsupported_context_parallelism(const model::Scenario& scenario, const Backend& backend);

}  // namespace twin::exec
