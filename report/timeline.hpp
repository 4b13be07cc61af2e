// Timeline: what an engine observed (or predicted) while running a Program, rank by rank and op by op. Both the
// simulator (sim/) and the executor (exec/) produce one; summaries, traces and pipeline diagrams are computed from it
// by the writers of this library, so the two engines report in the same format. No SimGrid in here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace twin::report {

// One op of a rank's list, as it ran. Times are seconds since the start of the iteration.
//   start   when the rank issued it: its dependencies and stream predecessor were done (a Recv: when it was posted)
//   active  when its work began: for a compute op, once the host had issued it (= start unless the host was
//           behind, cluster.host_us_per_kernel); = start for Sends; for a collective, when the last member arrived
//           (before that the rank only waits); for a Recv, when its bytes began to arrive (or start, if later).
//           An engine that cannot tell sets active = start.
//   end     when it completed (a Send or Recv: when the bytes had arrived)
struct OpSpan {
  std::int32_t op = 0;  // index into Program::stage_ops[stage]
  double start_s = 0;
  double active_s = 0;
  double end_s = 0;
};

struct RankTimeline {
  int rank = 0;
  int stage = 0;
  std::vector<OpSpan> spans;  // one per op of the stage's list, in list order
};

struct Timeline {
  std::string engine;               // "sim" or "exec"
  double iteration_time_s = 0;      // latest end over every rank of the iteration, recorded or not
  std::vector<RankTimeline> ranks;  // the recorded ranks, by increasing rank

  const RankTimeline* find(int rank) const {
    for (const auto& timeline : ranks) {
      if (timeline.rank == rank) return &timeline;
    }
    return nullptr;
  }
};

}  // namespace twin::report
