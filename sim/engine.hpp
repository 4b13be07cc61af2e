// The replay engine's insides (not part of the public API; see simulate.hpp).
//
//   StagePlan           per stage, read-only, shared by every actor of the stage: op durations, dependency graph
//                       (deps + ordered-stream predecessor), P2P tag lookup
//   Replayer            one SimGrid actor (a rank, or a TP group): resolves its ops as soon as their times are
//                       known; only ops that touch the network (Send, flow collectives) wait for the simulated clock
//   CollectiveInstance  one collective call of a group: members register, the last to register owns it: it starts
//                       the flows and, when they are done, resolves every member's op itself (all actors share one
//                       OS thread); a member is woken (a zero-byte message to its doorbell) only when that gives it
//                       something to start earlier than it planned to wake up
//   Engine              everything shared: Program, placement, platform, plans, replayers, live collectives
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <queue>
#include <string>
#include <unordered_map>
#include <vector>

#include <simgrid/forward.h>

#include "sim/collectives.hpp"
#include "sim/simulate.hpp"
#include "topology/placement.hpp"
#include "topology/platform.hpp"

namespace twin::sim::detail {

struct StagePlan {
  int stage = 0;
  const std::vector<model::Op>* ops = nullptr;
  std::vector<double> duration;               // compute ops and local collectives: seconds
  // Mixture-of-Experts: seconds of each compute op's routed-expert GEMMs (the Program gives every rank the hottest EP
  // rank's rows; a replayer holding fewer runs them in its share of that time). Empty without MoE.
  std::vector<double> expert_s;
  std::vector<std::uint8_t> local;            // 1: timed without the network (compute, analytical collective)
  std::vector<std::uint8_t> rendezvous;       // 1: a Send/Recv replayed as a blocking two-member exchange
  std::vector<double> lead;                   // a TP collective hidden under a GEMM: seconds of it the GEMM hides
  std::vector<double> receipt_s;              // an eager Recv: seconds after its bytes arrive (TP all-gather)
  // The host thread issues the stage's ops in list order, each taking its HostCost (0 when the cost model gives
  // none): an op cannot start before the host has issued its first kernel (issue_first_s), nor end before the host
  // has issued its last one and that kernel has run (issue_last_s + last_kernel_s). Seconds from the iteration's start.
  std::vector<double> issue_first_s;
  std::vector<double> issue_last_s;
  std::vector<double> last_kernel_s;
  bool host_paced = false;  // any host cost at all (else the three vectors above are empty)
  // Ops after which the host waits until the GPU has run them (model::host_waits_for), in list order; host_paced
  // only. Once the GPU finishes one later than the host reached it, the host issues every later op that much later.
  std::vector<std::int32_t> host_syncs;
  std::vector<std::int32_t> pending;          // predecessors: deps + stream predecessor (+1 arrival for a Recv)
  std::vector<std::int32_t> successor_begin;  // CSR, size ops + 1
  std::vector<std::int32_t> successors;
  std::vector<std::int32_t> collective_seq;                     // k-th collective of its group kind on this stage
  std::vector<std::int32_t> recv_slot;                          // index among the stage's Recv ops, or -1
  std::vector<int> peer_stages;                                 // stages this stage receives from (inbox order)
  std::unordered_map<std::uint64_t, std::int32_t> recv_by_tag;  // (from stage, P2PTag) -> Recv op
  std::int32_t recv_count = 0;
};

// A Recv's key on its stage: the stage it receives from and the message's tag (model::p2p_tag_key).
std::uint64_t p2p_key(int from_stage, const model::P2PTag& tag);

class Replayer;

struct CollectiveInstance {
  std::uint64_t key = 0;
  CollectivePlan plan;
  std::vector<int> members;             // replayer ids, in group order
  int expected = 0;                     // members that arrive (replica fidelity: the replayed ones)
  // Replica fidelity: the ids the flows run between when mirror groups' flows were added (the group's members, then
  // each mirror group's); empty: `members`.
  std::vector<int> flow_members;
  std::vector<std::int32_t> member_op;  // each member's op
  std::vector<double> arrival_s;        // when each member reached it
  std::vector<double> extra_s;          // per member, seconds after completion (a receiver's TP all-gather)
  int arrived = 0;
  std::size_t phase = 0;
  int flows_left = 0;
  double started_s = 0;  // when the last member arrived
  double phase_started_s = 0;  // when the current phase's flows started
  double completion_s = 0;
};

class Engine;

class Replayer {
 public:
  Replayer(Engine& engine, int id, int stage, simgrid::s4u::Host* host, bool record);
  void run();  // the actor's body

