#include "exec/train/check_supported.hpp"

#include <fmt/format.h>

#include "exec/core/errors.hpp"
#include "exec/interpreter/interpreter.hpp"
#include "exec/train/context_parallel.hpp"
#include "model/plan/schedule.hpp"

namespace twin::exec {

void check_supported(const model::Program& program, const Backend& backend) {
  const model::Scenario& s = program.scenario;
  if (s.model.is_moe() && backend.moe() == nullptr) {
    throw RunError(fmt::format(
        "{}: model.experts = {}: the {} backend does not run Mixture-of-Experts layers (the cpu and cuda backends do)",
        s.source, s.model.experts, backend.name()));
  }
  if (s.model.fp8 != model::Fp8Format::None && backend.fp8() == nullptr) {
    throw RunError(fmt::format("{}: model.fp8 = {}: the {} backend runs no FP8 GEMMs (the cpu backend emulates them)",
                               s.source, model::to_string(s.model.fp8), backend.name()));
  }
  if (s.model.fp8 != model::Fp8Format::None && model::splits_backward(s.parallel.schedule) &&
      backend.fp8() != nullptr && !backend.fp8()->splits_fp8_backward()) {
    throw RunError(
        fmt::format("{}: parallel.schedule = \"{}\" with model.fp8 = {}: the {} backend's FP8 GEMMs compute "
                    "the weight gradient with the input gradient, not in a deferred W (the cpu backend "
                    "splits them)",
                    s.source, model::to_string(s.parallel.schedule), model::to_string(s.model.fp8), backend.name()));
  }
  refuse_unsupported_context_parallelism(s, backend);
  refuse_unsupported_moe(s, backend.name());
}

}  // namespace twin::exec
