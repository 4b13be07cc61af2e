// The parallel plans of a scenario worth simulating (`twin search`): every tp (powers of two up to a node), pp, cp,
// micro-batch, chunks and schedule, and what the PlanSpace varies besides (recompute, sequence parallelism, ZeRO,
// ZB-H1, expert tensor parallelism); kept when valid and within one GPU's memory less the headroom, ordered by ideal
// bubble. The model, cluster and global batch stay. In program/ because the memory estimate is.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/scenario/scenario.hpp"

namespace twin::model {

// What a search varies beyond tp, pp, cp, micro-batch and chunks.
struct PlanSpace {
  bool vary_recompute = false;          // recompute none, selective, full, and block recompute
  bool vary_sequence_parallel = false;  // with and without sequence parallelism where tp > 1
  bool vary_zero = false;               // ZeRO stages 0 and 1
  bool vary_schedule = false;           // ZB-H1 beside 1F1B without chunks; ZB-V and DualPipeV on two chunks
  bool vary_etp = false;                // MoE: expert tensor parallelism 2, 4, ... up to a node
  bool vary_cp = false;                 // context parallelism 1, 2, 4, 8
  // What a plan must leave free of one GPU's memory: "5%" of it, or GiB ("4", "4GiB"). None by default: the plans
  // NVIDIA and Meta ran on 80 GB GPUs sit at 97.6 to 99.6 % of twin's estimate (docs/accuracy.md, "Memory").
  std::string memory_headroom = "0%";
};

struct Plan {
  std::int64_t tp = 1, pp = 1, dp = 1, micro_batch = 1, chunks = 1;
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  Recompute recompute = Recompute::None;
  std::int64_t recompute_layers = 0;  // parallel.recompute_num_layers: block recompute of full; 0: every layer
  bool sequence_parallel = false;
  std::int64_t zero_stage = 0;
  bool overlap_param_gather = false;  // the scenario's, kept where it applies (ZeRO-1)
  bool moe = false;                   // the model has experts: ep and etp are part of the plan
  std::int64_t ep = 1, etp = 1;
  std::int64_t cp = 1;  // context parallelism: dp = GPUs / (tp x cp x pp)
  double ideal_bubble = 0;
  double peak_memory_bytes = 0;
  double iteration_time_bound_s = 0;  // what a search sets: model/program/iteration_bound.hpp (0: not computed)

  // The plan as `--set` overrides of the scenario.
  std::vector<std::string> overrides() const;
  // The sharding column: sequence parallelism and the ZeRO stage, "-" for neither.
  std::string sharding_label() const;
  // The recompute column: none, selective, full, or "block N" (the first N layers of each chunk).
  std::string recompute_label() const;
  // The expert columns of an MoE plan: "ep 8" or "ep 8 etp 2"; empty for a dense model.
  std::string expert_label() const;
  std::string label() const;  // "tp 8 pp 35 dp 8 mb 1 1f1b recompute full -"
};

// A plan the enumeration left out, with why: the first rule it breaks, or the memory it needs.
struct Rejection {
  std::string plan;
  std::string reason;
  bool memory = false;
};

struct PlanEnumeration {
  std::vector<Plan> plans;  // valid and fitting, smallest ideal bubble first (then less tensor parallelism)
  int rejected_for_memory = 0;
  int invalid = 0;  // broke a validation rule: plans.size() + rejected_for_memory + invalid were enumerated
  std::vector<Rejection> rejections;  // with `explain`: every plan left out
};

// What PlanSpace::memory_headroom leaves free of a GPU of `capacity_bytes`. Throws UserError naming
// --memory-headroom when it is not a share under 100 % or GiB under the capacity.
double headroom_bytes(const std::string& text, double capacity_bytes);

// `base` with the plan's parallel settings (what Plan::overrides() sets).
Scenario with_plan(const Scenario& base, const Plan& plan);

// Every valid plan of `base` that fits, as `space` asks; with `explain`, the rejected ones with their reasons.
PlanEnumeration enumerate_plans(const Scenario& base, const PlanSpace& space, bool explain);

}  // namespace twin::model
