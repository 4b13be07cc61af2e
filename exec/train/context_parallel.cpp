#include "exec/train/context_parallel.hpp"

#include <cstddef>

#include <fmt/format.h>

#include "exec/core/check.hpp"
#include "exec/core/errors.hpp"
#include "model/ops/context_parallel.hpp"

namespace twin::exec {

MicroBatch context_parallel_share(const MicroBatch& whole, int batch, int seq, int cp, int cp_rank) {
  const auto sz = [](int value) { return static_cast<std::size_t>(value); };
  TWIN_EXEC_CHECK(cp >= 1 && seq % (2 * cp) == 0 && whole.tokens.size() == sz(batch) * sz(seq) &&
                      whole.targets.size() == whole.tokens.size(),
                  "context_parallel_share: {} tokens for {} sequences of {} over {} ranks", whole.tokens.size(), batch,
                  seq, cp);
  const int chunk = seq / (2 * cp);
  MicroBatch mine;
  mine.tokens.reserve(whole.tokens.size() / sz(cp));
  mine.targets.reserve(whole.tokens.size() / sz(cp));
  for (int b = 0; b < batch; ++b) {
    for (int part = 0; part < 2; ++part) {
      const auto first = static_cast<std::ptrdiff_t>(b * seq + model::cp_sequence_chunk(cp_rank, part, cp) * chunk);
      mine.tokens.insert(mine.tokens.end(), whole.tokens.begin() + first, whole.tokens.begin() + first + chunk);
      mine.targets.insert(mine.targets.end(), whole.targets.begin() + first, whole.targets.begin() + first + chunk);
    }
  }
  return mine;
}

void refuse_unsupported_context_parallelism(const model::Scenario& scenario, const Backend& backend) {
  const auto cp = scenario.parallel.cp;
  if (cp <= 1) return;
  if (backend.context() == nullptr) {  // a backend without ContextKernels (exec/core/context_kernels.hpp)
    throw RunError(
        fmt::format("{}: parallel.cp = {}: the {} backend does not run context parallelism yet (run with "
                    "--backend cpu or cuda, or parallel.cp = 1)",
                    scenario.source, cp, backend.name()));
  }
}

}  // namespace twin::exec
