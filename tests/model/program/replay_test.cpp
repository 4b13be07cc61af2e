// Abstract replays of the Program that prove it free of deadlock.
//   replay: every rank walks its list in order; a compute op costs a fixed time by phase (layer-granularity
//     TransformerLayer ops only; everything else is free), communication is instantaneous: a sequential interpreter
//     with buffered sends and blocking receives and collectives (what the CPU executor does). It also pins the bubble
//     of each schedule to its textbook value.
//   replay_issue_order: every stage issues its pipeline exchanges as the Program says the framework does
//     (Program::exchange_issue, Program::stage_exchanges): batched exchanges wait for every peer's matching call,
//     serialized ones wait for each in turn (DeepSpeed's blocking broadcasts), eager ones only for their receives
//     (what the simulator replays).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>

#include "model/program/moe_a2a_overlap.hpp"
#include "model/program/program.hpp"
#include "test_scenarios.hpp"

namespace twin::model {
namespace {

struct ReplayResult {
  bool deadlocked = false;
  double iteration_time = 0;
  std::vector<double> busy;  // per stage, compute time
};

// Only stages matter when tp = dp = 1: rank = stage.
ReplayResult replay(const Program& program, double forward_cost, double backward_cost, double weight_grad_cost = 0) {
  const int stages = program.stages();
  std::vector<std::size_t> next(stages, 0);
  std::vector<double> clock(stages, 0.0);  // when the compute stream is next free
  ReplayResult result;
  result.busy.assign(stages, 0.0);
  using Tag = std::tuple<int, int, int, int, int>;  // from, to, micro-batch, sender virtual stage, phase
  std::map<Tag, double> sent;                       // -> time the bytes are available
  auto cost = [&](const Op& op) {
    if (op.kind != OpKind::Compute || op.what != ComputeKind::TransformerLayer) return 0.0;
    if (op.phase == Phase::WeightGrad) return weight_grad_cost;
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

// Where a message goes: (from stage, to stage, micro-batch, sender virtual stage, phase).
using MessageKey = std::tuple<int, int, int, int, int>;
MessageKey message_key(const Op& op, int stage) {
  const bool send = op.kind == OpKind::Send;
  return {send ? stage : op.peer_stage, send ? op.peer_stage : stage, op.micro_batch, op.tag_virtual_stage,
          static_cast<int>(op.phase)};
}

// A stage's list as it issues it: its compute-stream ops, each pipeline exchange (index into stage_exchanges, as
// -1 - index) before the compute op that waits for it.
std::vector<std::int32_t> issue_items(const Program& program, int stage) {
  const auto& ops = program.stage_ops[stage];
  const auto& exchanges = program.stage_exchanges[stage];
  std::map<std::int32_t, std::int32_t> exchange_before;  // compute op -> exchange
  std::vector<std::int32_t> items, trailing;
  for (std::int32_t e = 0; e < static_cast<std::int32_t>(exchanges.size()); ++e) {
    if (exchanges[e].before >= 0) {
      exchange_before[exchanges[e].before] = e;
    } else {
      trailing.push_back(-1 - e);
    }
  }
  for (std::int32_t i = 0; i < static_cast<std::int32_t>(ops.size()); ++i) {
    if (ops[i].stream != Stream::Compute) continue;
    if (auto it = exchange_before.find(i); it != exchange_before.end()) items.push_back(-1 - it->second);
    items.push_back(i);
  }
  items.insert(items.end(), trailing.begin(), trailing.end());
  return items;
}

// Whether every stage reaches the end of its list (tp = dp = 1: only stages matter; collectives over the embedding
// world and mirror-stage groups wait for every member stage).
bool replay_issue_order(const Program& program) {
  const int stages = program.stages();
  std::vector<std::vector<std::int32_t>> items(stages);
  for (int stage = 0; stage < stages; ++stage) items[stage] = issue_items(program, stage);
  std::vector<std::size_t> next(stages, 0), posted_in_exchange(stages, 0);
  std::set<MessageKey> sends, recvs;  // posted so far
  const auto counterpart_posted = [&](const Op& op, int stage) {
    const MessageKey key = message_key(op, stage);
    return op.kind == OpKind::Send ? recvs.count(key) > 0 : sends.count(key) > 0;
  };
  const auto post = [&](const Op& op, int stage) {
    (op.kind == OpKind::Send ? sends : recvs).insert(message_key(op, stage));
  };
  // One step of `stage` at an exchange: whether the exchange is done.
  const auto exchange_done = [&](int stage, const PipelineExchange& exchange) {
    const auto& ops = program.stage_ops[stage];
    std::size_t& posted = posted_in_exchange[stage];
    if (program.exchange_issue == ExchangeIssue::Serialized) {
      while (posted < exchange.ops.size()) {
        const Op& op = ops[exchange.ops[posted]];
        post(op, stage);
        if (!counterpart_posted(op, stage)) return false;  // a blocking call: wait for the peer's
        ++posted;
      }
      return true;
    }
    for (; posted < exchange.ops.size(); ++posted) post(ops[exchange.ops[posted]], stage);
    return std::all_of(exchange.ops.begin(), exchange.ops.end(), [&](std::int32_t i) {
      const bool eager_send = program.exchange_issue == ExchangeIssue::Eager && ops[i].kind == OpKind::Send;
      return eager_send || counterpart_posted(ops[i], stage);
    });
  };
  bool progress = true;
  while (progress) {
    progress = false;
    for (int stage = 0; stage < stages; ++stage) {
      while (next[stage] < items[stage].size()) {
        const std::int32_t item = items[stage][next[stage]];
        if (item < 0) {
          if (!exchange_done(stage, program.stage_exchanges[stage][-1 - item])) break;
          posted_in_exchange[stage] = 0;
        } else if (const Op& op = program.stage_ops[stage][item];
                   op.kind == OpKind::Collective && (op.group == Group::Embedding || op.group == Group::World ||
                                                     op.group == Group::MirrorStages)) {
          // Every member stage must be at this same collective.
          const auto members = program.layout.group_members(op.group, program.layout.rank_of({0, stage, 0}));
          const bool all_here = std::all_of(members.begin(), members.end(), [&](int member) {
            const int other = program.layout.coord_of(member).pp;
            if (next[other] >= items[other].size() || items[other][next[other]] < 0) return false;
            const Op& theirs = program.stage_ops[other][items[other][next[other]]];
            return theirs.kind == OpKind::Collective && theirs.group == op.group;
          });
          if (!all_here) break;
          for (int member : members) {
            const int other = program.layout.coord_of(member).pp;
            if (other != stage) ++next[other];
          }
        }
        ++next[stage];
        progress = true;
      }
    }
  }
  for (int stage = 0; stage < stages; ++stage) {
    if (next[stage] != items[stage].size()) return false;
  }
  return true;
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
            const double ideal =
                kind == ScheduleKind::Interleaved ? double(p - 1) / (v * m + p - 1) : double(p - 1) / (m + p - 1);
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

// ZB-H1's bubble (Qi et al., ICLR 2024, Table 1): (p - 1)(F + B - W) per stage for W <= F and m >= p, against 1F1B's
// (p - 1)(F + B + W); where W > F a stage still waits for the first B to come back, (p - 1) B: in all,
// (p - 1)(F + B - min(F, W)). Exact: the replay's times are sums of the fixed costs.
TEST(Replay, ZeroBubbleH1FinishesWithThePapersBubble) {
  int cases = 0;
  for (int p : {2, 3, 4, 8}) {
    for (int m = p; m <= 2 * p + 1; ++m) {
      const Program program = build_program(pipeline(ScheduleKind::ZeroBubbleH1, p, m, 1), Granularity::Layer);
      const Program one_f_one_b = build_program(pipeline(ScheduleKind::OneFOneB, p, m, 1), Granularity::Layer);
      for (auto [layer_f, layer_b, layer_w] : {std::tuple{1.0, 1.0, 1.0}, std::tuple{1.0, 2.0, 1.0},
                                               std::tuple{2.0, 3.0, 1.0}, std::tuple{1.0, 1.0, 2.0}}) {
        const ReplayResult r = replay(program, layer_f, layer_b, layer_w);
        const double f = 2 * layer_f, b = 2 * layer_b, w = 2 * layer_w;  // pipeline(): 2 layers per stage
        ASSERT_FALSE(r.deadlocked) << "p=" << p << " m=" << m;
        const double bubble_time = (p - 1) * (f + b - std::min(f, w));
        EXPECT_DOUBLE_EQ(r.iteration_time, m * (f + b + w) + bubble_time) << "p=" << p << " m=" << m;
        for (int stage = 0; stage < p; ++stage) {
          EXPECT_DOUBLE_EQ(r.iteration_time - r.busy[stage], bubble_time) << "p=" << p << " m=" << m;
        }
        // 1F1B runs B and W as one backward: (p - 1)(F + B + W) idle
        const ReplayResult base = replay(one_f_one_b, layer_f, layer_b + layer_w);
        EXPECT_DOUBLE_EQ(base.iteration_time - base.busy[0], (p - 1) * (f + b + w));
        if (w <= f) {
          EXPECT_LT(r.iteration_time, base.iteration_time);
        }
      }
      EXPECT_TRUE(replay_issue_order(program)) << "p=" << p << " m=" << m;
      ++cases;
    }
  }
  EXPECT_EQ(cases, 4 + 5 + 6 + 10);
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

TEST(Replay, EveryFrameworksIssueOrderFinishes) {
  // Megatron's batched exchanges, DeepSpeed's serialized TrainSchedule order (v0.5's activation first, v0.8.3's
  // gradient first), the interleaved schedule's eager messages: with few and many micro-batches, at both
  // granularities.
  int cases = 0;
  std::set<ExchangeIssue> issues;
  for (const char* framework : {"megatron", "deepspeed 0.5", "deepspeed 0.8.3"}) {
    for (auto kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved}) {
      for (int p : {1, 2, 3, 4, 8}) {
        for (int m = 1; m <= 12; ++m) {
          for (int v : {1, 2, 3}) {
            Scenario s = pipeline(kind, p, m, v);
            if (std::string(framework) != "megatron") s.framework.name = Framework::DeepSpeed;
            if (std::string(framework) == "deepspeed 0.8.3") s.framework.deepspeed_version = {0, 8, 3};
            if (!validation_problems(s).empty()) continue;
            for (const Granularity granularity : {Granularity::Layer, Granularity::Op}) {
              const Program program = build_program(s, granularity);
              EXPECT_TRUE(replay_issue_order(program)) << framework << " " << to_string(kind) << " p=" << p
                                                       << " m=" << m << " v=" << v << " " << to_string(granularity);
              issues.insert(program.exchange_issue);
              ++cases;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(issues.size(), 3u);
  EXPECT_GT(cases, 600);
}

TEST(Replay, TheCombinedOneFOneBFinishes) {
  // framework.moe_a2a_overlap (model/program/moe_a2a_overlap.hpp): each steady step merges a forward and a backward layer by
  // layer, after one more warm-up forward; an MoE model over dp 2 = ep 2, without a pipeline and interleaved.
  int cases = 0;
  for (auto kind : {ScheduleKind::OneFOneB, ScheduleKind::Interleaved}) {
    for (int p : {1, 2, 3, 4}) {
      for (int m = 1; m <= 12; ++m) {
        for (int v : {1, 2, 3}) {
          Scenario s = testing::make_scenario(p * v * 2, 64, 4, 16, 128, 1, p, 2, 1, 2 * m);
          s.parallel.schedule = kind;
          s.parallel.virtual_stages = v;
          s.cluster = ClusterSpec{1, NodeKind::CpuHost, 2 * p};
          s.model.experts = 4;
          s.model.top_k = 2;
          s.parallel.ep = 2;
          s.framework.moe_a2a_overlap = true;
          if (!validation_problems(s).empty()) continue;
          for (const Granularity granularity : {Granularity::Layer, Granularity::Op}) {
            const Program program = build_program(s, granularity);
            const std::string name = std::string(to_string(kind)) + " p=" + std::to_string(p) +
                                     " m=" + std::to_string(m) + " v=" + std::to_string(v) + " " +
                                     std::string(to_string(granularity));
            EXPECT_FALSE(replay(program, 1, 2).deadlocked) << name;
            EXPECT_TRUE(replay_issue_order(program)) << name;
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 40);
}

TEST(Replay, TheIssueOrderReplayDetectsADeadlock) {
  // DeepSpeed with fewer micro-batches than stages: its stage 0 sends the last warm-up activation before it receives
  // the first gradient, of a later step. Issued in Program order instead, every exchange would wait for its peer's.
  Scenario s = pipeline(ScheduleKind::OneFOneB, 4, 2, 1);
  s.framework.name = Framework::DeepSpeed;
  Program program = build_program(s, Granularity::Layer);
  ASSERT_EQ(program.exchange_issue, ExchangeIssue::Serialized);
  EXPECT_TRUE(replay_issue_order(program));
  for (auto& exchanges : program.stage_exchanges) {
    for (PipelineExchange& exchange : exchanges) std::sort(exchange.ops.begin(), exchange.ops.end());
  }
  EXPECT_FALSE(replay_issue_order(program));
}

// ZB-V (Qi et al., ICLR 2024, the authors' handcrafted V): with each chunk's times F, B, W (W <= F) and m >= 2p - 1
// every stage idles (p - 1)(F + B - W), half ZB-H1's in a stage's times; with F = B = W that is the V's start, (p - 1)
// F, which no schedule ending the iteration on every stage together avoids. Fewer micro-batches finish too.
TEST(Replay, ZeroBubbleVFinishesWithThePapersBubble) {
  int cases = 0;
  for (int p : {2, 3, 4, 8}) {
    for (int m = 1; m <= 2 * p + 1; ++m) {
      const Program program = build_program(pipeline(ScheduleKind::ZeroBubbleV, p, m, 2), Granularity::Layer);
      EXPECT_TRUE(replay_issue_order(program)) << "p=" << p << " m=" << m;
      for (auto [layer_f, layer_b, layer_w] :
           {std::tuple{1.0, 1.0, 1.0}, std::tuple{1.0, 2.0, 1.0}, std::tuple{2.0, 3.0, 1.0}}) {
        const ReplayResult r = replay(program, layer_f, layer_b, layer_w);
        ASSERT_FALSE(r.deadlocked) << "p=" << p << " m=" << m;
        if (m < 2 * p - 1) continue;
        const double f = 2 * layer_f, b = 2 * layer_b, w = 2 * layer_w;  // pipeline(): 2 layers per chunk
        const double bubble_time = (p - 1) * (f + b - w);
        EXPECT_DOUBLE_EQ(r.iteration_time, 2 * m * (f + b + w) + bubble_time) << "p=" << p << " m=" << m;
        for (int stage = 0; stage < p; ++stage) {
          EXPECT_DOUBLE_EQ(r.iteration_time - r.busy[stage], bubble_time) << "p=" << p << " m=" << m;
        }
      }
      ++cases;
    }
  }
  EXPECT_EQ(cases, 5 + 7 + 9 + 17);
}

// DualPipeV's bubble, DeepSeek's table (the DualPipe README, from DeepSeek-V3's Table 2): (PP/2 - 1)(F&B + B - 3W),
// PP/2 = p devices, B a whole backward (B + W here), F&B an overlapped forward and backward; the replay overlaps
// nothing, F&B = F + B + W. With F = B = W that is 2 (p - 1) F, and the schedule idles only the V's start, (p - 1) F,
// the least a V can; with unequal times it idles less than the table's form too (its form counts a step 4 pair's
// wait for a whole F&B, the order waits less). Exact sums of the fixed costs.
TEST(Replay, DualPipeVFinishesWithinItsTablesBubble) {
  int cases = 0;
  for (int p : {2, 3, 4, 8}) {
    for (int m = 2 * p; m <= 2 * p + 2; ++m) {
      const Program program = build_program(pipeline(ScheduleKind::DualPipeV, p, m, 2), Granularity::Layer);
      EXPECT_TRUE(replay_issue_order(program)) << "p=" << p << " m=" << m;
      for (auto [layer_f, layer_b, layer_w] :
           {std::tuple{1.0, 1.0, 1.0}, std::tuple{1.0, 2.0, 1.0}, std::tuple{2.0, 3.0, 1.0}}) {
        const ReplayResult r = replay(program, layer_f, layer_b, layer_w);
        ASSERT_FALSE(r.deadlocked) << "p=" << p << " m=" << m;
        const double f = 2 * layer_f, b = 2 * layer_b, w = 2 * layer_w;  // pipeline(): 2 layers per chunk
        const double table = (p - 1) * ((f + b + w) + (b + w) - 3 * w);
        for (int stage = 0; stage < p; ++stage) {
          const double idle = r.iteration_time - r.busy[stage];
          EXPECT_LE(idle, table) << "p=" << p << " m=" << m;
          if (f == b && b == w) {
            EXPECT_DOUBLE_EQ(idle, (p - 1) * f) << "p=" << p << " m=" << m;
            EXPECT_DOUBLE_EQ(table, 2 * (p - 1) * f);
          }
        }
      }
      ++cases;
    }
  }
  EXPECT_EQ(cases, 4 * 3);
}

// DualPipe (schedule.hpp): DeepSeek-V3's Table 2 gives (PP/2 - 1)(F&B + B - 3W), PP = p stages, F, B, W a block's
// (a chunk's) times, B a whole backward (B + W here), F&B an overlapped pair (F + B + W: the replay overlaps
// nothing). Each stage runs DualPipeV's steps on p / 2 stages, so with F = B = W it idles only its direction's start,
// (p/2 - 1) F, half the table's; with unequal times at most the table's. Busy: m / 2 micro-batches of each direction
// through its block, m (F + B + W). The pair's gradient sum (Group::MirrorStages) comes last and costs nothing here.
TEST(Replay, DualPipeFinishesWithinItsTablesBubble) {
  int cases = 0;
  for (int p : {2, 4, 6, 8}) {
    for (int m = 2 * p; m <= 2 * p + 4; m += 2) {
      const Program program = build_program(pipeline(ScheduleKind::DualPipe, p, m, 2), Granularity::Layer);
      EXPECT_TRUE(replay_issue_order(program)) << "p=" << p << " m=" << m;
      for (auto [layer_f, layer_b, layer_w] :
           {std::tuple{1.0, 1.0, 1.0}, std::tuple{1.0, 2.0, 1.0}, std::tuple{2.0, 3.0, 1.0}}) {
        const ReplayResult r = replay(program, layer_f, layer_b, layer_w);
        ASSERT_FALSE(r.deadlocked) << "p=" << p << " m=" << m;
        const double f = 4 * layer_f, b = 4 * layer_b, w = 4 * layer_w;  // pipeline(): 4 p layers, p blocks
        const double table = (p / 2 - 1) * ((f + b + w) + (b + w) - 3 * w);
        for (int stage = 0; stage < p; ++stage) {
          EXPECT_DOUBLE_EQ(r.busy[stage], m * (f + b + w)) << "p=" << p << " m=" << m;
          const double idle = r.iteration_time - r.busy[stage];
          EXPECT_LE(idle, table + 1e-9) << "p=" << p << " m=" << m << " stage " << stage;
          if (f == b && b == w) {
            EXPECT_DOUBLE_EQ(idle, (p / 2 - 1) * f) << "p=" << p << " m=" << m;
          }
        }
      }
      ++cases;
    }
  }
  EXPECT_EQ(cases, 4 * 3);
}

// DualPipe on an MoE model over dp 2 = ep 2: its F&B pairs merged layer by layer (overlaps_pairs), the all-to-alls of
// one micro-batch between the other's compute, still free of deadlock in both replays.
TEST(Replay, DualPipesMergedPairsFinish) {
  int cases = 0;
  for (int p : {2, 4}) {
    for (int m = 2 * p; m <= 2 * p + 2; m += 2) {
      Scenario s = testing::make_scenario(4 * p, 64, 4, 16, 128, 1, p, 2, 1, 2 * m);
      s.parallel.schedule = ScheduleKind::DualPipe;
      s.parallel.virtual_stages = 2;
      s.cluster = ClusterSpec{1, NodeKind::CpuHost, 2 * p};
      s.model.experts = 4;
      s.model.top_k = 2;
      s.parallel.ep = 2;
      ASSERT_TRUE(validation_problems(s).empty()) << validation_problems(s).front();
      ASSERT_TRUE(overlaps_pairs(s));
      for (const Granularity granularity : {Granularity::Layer, Granularity::Op}) {
        const Program program = build_program(s, granularity);
        const std::string name = "p=" + std::to_string(p) + " m=" + std::to_string(m);
        EXPECT_FALSE(replay(program, 1, 2, 1).deadlocked) << name;
        EXPECT_TRUE(replay_issue_order(program)) << name;
        ++cases;
      }
    }
  }
  EXPECT_EQ(cases, 8);
}

}  // namespace
}  // namespace twin::model
