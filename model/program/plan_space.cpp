// The plan space, walked: every axis nested, each candidate validated and its memory estimated.
#include "model/program/plan_space.hpp"

#include <algorithm>
#include <exception>
#include <utility>

#include <fmt/core.h>

#include "model/plan/schedule.hpp"
#include "model/program/estimates.hpp"
#include "model/scenario/errors.hpp"

namespace twin::model {
namespace {

std::vector<std::int64_t> divisors(std::int64_t n) {
  std::vector<std::int64_t> out;
  for (std::int64_t d = 1; d <= n; ++d) {
    if (n % d == 0) out.push_back(d);
  }
  return out;
}

// The (ep, etp) pairs worth trying: for a Mixture-of-Experts model every ep that divides the experts, with etp = 1 or
// (vary_etp) every power of two up to a node's GPUs; validation keeps what Megatron-Core allows (ep x etp dividing
// tp x dp, model/plan/ranks.hpp). A dense model keeps its (1, 1).
std::vector<std::pair<std::int64_t, std::int64_t>> expert_plans(const model::Scenario& base, bool vary_etp) {
  if (!base.model.is_moe()) return {{base.parallel.ep, base.parallel.etp}};
  std::vector<std::int64_t> etps{1};
  if (vary_etp) {
    for (std::int64_t etp = 2; etp <= base.cluster.gpus_per_node; etp *= 2) etps.push_back(etp);
  }
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  for (const std::int64_t ep : divisors(base.model.experts)) {
    for (const std::int64_t etp : etps) out.emplace_back(ep, etp);
  }
  return out;
}

// Pipeline sizes worth trying: those that split the layers evenly, or, when the scenario gives its end stages their
// own layer counts (parallel.first_stage_layers / last_stage_layers), any pipeline (the validation keeps those whose
// remaining layers split evenly over the other stages).
std::vector<std::int64_t> pipeline_sizes(const model::Scenario& base) {
  const auto& p = base.parallel;
  if (p.first_stage_layers <= 0 && p.last_stage_layers <= 0) return divisors(base.model.layers);
  std::vector<std::int64_t> out;
  for (std::int64_t pp = 2; pp <= base.model.layers; ++pp) out.push_back(pp);
  return out;
}

// The block recomputes (parallel.recompute_num_layers) worth trying on a plan with full recompute: a quarter, half and
// three quarters of its longest chunk's layers, each recomputing fewer layers than full recompute does.
std::vector<std::int64_t> block_recompute_layers(const model::Scenario& s) {
  std::int64_t longest = 0;
  for (std::int64_t vs = 0; vs < s.parallel.pp * s.parallel.virtual_stages; ++vs) {
    longest = std::max(longest, s.layers_in_virtual_stage(vs));
  }
  std::vector<std::int64_t> out;
  for (const std::int64_t quarters : {1, 2, 3}) {
    const std::int64_t layers = (longest * quarters + 2) / 4;
    const bool fresh = std::find(out.begin(), out.end(), layers) == out.end();
    if (layers >= 1 && layers < longest && fresh) out.push_back(layers);
  }
  return out;
}

// `s` as a plan, when it is valid and fits within the headroom; otherwise, with `rejections`, why not.
void add_plan_if_it_fits(const model::Scenario& s, const PlanSpace& o, std::vector<Plan>& plans,
                         int& rejected_for_memory, int& invalid, std::vector<Rejection>* rejections) {
  const auto& p = s.parallel;
  Plan plan{p.tp, p.pp, p.dp, p.micro_batch, p.virtual_stages, p.schedule, p.recompute, p.recompute_num_layers};
  plan.sequence_parallel = p.sequence_parallel;
  plan.zero_stage = p.zero_stage;
  plan.overlap_param_gather = p.overlap_param_gather;
  plan.moe = s.model.is_moe();
  plan.ep = p.ep;
  plan.etp = p.etp;
  plan.cp = p.cp;
  if (const std::vector<std::string> problems = model::validation_problems(s); !problems.empty()) {
    ++invalid;
    if (rejections) {
      std::string reason = problems.front();  // without the scenario's name: every line would repeat it
      if (reason.rfind(s.source + ": ", 0) == 0) reason.erase(0, s.source.size() + 2);
      rejections->push_back({plan.label(), reason, false});
    }
    return;
  }
  const auto memory = model::estimate_memory(s);
  const double headroom = headroom_bytes(o.memory_headroom, memory.capacity_bytes);
  if (memory.peak_bytes > memory.capacity_bytes - headroom) {
    ++rejected_for_memory;
    const double gib = 1024.0 * 1024 * 1024;
    if (rejections) {
      rejections->push_back(
          {plan.label(),
           fmt::format("needs {:.1f} GiB of {:.0f} GiB, over the {:.1f} GiB the headroom leaves",
                       memory.peak_bytes / gib, memory.capacity_bytes / gib, (memory.capacity_bytes - headroom) / gib),
           true});
    }
    return;
  }
  plan.ideal_bubble = model::ideal_bubble_fraction(p);
  plan.peak_memory_bytes = memory.peak_bytes;
  plans.push_back(plan);
}

// The schedules a plan with `pp` stages and `chunks` chunks per stage runs: with chunks the interleaved one (the
// base's V or DualPipe instead, on two chunks), else the base's (1F1B where it cannot apply: the base's interleaved,
// V or DualPipe, or ZB-H1 without a pipeline); with vary_schedule ZB-H1 too where there is a pipeline, and the
// interleaved schedule, ZB-V, DualPipeV and DualPipe on two chunks (validation keeps DualPipeV's and DualPipe's with
// 2 pp micro-batches, DualPipe's on an even pp with an even number of them).
std::vector<model::ScheduleKind> schedules_of(const model::Scenario& base, std::int64_t pp, std::int64_t chunks,
                                              bool vary_schedule) {
  using model::ScheduleKind;
  const bool base_v = base.parallel.v_shape() || base.parallel.bidirectional();
  if (chunks > 1) {
    const bool v = chunks == 2 && pp > 1;
    const ScheduleKind first = v && base_v ? base.parallel.schedule : ScheduleKind::Interleaved;
    std::vector<ScheduleKind> out{first};
    for (const ScheduleKind kind :
         {ScheduleKind::Interleaved, ScheduleKind::ZeroBubbleV, ScheduleKind::DualPipeV, ScheduleKind::DualPipe}) {
      if (v && vary_schedule && kind != first) out.push_back(kind);
    }
    return out;
  }
  ScheduleKind own = base.parallel.schedule;
  if (own == ScheduleKind::Interleaved || base_v) own = ScheduleKind::OneFOneB;
  if (pp == 1 && own == ScheduleKind::ZeroBubbleH1) own = ScheduleKind::OneFOneB;
  std::vector<ScheduleKind> out{own};
  if (vary_schedule && pp > 1 && own != ScheduleKind::ZeroBubbleH1) out.push_back(ScheduleKind::ZeroBubbleH1);
  return out;
}

// Every valid plan that fits, ordered by its ideal bubble (then less tensor parallelism): the order in which they are
// simulated when there are more than --max. With vary_recompute, every recompute mode, block recompute included; with
// vary_sequence_parallel, with and without it (where tp > 1); with vary_zero, ZeRO stages 0 and 1; with vary_schedule,
// ZB-H1 beside 1F1B (schedules_of).
std::vector<Plan> enumerate(const model::Scenario& base, const PlanSpace& o, int& rejected_for_memory, int& invalid,
                            std::vector<Rejection>* rejections) {
  const bool vary_recompute = o.vary_recompute;
  std::vector<model::Recompute> recomputes{base.parallel.recompute};
  if (vary_recompute) recomputes = {model::Recompute::None, model::Recompute::Selective, model::Recompute::Full};
  std::vector<bool> sequence_parallels{base.parallel.sequence_parallel};
  if (o.vary_sequence_parallel) sequence_parallels = {false, true};
  std::vector<std::int64_t> zero_stages{base.parallel.zero_stage};
  if (o.vary_zero) zero_stages = {0, 1};
  const std::int64_t gpus = base.cluster.total_gpus();
  const auto experts = expert_plans(base, o.vary_etp);
  // Context parallelism takes its share of the GPUs before data parallelism does (Megatron-Core's rank grid): the
  // scenario's cp, or with --vary-cp each of 1, 2, 4, 8 (validation keeps those the sequence length allows).
  const std::vector<std::int64_t> cps =
      o.vary_cp ? std::vector<std::int64_t>{1, 2, 4, 8} : std::vector<std::int64_t>{base.parallel.cp};
  const auto recompute_and_schedule = [&](std::int64_t pp, std::int64_t chunks) {
    std::vector<std::pair<model::Recompute, model::ScheduleKind>> out;
    for (const model::Recompute recompute : recomputes) {
      for (const model::ScheduleKind schedule : schedules_of(base, pp, chunks, o.vary_schedule)) {
        out.emplace_back(recompute, schedule);
      }
    }
    return out;
  };
  std::vector<Plan> plans;
  rejected_for_memory = 0;
  invalid = 0;
  for (std::int64_t tp = 1; tp <= base.cluster.gpus_per_node; tp *= 2) {
    for (std::int64_t pp : pipeline_sizes(base)) {
      for (const std::int64_t cp : cps) {
        if (gpus % (tp * pp * cp) != 0) continue;
        const std::int64_t dp = gpus / (tp * pp * cp);
        for (std::int64_t micro_batch : {1, 2, 4, 8}) {
          for (std::int64_t chunks = 1; chunks <= 4; ++chunks) {
            for (const auto& [recompute, schedule] : recompute_and_schedule(pp, chunks)) {
              model::Scenario s = base;
              s.parallel.tp = tp;
              s.parallel.pp = pp;
              s.parallel.dp = dp;
              s.parallel.cp = cp;
              s.parallel.micro_batch = micro_batch;
              s.parallel.virtual_stages = chunks;
              s.parallel.schedule = schedule;
              s.parallel.recompute = recompute;
              // Block recompute belongs to full recompute: the base's own, then (varying) a few more.
              const bool full = recompute == model::Recompute::Full;
              std::vector<std::int64_t> blocks{full ? base.parallel.recompute_num_layers : 0};
              if (vary_recompute && full && base.framework.name != model::Framework::DeepSpeed) {
                for (const std::int64_t layers : block_recompute_layers(s)) {
                  if (layers != blocks.front()) blocks.push_back(layers);
                }
              }
              for (const std::int64_t block : blocks) {
                s.parallel.recompute_num_layers = block;
                // Without TP there is nothing to split: sequence parallelism is off, once.
                for (const bool sequence_parallel : tp == 1 ? std::vector<bool>{false} : sequence_parallels) {
                  s.parallel.sequence_parallel = sequence_parallel;
                  for (const std::int64_t zero_stage : zero_stages) {
                    s.parallel.zero_stage = zero_stage;
                    // --overlap-param-gather belongs to the distributed optimizer: a ZeRO-0 variant goes without it.
                    s.parallel.overlap_param_gather = base.parallel.overlap_param_gather && zero_stage == 1;
                    for (const auto& [ep, etp] : experts) {
                      s.parallel.ep = ep;
                      s.parallel.etp = etp;
                      add_plan_if_it_fits(s, o, plans, rejected_for_memory, invalid, rejections);
                    }
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  std::stable_sort(plans.begin(), plans.end(), [](const Plan& a, const Plan& b) {
    if (a.ideal_bubble != b.ideal_bubble) return a.ideal_bubble < b.ideal_bubble;
    return a.tp < b.tp;
  });
  return plans;
}

}  // namespace

std::vector<std::string> Plan::overrides() const {
  std::vector<std::string> sets{fmt::format("parallel.tp={}", tp),
                                fmt::format("parallel.pp={}", pp),
                                fmt::format("parallel.dp={}", dp),
                                fmt::format("parallel.cp={}", cp),
                                fmt::format("parallel.micro_batch={}", micro_batch),
                                fmt::format("parallel.schedule={}", model::to_string(schedule)),
                                fmt::format("parallel.virtual_stages={}", chunks),
                                fmt::format("parallel.recompute={}", model::to_string(recompute)),
                                fmt::format("parallel.recompute_num_layers={}", recompute_layers),
                                fmt::format("parallel.sequence_parallel={}", sequence_parallel),
                                fmt::format("parallel.zero_stage={}", zero_stage),
                                fmt::format("parallel.overlap_param_gather={}", overlap_param_gather)};
  if (moe) {
    sets.push_back(fmt::format("parallel.ep={}", ep));
    sets.push_back(fmt::format("parallel.etp={}", etp));
  }
  return sets;
}
std::string Plan::sharding_label() const {
  std::string out = sequence_parallel ? "sp" : "";
  if (zero_stage > 0) out += fmt::format("{}zero{}", out.empty() ? "" : " ", zero_stage);
  return out.empty() ? "-" : out;
}
std::string Plan::recompute_label() const {
  return recompute_layers > 0 ? fmt::format("block {}", recompute_layers) : std::string(model::to_string(recompute));
}
std::string Plan::expert_label() const {
  if (!moe) return "";
  return etp > 1 ? fmt::format("ep {} etp {}", ep, etp) : fmt::format("ep {}", ep);
}
std::string Plan::label() const {
  return fmt::format("tp {} pp {} dp {}{}{} mb {} {}{} recompute {} {}", tp, pp, dp,
                     cp > 1 ? fmt::format(" cp {}", cp) : "", moe ? " " + expert_label() : "", micro_batch,
                     model::to_string(schedule), chunks > 1 ? fmt::format(" v{}", chunks) : "", recompute_label(),
                     sharding_label());
}

double headroom_bytes(const std::string& text, double capacity_bytes) {
  const bool percent = !text.empty() && text.back() == '%';
  std::string number = percent ? text.substr(0, text.size() - 1) : text;
  if (!percent && number.size() > 3 && number.compare(number.size() - 3, 3, "GiB") == 0) {
    number.resize(number.size() - 3);
  }
  double value = -1;
  try {
    std::size_t used = 0;
    value = std::stod(number, &used);
    if (used != number.size()) value = -1;
  } catch (const std::exception&) {
    value = -1;
  }
  const double bytes = percent ? capacity_bytes * value / 100 : value * 1024 * 1024 * 1024;
  if (!(value >= 0) || !(bytes < capacity_bytes)) {
    throw UserError(
        fmt::format("--memory-headroom {}: give a share of one GPU's memory under 100 % (\"5%\") or "
                    "GiB under its {:.0f} GiB (\"4\", \"4GiB\")",
                    text, capacity_bytes / (1024.0 * 1024 * 1024)));
  }
  return bytes;
}

PlanEnumeration enumerate_plans(const Scenario& base, const PlanSpace& space, bool explain) {
  PlanEnumeration out;
  out.plans = enumerate(base, space, out.rejected_for_memory, out.invalid, explain ? &out.rejections : nullptr);
  return out;
}

Scenario with_plan(const Scenario& base, const Plan& plan) {
  Scenario s = base;
  auto& p = s.parallel;
  p.tp = plan.tp;
  p.pp = plan.pp;
  p.dp = plan.dp;
  p.cp = plan.cp;
  p.micro_batch = plan.micro_batch;
  p.virtual_stages = plan.chunks;
  p.schedule = plan.schedule;
  p.recompute = plan.recompute;
  p.recompute_num_layers = plan.recompute_layers;
  p.sequence_parallel = plan.sequence_parallel;
  p.zero_stage = plan.zero_stage;
  p.overlap_param_gather = plan.overlap_param_gather;
  if (plan.moe) {
    p.ep = plan.ep;
    p.etp = plan.etp;
  }
  return s;
}

}  // namespace twin::model