  int id() const { return id_; }
  int stage() const { return stage_; }
  simgrid::s4u::Host* host() const { return host_; }
  bool finished() const { return resolved_ == static_cast<std::int64_t>(pending_.size()); }
  std::int64_t resolved() const { return resolved_; }
  double latest_end_s() const { return latest_end_s_; }
  bool recorded() const { return !start_.empty(); }
  const std::vector<double>& starts() const { return start_; }
  const std::vector<double>& actives() const { return active_; }
  const std::vector<double>& ends() const { return end_; }
  std::string describe_unfinished() const;

  // Used by the running actor on behalf of another replayer (the owner of a collective resolving its members).
  void finish(std::int32_t op, double start_s, double active_s, double end_s);
  void drain();
  bool needs_wake() const;
  void ring();
  bool queued = false;  // in the engine's worklist

  simgrid::s4u::Mailbox* inbox(int from_stage) const;
  simgrid::s4u::Mailbox* doorbell() const { return doorbell_; }

 private:
  enum class Wait : std::uint8_t { Inbox, Doorbell, Send, CollectiveFlow, PhaseDone };
  struct Waiting {
    Wait kind;
    std::int32_t index;  // inbox slot, or op
    double start_s;      // Send: its start
    CollectiveInstance* instance;
  };
  enum class Due : std::uint8_t { Issue, StartPhase };
  struct DueEvent {
    double time_s;
    std::uint64_t sequence;  // FIFO among equal times (determinism)
    Due kind;
    std::int32_t op;
    CollectiveInstance* instance;
    bool operator>(const DueEvent& other) const {
      return time_s != other.time_s ? time_s > other.time_s : sequence > other.sequence;
    }
  };

  void become_ready(std::int32_t op);
  void schedule(double time_s, Due kind, std::int32_t op, CollectiveInstance* instance);
  void issue_due();
  void send(std::int32_t op);
  void arrive(std::int32_t op);
  void start_phase(CollectiveInstance* instance);
  void complete_collective(CollectiveInstance* instance, double completion_s);
  void handle(std::size_t index);
  void post_inbox(int slot);
  void post_doorbell();
  // Replica fidelity: a phase's flows are started and waited for by a helper actor, which then posts the instance to
  // phases_ (sim/replica.cpp: one actor waiting on thousands of flows costs SimGrid time in their number per event).
  bool start_phase_by_helper(CollectiveInstance* instance);  // false: too few flows to be worth an actor
  void post_phases();
  void end_phase(CollectiveInstance* instance, double now_s);
  void add_wait(simgrid::s4u::ActivityPtr activity, Waiting waiting);

