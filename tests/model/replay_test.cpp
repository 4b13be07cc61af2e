// An abstract in-order replay of the Program: every rank walks its list in order; a compute op costs a fixed time by
// phase (layer-granularity TransformerLayer ops only; everything else is free), communication is instantaneous.
// It proves the Program free of deadlock for a sequential interpreter with buffered sends and blocking receives and
// collectives (what the CPU executor does), and pins the bubble of each schedule to its textbook value.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <tuple>

#include "model/program.hpp"
#include "test_scenarios.hpp"

namespace twin::model {
namespace {

struct ReplayResult {
  bool deadlocked = false;
  double iteration_time = 0;
  std::vector<double> busy;  // per stage, compute time
};

// Only stages matter when tp = dp = 1: rank = stage.
ReplayResult replay(const Program& program, double forward_cost, double backward_cost) {
  const int stages = program.stages();
  std::vector<std::size_t> next(stages, 0);
  std::vector<double> clock(stages, 0.0);  // when the compute stream is next free
  ReplayResult result;
  result.busy.assign(stages, 0.0);
  using Tag = std::tuple<int, int, int, int, int>;  // from, to, micro-batch, sender virtual stage, phase
  std::map<Tag, double> sent;                       // -> time the bytes are available
  auto cost = [&](const Op& op) {
    if (op.kind != OpKind::Compute || op.what != ComputeKind::TransformerLayer) return 0.0;
    return op.phase == Phase::Forward ? forward_cost : op.phase == Phase::Backward ? backward_cost : 0.0;
  };
  bool progress = true;
  while (progress) {
    progress = false;
    for (int stage = 0; stage < stages; ++stage) {
      const auto& ops = program.stage_ops[stage];
      while (next[stage] < ops.size()) {
        const Op& op = ops[next[stage]];
        if (op.kind == OpKind::Recv) {
          auto it = sent.find({op.peer_stage, stage, op.micro_batch, op.tag_virtual_stage, static_cast<int>(op.phase)});
          if (it == sent.end()) break;  // blocked until the sender gets there
          clock[stage] = std::max(clock[stage], it->second);
        } else if (op.kind == OpKind::Send) {
          sent[{stage, op.peer_stage, op.micro_batch, op.tag_virtual_stage, static_cast<int>(op.phase)}] = clock[stage];
        } else if (op.kind == OpKind::Collective && op.group != Group::Tensor && op.group != Group::Data) {
          // Embedding (first and last stage) and World (all stages): every member must be at this same collective.
          const auto members = program.layout.group_members(op.group, program.layout.rank_of({0, stage, 0}));
          bool all_here = true;
          double start = clock[stage];
          for (int member : members) {
            const int other = program.layout.coord_of(member).pp;
            const auto& other_ops = program.stage_ops[other];
            const bool here = next[other] < other_ops.size() && other_ops[next[other]].kind == OpKind::Collective &&
                              other_ops[next[other]].group == op.group;
            all_here = all_here && here;
            start = std::max(start, clock[other]);
          }
          if (!all_here) break;
          for (int member : members) {
            const int other = program.layout.coord_of(member).pp;
            clock[other] = start;
            if (other != stage) ++next[other];
          }
        } else {
          const double duration = cost(op);
          clock[stage] += duration;
          result.busy[stage] += duration;
        }
        ++next[stage];
        progress = true;
      }
    }
  }
  for (int stage = 0; stage < stages; ++stage) {
    if (next[stage] != program.stage_ops[stage].size()) result.deadlocked = true;
    result.iteration_time = std::max(result.iteration_time, clock[stage]);
  }
  return result;
}

Scenario pipeline(ScheduleKind kind, int p, int m, int v) {
  Scenario s = testing::make_scenario(p * v * 2, 64, 4, 16, 128, 1, p, 1, 1, m);
  s.parallel.schedule = kind;
  s.parallel.virtual_stages = v;
  s.cluster = ClusterSpec{1, NodeKind::CpuHost, p};
  return s;
}

TEST(Replay, EveryScheduleFinishesWithTheTextbookBubble) {
  int cases = 0;
  for (auto kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved}) {
    for (int p : {1, 2, 4, 8}) {
      for (int m = 1; m <= 16; ++m) {
        for (int v : {1, 2, 3}) {
          const Scenario s = pipeline(kind, p, m, v);
          if (!validation_problems(s).empty()) continue;
          const Program program = build_program(s, Granularity::Layer);
          for (auto [forward, backward] : {std::pair{1.0, 2.0}, std::pair{1.0, 1.0}, std::pair{3.0, 5.0}}) {
            const ReplayResult r = replay(program, forward, backward);
            ASSERT_FALSE(r.deadlocked) << to_string(kind) << " p=" << p << " m=" << m << " v=" << v;
            const double ideal = kind == ScheduleKind::Interleaved ? double(p - 1) / (v * m + p - 1)
                                                                   : double(p - 1) / (m + p - 1);
            for (int stage = 0; stage < p; ++stage) {
              const double bubble = 1.0 - r.busy[stage] / r.iteration_time;
              EXPECT_NEAR(bubble, ideal, 1e-12)
                  << to_string(kind) << " p=" << p << " m=" << m << " v=" << v << " stage " << stage;
            }
          }
          ++cases;
        }
      }
    }
  }
  EXPECT_GT(cases, 150);
}

TEST(Replay, TheReplayDetectsADeadlock) {
  // Swap a stage's receive ahead of the send its peer waits for: the replay must report it.
  Program program = build_program(pipeline(ScheduleKind::OneFOneB, 2, 2, 1), Granularity::Layer);
  auto& last = program.stage_ops[1];
  auto recv = std::find_if(last.begin(), last.end(), [](const Op& op) { return op.kind == OpKind::Recv; });
  ASSERT_NE(recv, last.end());
  Op bogus = *recv;
  bogus.micro_batch = 99;  // a message nobody sends
  last.insert(last.begin(), bogus);
  EXPECT_TRUE(replay(program, 1, 2).deadlocked);
}

}  // namespace
}  // namespace twin::model
