// The engine: builds the platform and one replayer per rank (or TP group), runs SimGrid, collects the Timeline.
#include "sim/engine.hpp"
#include "sim/all_to_all.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <simgrid/s4u.hpp>

#include "model/ops/context_parallel_ring.hpp"

namespace twin::sim::detail {

namespace sg4 = simgrid::s4u;

std::uint64_t p2p_key(int from_stage, const model::P2PTag& tag) {
  return static_cast<std::uint64_t>(from_stage) << 32 | model::p2p_tag_key(tag);
}

namespace {

topology::NodeSpec node_of_options(const model::Program& program, const SimOptions& options) {
  return options.node ? *options.node : topology::node_spec(program.scenario.cluster);
}

}  // namespace

Engine::Engine(const model::Program& program, const CostModel& cost, const SimOptions& options)
    : program_(program),
      cost_(cost),
      options_(options),
      fidelity_(choose_fidelity(program, options)),
      replica_(fidelity_ == Fidelity::Replica),
      node_(node_of_options(program, options)),
      fabric_(options.fabric ? *options.fabric : topology::fabric_spec(program.scenario.cluster)),
      placement_(program.layout, node_.gpus, options.placement) {
  communication_.node = node_;
  communication_.ideal = options.ideal_network;
  if (replica_) fidelity_ = Fidelity::Group;  // the replayed actors are group fidelity's
}

Engine::~Engine() = default;

int Engine::representative_rank(int replayer) const {
  if (fidelity_ == Fidelity::Rank) return replayer;
  return replayer * program_.layout.tp();  // tp = 0 of the group: rank = tp + TP * (cp + CP * (dp + DP * pp))
}

int Engine::node_of(int replayer) const {
  return placement_.node_of_rank(representative_rank(replayer));
}

int Engine::peer_replayer(const Replayer& from, int stage) const {
  const int rank = program_.layout.rank_on_stage(representative_rank(from.id()), stage);
  return fidelity_ == Fidelity::Rank ? rank : rank / program_.layout.tp();
}

int Engine::ring_peer_replayer(const Replayer& from, const model::Op& op) const {
  const std::vector<int> ring = group_members(model::Group::Context, from.id());
  const auto me = static_cast<int>(std::find(ring.begin(), ring.end(), from.id()) - ring.begin());
  return ring[static_cast<std::size_t>(model::cp_ring_peer(op, me, static_cast<int>(ring.size())))];
}

double Engine::p2p_latency_s(const Replayer& from, const Replayer& to) const {
  if (communication_.ideal) return 0;
  return communication_.p2p_latency_s(node_of(from.id()) != node_of(to.id())) +
         platform_->route_latency_s(from.host(), to.host());
}

std::vector<int> Engine::group_members(model::Group group, int replayer) const {
  const std::vector<int> ranks = program_.layout.group_members(group, representative_rank(replayer));
  if (fidelity_ == Fidelity::Rank) return ranks;
  std::vector<int> groups;
  for (int rank : ranks) {
    if (program_.layout.coord_of(rank).tp == 0) groups.push_back(rank / program_.layout.tp());
  }
  return groups;
}

namespace {

// framework.tp_comm_overlap: a collective that ran beside a GEMM of `gemm_s` has only what the GEMM did not hide
// left once the GEMM is done (exposed_beside_gemm_s, with the SMs its blocks took from the GEMM); its flows carry
// that share of the bytes (the NVLinks it uses carry nothing else), so that the replay stays behind the simulated
// clock at every fidelity.
void hide_under_gemm(CollectivePlan& plan, double gemm_s, double sm_share) {
  if (gemm_s <= 0) return;
  const double left_s = exposed_beside_gemm_s(plan.estimate_s, gemm_s, sm_share);
  if (left_s <= 0) {
    plan.phases.clear();
    plan.estimate_s = 0;
    return;
  }
  double latency_s = 0;
  for (const FlowPhase& phase : plan.phases) latency_s += phase.latency_s;
  const double transfer_s = plan.estimate_s - latency_s;
  const double keep = transfer_s > 0 ? std::max(0.0, left_s - latency_s) / transfer_s : 0;
  for (FlowPhase& phase : plan.phases) {
    for (Flow& flow : phase.flows) flow.bytes *= keep;
    phase.min_s *= keep;  // bytes timed without flows: the same share left
    if (keep <= 0) phase.flows.clear();  // latency only: no zero-byte flows
    if (left_s < latency_s) phase.latency_s *= left_s / latency_s;
  }
  plan.estimate_s = left_s;
}

}  // namespace

double Engine::collective_sm_share() const {
  const topology::NodeSpec& node = communication_.node;
  return node.gpu.sm_count > 0 ? static_cast<double>(node.nccl_nvlink_channels) / node.gpu.sm_count : 0.0;
}

double Engine::tensor_gather_s(double bytes) const {
  auto [it, created] = gather_estimates_.try_emplace(bytes, 0.0);
  if (created && program_.layout.tp() > 1) {
    // The TP group shares a node (Megatron's placement): NCCL's all-gather on NVLink, as for TP collectives.
    const std::vector<int> one_node(static_cast<std::size_t>(program_.layout.tp()), 0);
    it->second = plan_collective(model::CollectiveKind::AllGather, bytes, one_node, communication_, options_.algorithm)
                     .estimate_s;
  }
  return it->second;
}

double Engine::receipt_s(const model::PipelineTransfer& transfer) const {
  const double gather = transfer.receipt_gathers * tensor_gather_s(transfer.full_bytes);
  return gather + cost_.memory_copy_s(transfer.receipt_copy_bytes, transfer.receipt_copy_kernels);
}

// A blocking Send/Recv pair (model/ops/exchanges.hpp) as a two-member instance: sender and receiver register when they
// post; the transfer starts once both have; the receiver then all-gathers a scattered tensor across its TP group.
CollectiveInstance* Engine::point_to_point(const Replayer& member, std::int32_t op) {
  const model::Op& o = program_.stage_ops[member.stage()][op];
  const bool sending = o.kind == model::OpKind::Send;
  const bool ring = model::is_cp_ring_message(o);
  const int peer = ring ? ring_peer_replayer(member, o) : peer_replayer(member, o.peer_stage);
  const int sender = sending ? member.id() : peer, receiver = sending ? peer : member.id();
  // Bit 63 marks point-to-point keys (collective keys use bits 60-61 for their group); the message's tag key is
  // under 2^30 (bit 31 marks a CP ring's) and a replayer id under 2^31.
  const std::uint64_t tag = ring ? std::uint64_t{1} << 31 | model::cp_ring_tag_key(model::cp_ring_tag(o))
                                 : model::p2p_tag_key(model::p2p_tag(o));
  const std::uint64_t key = (std::uint64_t{1} << 63) | static_cast<std::uint64_t>(sender) << 32 | tag;
  auto [it, created] = collectives_.try_emplace(key);
  if (created) {
    auto instance = std::make_unique<CollectiveInstance>();
    instance->key = key;
    instance->members = {sender, receiver};
    instance->expected = 2;
    instance->member_op.assign(2, -1);
    instance->arrival_s.assign(2, 0.0);
    instance->extra_s.assign(2, 0.0);
    instance->plan.algorithm = CollectiveAlgorithm::Ring;
    if (ring && !communication_.ideal) {  // one message of the op's bytes, on NVLink or the fabric as placed
      FlowPhase phase;
      if (o.bytes > 0) phase.flows.push_back({0, 1, o.bytes * bytes_scale()});
      phase.latency_s = p2p_latency_s(*replayers_[sender], *replayers_[receiver]);
      instance->plan.phases.push_back(std::move(phase));
    } else if (!communication_.ideal) {
      const model::PipelineTransfer transfer = model::pipeline_transfer(program_.scenario, o);
      FlowPhase phase;
      if (transfer.wire_bytes > 0) phase.flows.push_back({0, 1, transfer.wire_bytes * bytes_scale()});
      phase.latency_s = transfer.messages * p2p_latency_s(*replayers_[sender], *replayers_[receiver]);
      instance->plan.phases.push_back(std::move(phase));
      instance->extra_s[1] = receipt_s(transfer);
    }
    it->second = std::move(instance);
  }
  return it->second.get();
}

CollectivePlan Engine::plan_of(const model::Op& op, const std::vector<int>& members, int replayer) const {
  std::vector<int> nodes;
  for (int m : members) nodes.push_back(node_of(m));
  if (fidelity_ != Fidelity::Group || op.collective != model::CollectiveKind::AllToAll) {
    return plan_op_collective(op, nodes, communication_, options_.algorithm, bytes_scale());
  }
  // Group fidelity: an all-to-all's NVLink bytes timed, its bytes across nodes flowed per node pair; by its ranks'
  // own bytes where an actor stands for several of them.
  const std::vector<int> ranks = program_.layout.group_members(op.group, representative_rank(replayer));
  std::vector<int> rank_nodes, actor_of_rank;
  for (int rank : ranks) {
    const auto it = std::find(members.begin(), members.end(), rank / program_.layout.tp());
    if (ranks.size() == members.size() || it == members.end()) {
      return plan_op_collective(op, nodes, communication_, options_.algorithm, bytes_scale(),
                                AllToAllFlows::PerNodePair);
    }
    rank_nodes.push_back(placement_.node_of_rank(rank));
    actor_of_rank.push_back(static_cast<int>(it - members.begin()));
  }
  return plan_all_to_all_of_actors(op, rank_nodes, actor_of_rank, nodes, communication_);
}

CollectiveInstance* Engine::collective(const Replayer& member, std::int32_t op) {
  const model::Op& o = program_.stage_ops[member.stage()][op];
  if (o.kind == model::OpKind::Send || o.kind == model::OpKind::Recv) return point_to_point(member, op);
  std::vector<int> members = group_members(o.group, member.id());
  const std::uint64_t key = (static_cast<std::uint64_t>(o.group) << 60) |
                            (static_cast<std::uint64_t>(members.front()) << 32) |
                            static_cast<std::uint64_t>(plans_[member.stage()].collective_seq[op]);
  auto [it, created] = collectives_.try_emplace(key);
  if (created) {
    auto instance = std::make_unique<CollectiveInstance>();
    instance->key = key;
    instance->plan = plan_of(o, members, member.id());
    instance->members = members;
    instance->expected = static_cast<int>(members.size());
    if (replica_) {
      instance->expected =
          static_cast<int>(std::count_if(members.begin(), members.end(), [this](int id) { return replayed(id); }));
      add_mirror_flows(*instance, o);
    }
    hide_under_gemm(instance->plan, plans_[member.stage()].lead[op], collective_sm_share());
    instance->member_op.assign(members.size(), -1);
    instance->arrival_s.assign(members.size(), 0.0);
    instance->extra_s.assign(members.size(), 0.0);
    it->second = std::move(instance);
  }
  return it->second.get();
}

void Engine::touch(Replayer& replayer) {
  if (replayer.queued) return;
  replayer.queued = true;
  worklist_.push_back(&replayer);
}

void Engine::settle(Replayer& running) {
  // Iterative, not recursive: resolving one member's op may complete another collective, and so on. Draining makes
  // no SimGrid call, so no other actor runs meanwhile; ringing does (any simcall lets the others run), hence the
  // local copy.
  running_ = &running;
  touch(running);
  std::vector<Replayer*> touched;
  while (!worklist_.empty()) {
    Replayer* replayer = worklist_.back();
    worklist_.pop_back();
    replayer->queued = false;
    replayer->drain();
    if (std::find(touched.begin(), touched.end(), replayer) == touched.end()) touched.push_back(replayer);
  }
  for (Replayer* replayer : touched) {
    if (replayer != &running && replayer->needs_wake()) replayer->ring();
  }
}

void Engine::build_plans() {
  if (program_.stage_exchanges.size() != program_.stage_ops.size()) {
    throw SimulationError(fmt::format("the Program lists the pipeline exchanges of {} of its {} stages",
                                      program_.stage_exchanges.size(), program_.stage_ops.size()));
  }
  plans_.clear();
  for (int stage = 0; stage < program_.stages(); ++stage) plans_.push_back(build_plan(stage));
}

void Engine::note_resolved() {
  ++resolved_;
  if (!options_.progress || (resolved_ & 0x3FFF) != 0) return;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  // On a terminal the line is redrawn in place twice a second; in a log, a line of its own every ten seconds.
  const double interval_s = progress_on_terminal_ ? 0.5 : 10.0;
  if (wall > 2.0 && wall - last_progress_s_ >= interval_s) {
    last_progress_s_ = wall;
    print_progress(false);
  }
}

void Engine::print_progress(bool final_line) {
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  fmt::print(stderr, "{}[twin sim] {:5.1f}% of {} ops replayed, simulated clock {:.3f} s, {:.1f} s wall{}",
             progress_on_terminal_ ? "\r" : "",
             100.0 * static_cast<double>(resolved_) / static_cast<double>(std::max<std::int64_t>(1, total_ops_)),
             total_ops_, sg4::Engine::get_clock(), wall, final_line || !progress_on_terminal_ ? "\n" : "");
  std::fflush(stderr);
  progress_printed_ = true;
}

// Hundreds of thousands of hosts take SimGrid seconds to build (topology/platform.hpp): say so up front, then how far
// it is, and what it took.
void Engine::build_platform(topology::PlatformOptions options) {
  const int nodes = options.nodes;
  const double estimate_s = topology::estimated_build_seconds(nodes, topology::hosts_per_node(options));
  if (options_.progress && estimate_s > 10) {
    fmt::print(stderr,
               "[twin sim] building the platform of {} nodes ({} GPUs) in SimGrid: about {} on a 2-core machine (it "
               "grows with the hosts; bench/sim/platform_build.sh measures it), then the replay\n",
               nodes, static_cast<long long>(nodes) * node_.gpus,
               estimate_s >= 3600  ? fmt::format("{:.1f} h", estimate_s / 3600)
               : estimate_s >= 120 ? fmt::format("{:.0f} min", estimate_s / 60)
                                   : fmt::format("{:.0f} s", estimate_s));
    progress_printed_ = true;
  }
  const auto wall = [this] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  };
  if (options_.progress) {
    options.on_node = [this, nodes, wall](int built) {
      const double now = wall();
      if (now <= 2.0 || now - last_progress_s_ < (progress_on_terminal_ ? 0.5 : 10.0)) return;
      last_progress_s_ = now;
      progress_printed_ = true;
      fmt::print(stderr, "{}[twin sim] building the platform: {} of {} nodes, {:.1f} s wall{}",
                 progress_on_terminal_ ? "\r" : "", built, nodes, now, progress_on_terminal_ ? "" : "\n");
      std::fflush(stderr);
    };
  }
  platform_ = std::make_unique<topology::Platform>(options);
  if (options_.progress && (wall() > 2.0 || nodes >= 1000)) {
    fmt::print(stderr, "{}[twin sim] platform of {} nodes built in {:.1f} s\n", progress_on_terminal_ ? "\r" : "",
               nodes, wall());
    progress_printed_ = true;
  }
}

