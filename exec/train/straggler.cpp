#include "exec/train/straggler.hpp"

#include <time.h>

#include <algorithm>

namespace twin::exec {

namespace {

double thread_cpu_s() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

// The median of `values` (the mean of the middle two for an even count); 0 for none.
double median(std::vector<double> values) {
  if (values.empty()) return 0;
  const std::size_t middle = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(middle), values.end());
  const double upper = values[middle];
  if (values.size() % 2 == 1) return upper;
  const double lower = *std::max_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(middle));
  return (lower + upper) / 2;
}

}  // namespace

Straggler find_straggler(const std::vector<double>& compute_s, const std::vector<double>& wait_s,
                         const std::vector<double>& work_flops) {
  Straggler straggler;
  const std::size_t ranks = compute_s.size();
  if (ranks < 2) return straggler;
  std::vector<double> seconds_per_work(ranks);
  for (std::size_t r = 0; r < ranks; ++r) {
    seconds_per_work[r] = work_flops[r] > 0 ? compute_s[r] / work_flops[r] : 1.0;
  }
  const auto slowest = static_cast<std::size_t>(std::max_element(seconds_per_work.begin(), seconds_per_work.end()) -
                                                seconds_per_work.begin());
  std::vector<double> peers_speed, peers_wait;
  for (std::size_t r = 0; r < ranks; ++r) {
    if (r == slowest) continue;
    peers_speed.push_back(seconds_per_work[r]);
    peers_wait.push_back(wait_s[r]);
  }
  const double typical = median(peers_speed);
  straggler.rank = static_cast<int>(slowest);
  straggler.compute_s = compute_s[slowest];
  const double expected_s = work_flops[slowest] > 0 ? typical * work_flops[slowest] : typical;
  straggler.lag_s = compute_s[slowest] - expected_s;
  straggler.lag_fraction = typical > 0 ? seconds_per_work[slowest] / typical - 1 : 0;
  straggler.peers_wait_s = median(peers_wait);
  return straggler;
}

std::vector<double> compute_flops_per_rank(const model::Program& program) {
  std::vector<double> per_stage(static_cast<std::size_t>(program.stages()), 0.0);
  for (int stage = 0; stage < program.stages(); ++stage) {
    for (const model::Op& op : program.stage_ops[static_cast<std::size_t>(stage)]) {
      if (op.kind == model::OpKind::Compute) per_stage[static_cast<std::size_t>(stage)] += op.flops;
    }
  }
  std::vector<double> per_rank;
  for (int rank = 0; rank < program.layout.world_size(); ++rank) {
    per_rank.push_back(per_stage[static_cast<std::size_t>(program.layout.coord_of(rank).pp)]);
  }
  return per_rank;
}

void StepClock::op_starting(const model::Op& op) {
  if (op.kind == model::OpKind::Compute) op_start_s_ = thread_cpu_s();
}

void StepClock::op_done(const model::Op& op) {
  if (op.kind != model::OpKind::Compute) return;
  const double seconds = thread_cpu_s() - op_start_s_;
  compute_s_ += seconds;
  if (slowed_) compute_s_ += slowdown_.after_compute(seconds);
}

double StepClock::take_compute_s() {
  const double seconds = compute_s_;
  compute_s_ = 0;
  return seconds;
}

}  // namespace twin::exec
