// Pipeline schedules, following Megatron-LM's schedules.py (forward_backward_pipelining_without_interleaving and
// forward_backward_pipelining_with_interleaving).
#include "model/plan/schedule.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace twin::model {
namespace {

void check_arguments(ScheduleKind kind, int stages, int micro_batches, int chunks, int group) {
  if (stages < 1 || micro_batches < 1 || chunks < 1) {
    throw std::invalid_argument("build_schedule: stages, micro_batches and chunks must be >= 1");
  }
  if (kind != ScheduleKind::Interleaved && chunks != 1) {
    throw std::invalid_argument("build_schedule: only the interleaved schedule has more than one chunk per stage");
  }
  if (group != 0 && kind != ScheduleKind::Interleaved) {
    throw std::invalid_argument("build_schedule: micro-batch groups belong to the interleaved schedule");
  }
  if (group < 0 || group > micro_batches) {
    throw std::invalid_argument("build_schedule: the micro-batch group must be 1 to micro_batches (" +
                                std::to_string(micro_batches) + "), got " + std::to_string(group));
  }
  if (kind == ScheduleKind::Interleaved && group == 0 && micro_batches % stages != 0) {
    throw std::invalid_argument("build_schedule: the interleaved schedule needs micro_batches % stages == 0, got " +
                                std::to_string(micro_batches) + " % " + std::to_string(stages));
  }
}

// Megatron-Core's schedule table (get_schedule_table): the (micro-batch, chunk) of each forward step, in order. Groups
// of `group` micro-batches run through chunk 0, then chunk 1, ...; the last group holds what is left. The k-th
// backward step takes the k-th entry with its chunk reversed (get_model_chunk_id with forward = False).
std::vector<PipelineStep> interleaved_table(int micro_batches, int chunks, int group) {
  std::vector<PipelineStep> table;
  for (int first = 0; first < micro_batches; first += group) {
    const int end = first + group >= micro_batches ? micro_batches : first + group;
    for (int chunk = 0; chunk < chunks; ++chunk) {
      for (int mb = first; mb < end; ++mb) table.push_back({mb, chunk, Pass::Forward});
    }
  }
  return table;
}

// ZB-H1 (schedule.hpp): 1F1B's order with each B's W deferred s pairs on stage s, the deferred ones last.
StageSchedule zero_bubble_h1(int stage, int stages, int micro_batches) {
  StageSchedule steps;
  const int warmup = std::min(stages - stage - 1, micro_batches);
  int forwards = 0, backwards = 0, weights = 0;
  const auto weight = [&] { steps.push_back({weights++, 0, Pass::WeightGrad}); };
  for (; forwards < warmup; ++forwards) steps.push_back({forwards, 0, Pass::Forward});
  for (; forwards < micro_batches; ++forwards) {
    steps.push_back({forwards, 0, Pass::Forward});
    steps.push_back({backwards++, 0, Pass::Backward});
    if (backwards > stage) weight();
  }
  while (backwards < micro_batches) {
    steps.push_back({backwards++, 0, Pass::Backward});
    weight();
  }
  while (weights < micro_batches) weight();
  return steps;
}

}  // namespace

bool group_without_dependency_bubbles(int stages, int micro_batches, int group) {
  const int last = micro_batches % std::max(1, group);
  return group >= stages && group <= micro_batches && (last == 0 || last >= stages);
}

int warmup_steps(ScheduleKind kind, int stage, int stages, int micro_batches, int chunks, int group, int extra_warmup) {
  switch (kind) {
    case ScheduleKind::GPipe:
      return micro_batches;
    case ScheduleKind::OneFOneB:
    case ScheduleKind::ZeroBubbleH1:
      return std::min(stages - stage - 1 + extra_warmup, micro_batches);
    case ScheduleKind::Interleaved: {
      const int total = micro_batches * chunks;
      if (group > 0) {
        // Megatron-Core's warmup where its rule holds; otherwise every forward first (a group smaller than the
        // stages would leave a stage waiting on a backward that waits on it: all warmup always completes).
        if (!group_without_dependency_bubbles(stages, micro_batches, group)) return total;
        return std::min((stages - stage - 1) * 2 + (chunks - 1) * group + extra_warmup, total);
      }
      if (micro_batches == stages) return total;  // Megatron-LM: all warmup when m == p
      return std::min((stages - stage - 1) * 2 + (chunks - 1) * stages + extra_warmup, total);
    }
  }
  return 0;
}

