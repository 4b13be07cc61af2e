// simulate(): replay one iteration of a Program on a SimGrid model of the cluster and return its Timeline.
//
//   rank fidelity   one SimGrid actor per GPU replays its stage's op list with the Program's semantics (ops issued
//                   in order; ordered Compute and DataParallel streams; unordered Send/Recv matched by P2PTag;
//                   deps); every collective is decomposed into flows (sim/collectives.hpp).
//   group fidelity  one actor per TP group (default above 64 GPUs): TP collectives are timed analytically on
//                   NVLink (nothing else uses a node's NVLink in Megatron's placement), and so are an all-to-all's
//                   bytes inside a node (its members still meet; its bytes across nodes are a few flows per node
//                   pair: sim/all_to_all.hpp, AllToAllFlows::PerNodePair); everything else is a flow of the group
//                   over its bundled links (topology/platform.hpp).
//   replica fidelity  group fidelity for one pipeline replica (the actors of DP index 0) alone: the other replicas
//                   mirror it op by op (sim/replica.cpp). Every collective with flows still runs on the whole
//                   fabric for every replica: the data-parallel ones' groups hold every replica already (one
//                   instance, as at group fidelity); a group no replayed actor belongs to (another replica's
//                   context-parallel or expert-parallel group) sends its flows beside the replayed group's, phase by
//                   phase, so that leaf and spine links feel them. Exact when every replica's timeline is replica
//                   0's: the same ops and costs (no --slow-gpu, --slow-link, --failed-uplink: refused) and the same
//                   waits on the network. What it leaves out: the other replicas' pipeline messages (and context-
//                   parallel ring messages), which at group fidelity share fabric links with replica 0's traffic.
//                   docs/simulator.md says how close it comes.
// Compute ops cost what the CostModel says. Communication latencies are paid by the replayers (NCCL's model plus
// the route's hardware latency); SimGrid shares bandwidth.
//
// SimGrid allows one simulation per process; simulate() therefore runs it in a forked child process by default
// (`isolate`), so that a program (or a test binary) may call it any number of times.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "model/program/program.hpp"
#include "report/timeline.hpp"
#include "sim/collectives.hpp"
#include "sim/cost_model.hpp"
#include "sim/degraded.hpp"
#include "topology/hardware.hpp"

namespace twin::sim {

enum class Fidelity : unsigned char { Auto, Rank, Group, Replica };
std::string_view to_string(Fidelity fidelity);
Fidelity parse_fidelity(std::string_view text);  // "auto", "rank", "group", "replica"; throws std::invalid_argument

struct SimOptions {
  Fidelity fidelity = Fidelity::Auto;
  // auto: group fidelity above this many GPUs (when every TP group is inside a node). It gives every published run's
  // iteration time to within 0.012 % of rank fidelity (bench/accuracy/run.py --fidelity auto against group),
  // 10 to 50 times faster; below 64 GPUs rank fidelity takes under a second anyway.
  int group_fidelity_above_gpus = 64;
  // auto: replica fidelity above this many GPUs, where group fidelity is exact and replica fidelity within
  // replica_tolerance of it (replica_exact_enough): above 512 GPUs, where group fidelity's replay of every replica's
  // ops and flows starts to cost tens of seconds (minutes with expert parallelism across nodes: DeepSeek-V3 on 1,024
  // H100 took about 55 s at group fidelity, 47 s at replica), and replica fidelity is never the slower
  // (docs/simulator.md, "Replica fidelity").
  int replica_fidelity_above_gpus = 512;
  std::string placement = "tp-dp-pp";          // topology::Placement order
  std::optional<topology::NodeSpec> node;      // default: the scenario's cluster.node
  std::optional<topology::FabricSpec> fabric;  // default: the node's InfiniBand fabric
  CollectiveAlgorithm algorithm = CollectiveAlgorithm::Auto;
  bool ideal_network = false;     // infinite bandwidth, zero latency: the pipeline schedule alone
  bool blocking_p2p = true;       // Send/Recv block both sides as the frameworks do (model/ops/exchanges.hpp); false: a
                                  // Send leaves eagerly and only the receiver waits
  std::vector<int> record_ranks;  // ranks whose full timeline is kept, besides dp = 0, tp = 0 of every stage
  bool isolate = true;            // run SimGrid in a child process
  double wall_limit_s = 0;        // isolated runs: stop the child after this long (0: no limit); throws SimulationError
  bool progress = false;          // a progress line on stderr once a run takes more than two seconds
  Degradations degradations;      // slow GPUs and links, a failed up-link (sim/degraded.hpp)
};

struct EngineStats {
  double wall_s = 0;            // the simulation itself (platform, replay)
  double peak_rss_bytes = 0;    // of the simulating process (the child when isolated)
  std::int64_t activities = 0;  // SimGrid activities started: flows, messages, timed waits
  std::int64_t ops = 0;         // ops the actors replayed
  std::int64_t rank_ops = 0;    // ops of the Program over every rank (what the replayed ops stand for)
  int actors = 0;
};

struct SimResult {
  report::Timeline timeline;
  Fidelity fidelity = Fidelity::Rank;  // the one used
  std::string hardware;                // "DGX A100 (A100-SXM4-80GB), InfiniBand HDR fat-tree"
  double peak_flops_per_gpu = 0;       // matrix peak for the scenario's dtype
  double gpu_memory_bytes = 0;
  EngineStats stats;
};

// A scenario the simulator cannot run (CPU cluster, group fidelity impossible, ...) or a replay that cannot finish
// (deadlocked Program).
class SimulationError : public UserError {
 public:
  using UserError::UserError;
};

// The fidelity `options` selects for `program` (resolving Auto); throws SimulationError when Group or Replica is
// requested but impossible (TP groups not inside nodes; Replica with degradations).
Fidelity choose_fidelity(const model::Program& program, const SimOptions& options);

// Whether auto may take replica fidelity for `program`: more than one replica, none degraded, and none of the cases
// where the guard against group fidelity (tests, docs/simulator.md) found it more than 0.5 % off.
bool replica_exact_enough(const model::Program& program, const SimOptions& options);

SimResult simulate(const model::Program& program, const CostModel& cost, const SimOptions& options = {});

}  // namespace twin::sim
