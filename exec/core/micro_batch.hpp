// One micro-batch of a DP rank's data: what the data loader yields, context parallelism splits and the interpreter
// trains on.
#pragma once

#include <vector>

namespace twin::exec {

// Token ids and next-token targets, (batch * seq) each.
struct MicroBatch {
  std::vector<int> tokens, targets;
};

}  // namespace twin::exec