  Engine& engine_;
  int id_;
  int stage_;
  const StagePlan& plan_;
  simgrid::s4u::Host* host_;
  std::vector<double> ready_;                         // latest end of the finished predecessors
  std::vector<std::int32_t> pending_;                 // predecessors not finished
  std::vector<double> start_, active_, end_;          // recorded replayers only
  std::vector<double> arrival_s_, transfer_start_s_;  // per Recv slot
  std::vector<std::int32_t> ready_list_;
  std::int64_t resolved_ = 0;
  double latest_end_s_ = 0;
  // How far the host runs behind its own issue times after each of plan_.host_syncs (seconds, never less than after
  // the one before), known for the first host_syncs_done_ of them.
  std::vector<double> host_lag_s_;
  std::size_t host_syncs_done_ = 0;
  double host_lag_s(std::int32_t op) const;  // the lag after the last host sync listed before `op`
  void note_host_sync(std::int32_t op, double end_s);
  int owned_collectives_ = 0;
  std::uint64_t sequence_ = 0;
  std::priority_queue<DueEvent, std::vector<DueEvent>, std::greater<>> due_;
  std::vector<simgrid::s4u::ActivityPtr> waits_;
  std::vector<Waiting> waiting_;
  std::vector<simgrid::s4u::Mailbox*> inboxes_;  // per plan_.peer_stages
  std::vector<void*> inbox_payload_;
  simgrid::s4u::Mailbox* doorbell_ = nullptr;
  void* doorbell_payload_ = nullptr;
  simgrid::s4u::Mailbox* phases_ = nullptr;  // group, replica fidelity: helpers post instances whose phase ended
  void* phase_payload_ = nullptr;
  bool doorbell_pending_ = false;
  double wake_at_s_;  // when the current wait times out (infinity: only a message wakes it)
  double expert_scale_ = 1;  // Engine::expert_load_scale
  double compute_scale_ = 1;  // Engine::compute_scale
};

class Engine {
 public:
  Engine(const model::Program& program, const CostModel& cost, const SimOptions& options);
  ~Engine();
  SimResult run();  // once per process

  // Shared with the replayers.
  const model::Program& program() const { return program_; }
  const StagePlan& plan(int stage) const { return plans_[stage]; }
  Fidelity fidelity() const { return fidelity_; }
  const CommunicationModel& communication() const { return communication_; }
  const topology::Platform& platform() const { return *platform_; }
  Replayer& replayer(int id) { return *replayers_[id]; }
  simgrid::s4u::Host* host_of(int id) const;  // a replayer's host, or at replica fidelity a mirrored actor's
  int peer_replayer(const Replayer& from, int stage) const;  // same dp (and tp) on `stage`
  // A CP ring message's other end: the replayer of CP rank + 1 (Send) or - 1 (Recv) (model/context_parallel_ring).
  int ring_peer_replayer(const Replayer& from, const model::Op& op) const;
  bool replica() const { return replica_; }
  // Group and replica fidelity: the mailbox whose permanent receiver, an actor on `host`, takes every helper's flow to
  // that host (sim/replica.cpp says why flows go through mailboxes there); made on first use.
  simgrid::s4u::Mailbox* flow_inbox(simgrid::s4u::Host* host);
  double bytes_scale() const { return fidelity_ == Fidelity::Group ? program_.layout.tp() : 1.0; }
  // A replayer's expert rows over the hottest EP rank's (model.expert_load_skew); 1 at group fidelity, whose member
  // stands for ranks of several EP indices.
  double expert_load_scale(int id) const;
  // A replayer's compute time multiplier (sim/degraded.hpp): its rank's --slow-gpu factor, or at group fidelity the
  // slowest of its TP group's; 1 when none is slow.
  double compute_scale(int id) const;
  double p2p_latency_s(const Replayer& from, const Replayer& to) const;
  CollectiveInstance* collective(const Replayer& member, std::int32_t op);  // or a rendezvous Send/Recv pair
  void forget(CollectiveInstance* instance) { collectives_.erase(instance->key); }
  // settle(): the running actor drains itself and every replayer it touched, iteratively, and wakes those that
  // must act earlier than they planned. Any SimGrid call lets other actors run: running() is only valid in drains.
  Replayer& running() { return *running_; }
  void touch(Replayer& replayer);
  void settle(Replayer& running);
  void count_activity() { ++activities_; }
  void note_resolved();

