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
  const bool v = kind == ScheduleKind::ZeroBubbleV || kind == ScheduleKind::DualPipeV || kind == ScheduleKind::DualPipe;
  if (v && chunks != 2) {
    throw std::invalid_argument("build_schedule: a V or two directions have two chunks per stage, got " +
                                std::to_string(chunks));
  }
  if (kind == ScheduleKind::DualPipeV && micro_batches < 2 * stages) {
    throw std::invalid_argument("build_schedule: DualPipeV needs micro_batches >= 2 * stages, got " +
                                std::to_string(micro_batches));
  }
  if (kind == ScheduleKind::DualPipe && (stages % 2 != 0 || micro_batches % 2 != 0 || micro_batches < 2 * stages)) {
    throw std::invalid_argument("build_schedule: DualPipe needs an even number of stages and an even "
                                "micro_batches >= 2 * stages, got " +
                                std::to_string(stages) + " stages and " + std::to_string(micro_batches) +
                                " micro-batches");
  }
  if (kind != ScheduleKind::Interleaved && !v && chunks != 1) {
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

// ZB-V (schedule.hpp) on one stage, in phases; micro-batches past the last are dropped from every phase alike.
StageSchedule zero_bubble_v(int stage, int stages, int micro_batches) {
  const int padded = std::max(2 * stages - 1, micro_batches);
  StageSchedule steps;
  int forwards[2] = {0, 0}, backwards[2] = {0, 0}, weights[2] = {0, 0};
  const auto put = [&](Pass pass, int chunk) {
    int& count = (pass == Pass::Forward ? forwards : pass == Pass::Backward ? backwards : weights)[chunk];
    if (count < micro_batches) steps.push_back({count, chunk, pass});
    ++count;
  };
  const auto backward_and_weight = [&](int chunk) {
    put(Pass::Backward, chunk);
    put(Pass::WeightGrad, chunk);
  };
  for (int i = 0; i < 2 * (stages - stage) - 1; ++i) put(Pass::Forward, 0);
  for (int i = 0; i < stage; ++i) {
    put(Pass::Forward, 1);
    put(Pass::Forward, 0);
  }
  for (int i = 0; i < stages - stage; ++i) {
    put(Pass::Forward, 1);
    backward_and_weight(1);
  }
  while (forwards[1] < forwards[0] || forwards[0] < padded) {
    if (forwards[0] < padded) put(Pass::Forward, 0);
    backward_and_weight(0);
    put(Pass::Forward, 1);
    backward_and_weight(1);
  }
  for (int i = 0; i < stage; ++i) {
    put(Pass::Backward, 0);
    put(Pass::Backward, 1);
  }
  for (int i = 0; i < stages - stage; ++i) {
    put(Pass::Backward, 0);
    put(Pass::WeightGrad, 0);
  }
  while (weights[1] < backwards[1]) put(Pass::WeightGrad, 1);
  while (weights[0] < backwards[0]) put(Pass::WeightGrad, 0);
  return steps;
}

// DualPipeV (schedule.hpp) on one stage, step by step as dualpipev.py runs them.
class DualPipeV {
 public:
  DualPipeV(int stage, int stages, int micro_batches) : s_(stage), p_(stages), m_(micro_batches) {}
  StageSchedule build() {
    repeat(2 * (p_ - s_ - 1), [&] { forward(0); });                         // 1: nF0
    repeat(s_ + 1, [&] { forward(0), forward(1); });                        // 2: nF0F1
    repeat(p_ - s_ - 1, [&] { backward(1, true), weight(), forward(1); });  // 3: nB1W1F1
    for (int i = 0; i < m_ - 2 * p_ + s_ + 1; ++i) {                        // 4: nF0B1F1B0
      forward(0, i > 0 || s_ < p_ - 1), backward(1), forward(1, true), backward(0);
    }
    repeat(p_ - s_ - 1, [&] { backward(1), forward(1, true), backward(0); });  // 5: nB1F1B0
    for (int i = 0; i < s_ + 1; ++i) {                                         // 6: nB1B0, zero bubble
      const bool half = i >= (s_ + 1) / 2;                                     //    from the middle on
      backward(1, half && (s_ % 2 == 1 || i > (s_ + 1) / 2));
      backward(0, half);
    }
    repeat(p_ - s_ - 1, [&] { weight(), backward(0, true); });  // 7: nWB0
    repeat(s_ + 1, [&] { weight(); });                          // 8: nW
    return std::move(steps_);
  }

 private:
  template <class Step>
  static void repeat(int times, Step step) {
    for (int i = 0; i < times; ++i) step();
  }
  void forward(int chunk, bool overlapped = false) {
    steps_.push_back({forwards_[chunk]++, chunk, Pass::Forward, overlapped});
  }
  // A whole backward is its B and W at once; a zero-bubble one queues its W.
  void backward(int chunk, bool zero_bubble = false) {
    const PipelineStep weight_step{backwards_[chunk], chunk, Pass::WeightGrad};
    steps_.push_back({backwards_[chunk]++, chunk, Pass::Backward});
    if (zero_bubble) {
      queued_.push_back(weight_step);
    } else {
      steps_.push_back(weight_step);
    }
  }
  void weight() {
    steps_.push_back(queued_.front());
    queued_.erase(queued_.begin());
  }
  int s_, p_, m_;
  int forwards_[2] = {0, 0}, backwards_[2] = {0, 0};
  std::vector<PipelineStep> queued_;
  StageSchedule steps_;
};

// DualPipe (schedule.hpp) on one stage: dualpipe.py's steps are dualpipev.py's on half the stages (its half_rank,
// min(s, p - 1 - s), of p / 2) and half the micro-batches per direction, phase 0 being the direction that enters at
// the stage's own end: the down pipeline (chunk 0) on the first half of the stages, the up one (chunk 1) on the
// second. The up half's micro-batches are numbered m / 2 .. m - 1.
StageSchedule dual_pipe(int stage, int stages, int micro_batches) {
  const int half_rank = std::min(stage, stages - 1 - stage);
  StageSchedule steps = DualPipeV(half_rank, stages / 2, micro_batches / 2).build();
  const bool second_half = stage >= stages / 2;
  for (PipelineStep& step : steps) {
    step.chunk = second_half ? 1 - step.chunk : step.chunk;
    if (step.chunk == 1) step.micro_batch += micro_batches / 2;
  }
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
    case ScheduleKind::ZeroBubbleV:
    case ScheduleKind::DualPipeV:
    case ScheduleKind::DualPipe: {  // the forwards before its first B
      const StageSchedule steps = kind == ScheduleKind::DualPipeV ? DualPipeV(stage, stages, micro_batches).build()
                                  : kind == ScheduleKind::DualPipe ? dual_pipe(stage, stages, micro_batches)
                                                                   : zero_bubble_v(stage, stages, micro_batches);
      const auto first_backward =
          std::find_if(steps.begin(), steps.end(), [](const PipelineStep& step) { return step.pass != Pass::Forward; });
      return static_cast<int>(first_backward - steps.begin());
    }
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
    if (kind == ScheduleKind::ZeroBubbleV) {
      steps = zero_bubble_v(stage, stages, micro_batches);
      continue;
    }
    if (kind == ScheduleKind::DualPipeV) {
      steps = DualPipeV(stage, stages, micro_batches).build();
      continue;
    }
    if (kind == ScheduleKind::DualPipe) {
      steps = dual_pipe(stage, stages, micro_batches);
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
  return max_in_flight_weighted(schedule, chunk_weight, {});  // no step merged
}

std::int64_t max_in_flight_weighted(const StageSchedule& schedule, const std::vector<std::int64_t>& chunk_weight,
                                    const std::vector<bool>& merged) {
  std::int64_t in_flight = 0, peak = 0;
  for (std::size_t i = 0; i < schedule.size(); ++i) {
    const PipelineStep& step = schedule[i];
    if (step.pass == Pass::WeightGrad) continue;
    const std::int64_t weight = chunk_weight.at(static_cast<std::size_t>(step.chunk));
    if (i < merged.size() && merged[i] && i + 1 < schedule.size()) {
      const std::int64_t frees = chunk_weight.at(static_cast<std::size_t>(schedule[i + 1].chunk));
      const std::int64_t both = weight > 0 && frees > 0 ? 1 : 0;
      peak = std::max(peak, in_flight + std::max<std::int64_t>(weight - frees, 0) + both);
      in_flight += weight - frees;
      ++i;
      continue;
    }
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

double max_deferred_weight_grads_weighted(const StageSchedule& schedule, const std::vector<double>& chunk_weight) {
  double deferred = 0, peak = 0;
  for (const auto& step : schedule) {
    const double weight = chunk_weight.at(static_cast<std::size_t>(step.chunk));
    if (step.pass == Pass::Backward) deferred += weight;
    if (step.pass == Pass::WeightGrad) deferred -= weight;
    peak = std::max(peak, deferred);
  }
  return max_deferred_weight_grads(schedule) > 0 ? peak : 0;
}

double ideal_bubble_fraction(const ParallelSpec& parallel) {
  const double m = static_cast<double>(parallel.micro_batches());
  const double idle = static_cast<double>(parallel.pp - 1);
  if (parallel.schedule == ScheduleKind::ZeroBubbleH1) return idle / (3 * m + idle);
  if (parallel.schedule == ScheduleKind::DualPipe) {
    const double half_idle = static_cast<double>(parallel.pp / 2 - 1);  // a block's forwards, each direction's start
    return half_idle / (3 * m + half_idle);
  }
  if (parallel.schedule == ScheduleKind::ZeroBubbleV || parallel.schedule == ScheduleKind::DualPipeV) {
    return idle / (6 * m + idle);
  }
  return idle / (static_cast<double>(parallel.virtual_stages) * m + idle);
}

}  // namespace twin::model