std::vector<StageSchedule> build_schedule(ScheduleKind kind, int stages, int micro_batches, int chunks, int group,
                                          int extra_warmup) {
  check_arguments(kind, stages, micro_batches, chunks, group);
  const std::vector<PipelineStep> table = kind == ScheduleKind::Interleaved
                                              ? interleaved_table(micro_batches, chunks, group > 0 ? group : stages)
                                              : std::vector<PipelineStep>{};
  std::vector<StageSchedule> schedule(stages);
  for (int stage = 0; stage < stages; ++stage) {
    StageSchedule& steps = schedule[stage];
    if (kind == ScheduleKind::ZeroBubbleH1) {
      steps = zero_bubble_h1(stage, stages, micro_batches);
      continue;
    }
    if (kind == ScheduleKind::GPipe) {
      for (int mb = 0; mb < micro_batches; ++mb) steps.push_back({mb, 0, Pass::Forward});
      for (int mb = 0; mb < micro_batches; ++mb) steps.push_back({mb, 0, Pass::Backward});
      continue;
    }
    const int total = micro_batches * chunks;
    const int warmup = warmup_steps(kind, stage, stages, micro_batches, chunks, group, extra_warmup);
    const int steady = total - warmup;
    auto forward = [&](int k) {
      return kind == ScheduleKind::Interleaved ? table[k] : PipelineStep{k, 0, Pass::Forward};
    };
    auto backward = [&](int k) {
      if (kind != ScheduleKind::Interleaved) return PipelineStep{k, 0, Pass::Backward};
      return PipelineStep{table[k].micro_batch, chunks - 1 - table[k].chunk, Pass::Backward};
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

std::vector<StageSchedule> build_schedule(const ParallelSpec& p, int extra_warmup) {
  return build_schedule(p.schedule, static_cast<int>(p.pp), static_cast<int>(p.micro_batches()),
                        static_cast<int>(p.virtual_stages), static_cast<int>(p.microbatch_group), extra_warmup);
}

std::int64_t max_in_flight_weighted(const StageSchedule& schedule, const std::vector<std::int64_t>& chunk_weight) {
  std::int64_t in_flight = 0, peak = 0;
  for (const auto& step : schedule) {
    if (step.pass == Pass::WeightGrad) continue;
    const std::int64_t weight = chunk_weight.at(static_cast<std::size_t>(step.chunk));
    in_flight += step.pass == Pass::Forward ? weight : -weight;
    peak = std::max(peak, in_flight);
  }
  return peak;
}

int max_in_flight(const StageSchedule& schedule) {
  int in_flight = 0;
  int peak = 0;
  for (const auto& step : schedule) {
    if (step.pass == Pass::WeightGrad) continue;
    in_flight += step.pass == Pass::Forward ? 1 : -1;
    peak = std::max(peak, in_flight);
  }
  return peak;
}

int max_deferred_weight_grads(const StageSchedule& schedule) {
  const bool split = std::any_of(schedule.begin(), schedule.end(),
                                 [](const PipelineStep& step) { return step.pass == Pass::WeightGrad; });
  if (!split) return 0;  // each backward computes its own weight gradients
  int deferred = 0, peak = 0;
  for (const auto& step : schedule) {
    if (step.pass == Pass::Backward) ++deferred;
    if (step.pass == Pass::WeightGrad) --deferred;
    peak = std::max(peak, deferred);
  }
  return peak;
}

double ideal_bubble_fraction(const ParallelSpec& parallel) {
  const double m = static_cast<double>(parallel.micro_batches());
  const double idle = static_cast<double>(parallel.pp - 1);
  if (parallel.schedule == ScheduleKind::ZeroBubbleH1) return idle / (3 * m + idle);
  return idle / (static_cast<double>(parallel.virtual_stages) * m + idle);
}

}  // namespace twin::model