void Engine::assign_group_slots(int replayers) {
  // Endpoint slots: the TP groups of a node in the order of their first GPU.
  std::map<int, std::vector<std::pair<int, int>>> groups_of_node;
  for (int g = 0; g < replayers; ++g) {
    int first_local = node_.gpus;
    for (int rank : program_.layout.group_members(model::Group::Tensor, representative_rank(g))) {
      first_local = std::min(first_local, placement_.local_index_of_rank(rank));
    }
    groups_of_node[node_of(g)].emplace_back(first_local, g);
  }
  group_slot_.assign(replayers, 0);
  for (auto& [node, groups] : groups_of_node) {
    std::sort(groups.begin(), groups.end());
    for (std::size_t slot = 0; slot < groups.size(); ++slot)
      group_slot_[groups[slot].second] = static_cast<int>(slot);
  }
}

SimResult Engine::run() {
  started_ = std::chrono::steady_clock::now();
  progress_on_terminal_ = isatty(STDERR_FILENO) != 0;
  const model::RankLayout& layout = program_.layout;
  if (program_.scenario.cluster.gpus_per_node != node_.gpus) {
    throw SimulationError(fmt::format("cluster.gpus_per_node = {} but a {} has {} GPUs",
                                      program_.scenario.cluster.gpus_per_node, node_.name, node_.gpus));
  }
  // SimGrid: one engine per process; small actor stacks (our actors never recurse: they ran identically on 64 KiB,
  // docs/simulator.md), no chatter. No guard page under each stack: protecting it is an mprotect per actor made, and
  // replica fidelity makes an actor per 64 flows (DeepSeek-V3 on 1,024 H100: 68.7 s wall with the guard pages, 51 s
  // without, the same iteration time). A deadlocked Program is reported by us (below), not by SimGrid's own message.
  std::vector<std::string> args{"twin-sim", "--cfg=contexts/stack-size:256", "--cfg=contexts/guard-size:0",
                                "--log=root.thres:critical",
                                "--log=ker_engine.add:off", "--log=ker_engine.app:file:/dev/null"};
  for (std::string& option : topology::sanitizer_engine_options()) args.push_back(std::move(option));
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  int argc = static_cast<int>(args.size());
  sg4::Engine engine(&argc, argv.data());
  topology::configure_flow_model();
  topology::PlatformOptions platform_options;
  platform_options.nodes = std::max<int>(static_cast<int>(program_.scenario.cluster.nodes), placement_.nodes());
  platform_options.node = node_;
  platform_options.fabric = fabric_;
  platform_options.group_size = fidelity_ == Fidelity::Group ? layout.tp() : 0;
  platform_options.gpu_hosts = fidelity_ == Fidelity::Rank;
  check_degradations();
  build_platform(platform_options);
  build_plans();

  std::set<int> recorded(options_.record_ranks.begin(), options_.record_ranks.end());
  for (int stage = 0; stage < layout.pp(); ++stage) recorded.insert(layout.rank_of({0, stage, 0}));
  const int replayers = fidelity_ == Fidelity::Rank ? layout.world_size() : layout.world_size() / layout.tp();
  if (fidelity_ == Fidelity::Group) assign_group_slots(replayers);
  degrade_links();
  int replaying = 0;
  for (int id = 0; id < replayers; ++id) {
    if (replica_ && !replayed(id)) {
      replayers_.push_back(nullptr);  // mirrors a replayed actor (sim/replica.cpp)
      continue;
    }
    ++replaying;
    const int rank = representative_rank(id);
    const int stage = layout.coord_of(rank).pp;
    bool record = false;
    sg4::Host* host = nullptr;
    if (fidelity_ == Fidelity::Rank) {
      record = recorded.count(rank) > 0;
      host = platform_->gpu(placement_.gpu_of(rank));
    } else {
      for (int member : layout.group_members(model::Group::Tensor, rank)) record |= recorded.count(member) > 0;
      for (int other : recorded) record |= replica_ && mirror_of(other / layout.tp()) == id;  // it stands for them
      host = platform_->group_endpoint(node_of(id), group_slot_[id]);
    }
    replayers_.push_back(std::make_unique<Replayer>(*this, id, stage, host, record));
    total_ops_ += static_cast<std::int64_t>(program_.stage_ops[stage].size());
  }
  for (auto& replayer : replayers_) {
    Replayer* r = replayer.get();
    if (r == nullptr) continue;
    sg4::Actor::create(fmt::format("{}{}", fidelity_ == Fidelity::Rank ? "rank" : "group", r->id()), r->host(),
                       [this, r] {
                         try {
                           r->run();
                         } catch (const std::exception& error) {  // the others then deadlock; report this first
                           if (error_.empty()) error_ = error.what();
                         }
                       });
  }
  engine.run();
  if (progress_printed_) print_progress(true);
  if (!error_.empty()) throw SimulationError(error_);

  for (const auto& replayer : replayers_) {
    if (replayer && !replayer->finished()) {
      throw SimulationError("the replay deadlocked: " + replayer->describe_unfinished());
    }
  }

  SimResult result;
  result.fidelity = replica_ ? Fidelity::Replica : fidelity_;
  result.hardware =
      fmt::format("{} ({}), {}{}{}", node_.name, node_.gpu.name, fabric_.name,
                  fabric_.oversubscription > 1 ? fmt::format(", {:g}:1 oversubscribed", fabric_.oversubscription) : "",
                  fabric_.rail_optimized ? ", rail-optimized" : "");
  result.peak_flops_per_gpu = node_.gpu.peak_flops(program_.scenario.model.dtype);
  result.gpu_memory_bytes = node_.gpu.hbm_bytes;
  result.timeline.engine = "sim";
  for (const auto& replayer : replayers_) {
    if (!replayer) continue;  // replica fidelity: a mirror
    result.timeline.iteration_time_s = std::max(result.timeline.iteration_time_s, replayer->latest_end_s());
  }
  for (int rank : recorded) {
    const int group = rank / layout.tp();
    const int id = fidelity_ == Fidelity::Rank ? rank : replica_ ? mirror_of(group) : group;
    const Replayer& replayer = *replayers_[id];
    report::RankTimeline timeline;
    timeline.rank = rank;
    timeline.stage = replayer.stage();
    const std::size_t ops = replayer.starts().size();
    timeline.spans.reserve(ops);
    for (std::size_t op = 0; op < ops; ++op) {
      timeline.spans.push_back(
          {static_cast<std::int32_t>(op), replayer.starts()[op], replayer.actives()[op], replayer.ends()[op]});
    }
    result.timeline.ranks.push_back(std::move(timeline));
  }
  result.stats.activities = activities_;
  result.stats.ops = resolved_;
  result.stats.rank_ops = static_cast<std::int64_t>(program_.total_ops());
  result.stats.actors = replaying;
  result.stats.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  return result;
}

}  // namespace twin::sim::detail