 private:
  void build_plans();
  // sim/replica.cpp (replica fidelity): whether actor `id` replays its ops (DP index 0), the replayed actor it
  // mirrors, and the flows of a collective's mirror groups added to its plan.
  bool replayed(int id) const;
  int mirror_of(int id) const;
  const std::vector<std::vector<int>>& mirror_groups(model::Group group, const std::vector<int>& members);
  void add_mirror_flows(CollectiveInstance& instance, const model::Op& op);
  // sim/stage_plan.cpp
  StagePlan build_plan(int stage) const;
  std::vector<std::vector<std::int32_t>> exchange_dependencies(StagePlan& plan) const;  // extra predecessors
  struct GroupTiming {
    enum Kind { Single, InsideTensorGroup, Flows } kind[model::kGroupCount] = {};  // per model::Group
    std::vector<int> nodes[model::kGroupCount];  // the nodes of the group's members
  };
  GroupTiming group_timing(int stage) const;
  double expert_seconds(const model::Scenario& scenario, const model::Op& op) const;
  void time_ops(StagePlan& plan) const;
  void plan_recv(StagePlan& plan, std::int32_t op) const;
  void pace_host(StagePlan& plan) const;

  std::vector<int> group_members(model::Group group, int replayer) const;
  CollectiveInstance* point_to_point(const Replayer& member, std::int32_t op);
  // The flows and estimate of collective `op` among `members` (replayer ids), reached by `replayer`.
  CollectivePlan plan_of(const model::Op& op, const std::vector<int>& members, int replayer) const;
  double tensor_gather_s(double bytes) const;
  // What the receiver of a pipeline message does on its compute stream once the bytes are in: the TP all-gather of
  // a scattered tensor and the framework's copies around it (model::pipeline_transfer).
  double receipt_s(const model::PipelineTransfer& transfer) const;
  // Share of a GPU's SMs an NCCL collective inside the node holds while it runs (one block per channel).
  double collective_sm_share() const;
  int node_of(int replayer) const;
  int representative_rank(int replayer) const;
  void print_progress(bool final_line);
  void assign_group_slots(int replayers);  // group fidelity: each TP group's endpoint slot in its node
  void build_platform(topology::PlatformOptions options);
  // sim/degraded.cpp: the options' degradations checked against the Program and fidelity, and the links slowed.
  void check_degradations() const;
  void degrade_links();

  const model::Program& program_;
  const CostModel& cost_;
  SimOptions options_;
  Fidelity fidelity_;  // Group at replica fidelity, with replica_ set
  bool replica_ = false;
  std::unordered_map<std::uint64_t, std::vector<std::vector<int>>> mirror_groups_;  // (group, first member) -> groups
  std::unordered_map<const simgrid::s4u::Host*, simgrid::s4u::Mailbox*> flow_inboxes_;  // group, replica
  topology::NodeSpec node_;
  topology::FabricSpec fabric_;
  topology::Placement placement_;
  CommunicationModel communication_;
  std::unique_ptr<topology::Platform> platform_;
  std::vector<StagePlan> plans_;
  std::vector<std::unique_ptr<Replayer>> replayers_;
  std::unordered_map<std::uint64_t, std::unique_ptr<CollectiveInstance>> collectives_;
  std::vector<int> group_slot_;  // group fidelity: endpoint slot of each replayer in its node
  mutable std::unordered_map<double, double> gather_estimates_;  // TP all-gather of a pipeline tensor: bytes -> seconds
  Replayer* running_ = nullptr;
  std::vector<Replayer*> worklist_;
  std::int64_t activities_ = 0;
  std::int64_t resolved_ = 0;
  std::int64_t total_ops_ = 0;
  std::chrono::steady_clock::time_point started_;
  double last_progress_s_ = 0;
  bool progress_printed_ = false;
  bool progress_on_terminal_ = false;
  std::string error_;  // the first error an actor threw
};

}  // namespace twin::sim::detail
