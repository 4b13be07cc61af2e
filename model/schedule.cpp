// Pipeline schedules, following Megatron-LM's schedules.py (forward_backward_pipelining_without_interleaving and
// forward_backward_pipelining_with_interleaving).
#include "model/schedule.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace twin::model {
namespace {

void check_arguments(ScheduleKind kind, int stages, int micro_batches, int chunks) {
  if (stages < 1 || micro_batches < 1 || chunks < 1) {
    throw std::invalid_argument("build_schedule: stages, micro_batches and chunks must be >= 1");
  }
  if (kind != ScheduleKind::Interleaved && chunks != 1) {
    throw std::invalid_argument("build_schedule: only the interleaved schedule has more than one chunk per stage");
  }
  if (kind == ScheduleKind::Interleaved && micro_batches % stages != 0) {
    throw std::invalid_argument("build_schedule: the interleaved schedule needs micro_batches % stages == 0, got " +
                                std::to_string(micro_batches) + " % " + std::to_string(stages));
  }
}

// Megatron's get_model_chunk_id / micro-batch of the k-th forward (or backward) step of an interleaved stage:
// groups of `stages` micro-batches run through chunk 0, then chunk 1, ... (backward: chunk v-1 first).
PipelineStep interleaved_step(int k, int stages, int chunks, Pass pass) {
  const int group = stages * chunks;
  int chunk = (k % group) / stages;
  if (pass == Pass::Backward) chunk = chunks - 1 - chunk;
  const int micro_batch = (k / group) * stages + k % stages;
  return PipelineStep{micro_batch, chunk, pass};
}

}  // namespace

int warmup_steps(ScheduleKind kind, int stage, int stages, int micro_batches, int chunks) {
  switch (kind) {
    case ScheduleKind::GPipe:
      return micro_batches;
    case ScheduleKind::OneFOneB:
      return std::min(stages - stage - 1, micro_batches);
    case ScheduleKind::Interleaved: {
      const int total = micro_batches * chunks;
      if (micro_batches == stages) return total;  // Megatron: all warmup when m == p
      return std::min((stages - stage - 1) * 2 + (chunks - 1) * stages, total);
    }
  }
  return 0;
}

std::vector<StageSchedule> build_schedule(ScheduleKind kind, int stages, int micro_batches, int chunks) {
  check_arguments(kind, stages, micro_batches, chunks);
  std::vector<StageSchedule> schedule(stages);
  for (int stage = 0; stage < stages; ++stage) {
    StageSchedule& steps = schedule[stage];
    if (kind == ScheduleKind::GPipe) {
      for (int mb = 0; mb < micro_batches; ++mb) steps.push_back({mb, 0, Pass::Forward});
      for (int mb = 0; mb < micro_batches; ++mb) steps.push_back({mb, 0, Pass::Backward});
      continue;
    }
    const int total = micro_batches * chunks;
    const int warmup = warmup_steps(kind, stage, stages, micro_batches, chunks);
    const int steady = total - warmup;
    auto forward = [&](int k) {
      return kind == ScheduleKind::Interleaved ? interleaved_step(k, stages, chunks, Pass::Forward)
                                               : PipelineStep{k, 0, Pass::Forward};
    };
    auto backward = [&](int k) {
      return kind == ScheduleKind::Interleaved ? interleaved_step(k, stages, chunks, Pass::Backward)
                                               : PipelineStep{k, 0, Pass::Backward};
    };
    for (int k = 0; k < warmup; ++k) steps.push_back(forward(k));
    for (int k = 0; k < steady; ++k) {
      steps.push_back(forward(warmup + k));
      steps.push_back(backward(k));
    }
    for (int k = steady; k < total; ++k) steps.push_back(backward(k));
  }
  return schedule;
}

int max_in_flight(const StageSchedule& schedule) {
  int in_flight = 0;
  int peak = 0;
  for (const auto& step : schedule) {
    in_flight += step.pass == Pass::Forward ? 1 : -1;
    peak = std::max(peak, in_flight);
  }
  return peak;
}

}  // namespace twin::model
