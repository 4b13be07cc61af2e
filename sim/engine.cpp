// The engine: builds the platform and one replayer per rank (or TP group), runs SimGrid, collects the Timeline.
#include "sim/engine.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <simgrid/s4u.hpp>

#include "sim/framework.hpp"

namespace twin::sim::detail {

namespace sg4 = simgrid::s4u;

std::uint64_t p2p_key(int from_stage, const model::P2PTag& tag) {
  return (static_cast<std::uint64_t>(from_stage) << 44) ^ (static_cast<std::uint64_t>(tag.sender_virtual_stage) << 28) ^
         (static_cast<std::uint64_t>(tag.micro_batch) << 4) ^ static_cast<std::uint64_t>(tag.phase);
}

namespace {

topology::NodeSpec node_of_options(const model::Program& program, const SimOptions& options) {
  return options.node ? *options.node : topology::node_spec(program.scenario.cluster);
}

bool ordered(model::Stream stream) {
  return stream != model::Stream::Pipeline;
}

}  // namespace

Engine::Engine(const model::Program& program, const CostModel& cost, const SimOptions& options)
    : program_(program),
      cost_(cost),
      options_(options),
      fidelity_(choose_fidelity(program, options)),
      node_(node_of_options(program, options)),
      fabric_(options.fabric ? *options.fabric : topology::fabric_spec(program.scenario.cluster)),
      placement_(program.layout, node_.gpus, options.placement) {
  communication_.node = node_;
  communication_.ideal = options.ideal_network;
}

Engine::~Engine() = default;

int Engine::representative_rank(int replayer) const {
  if (fidelity_ == Fidelity::Rank) return replayer;
  return replayer * program_.layout.tp();  // tp = 0 of the group: rank = tp + TP * (dp + DP * pp)
}

int Engine::node_of(int replayer) const {
  return placement_.node_of_rank(representative_rank(replayer));
}

int Engine::peer_replayer(const Replayer& from, int stage) const {
  const model::RankCoord coord = program_.layout.coord_of(representative_rank(from.id()));
  const int rank = program_.layout.rank_of({coord.dp, stage, coord.tp});
  return fidelity_ == Fidelity::Rank ? rank : rank / program_.layout.tp();
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

double Engine::receipt_s(const PipelineTransfer& transfer) const {
  const double gather = transfer.receipt_gathers * tensor_gather_s(transfer.full_bytes);
  return gather + cost_.memory_copy_s(transfer.receipt_copy_bytes, transfer.receipt_copy_kernels);
}

// A blocking Send/Recv pair (sim/framework.hpp) as a two-member instance: sender and receiver register when they
// post; the transfer starts once both have; the receiver then all-gathers a scattered tensor across its TP group.
CollectiveInstance* Engine::point_to_point(const Replayer& member, std::int32_t op) {
  const model::Op& o = program_.stage_ops[member.stage()][op];
  const bool sending = o.kind == model::OpKind::Send;
  const int peer = peer_replayer(member, o.peer_stage);
  const int sender = sending ? member.id() : peer, receiver = sending ? peer : member.id();
  const model::P2PTag tag = model::p2p_tag(o);
  // Bit 63 marks point-to-point keys (collective keys use bits 60-61 for their group).
  const std::uint64_t key = (std::uint64_t{1} << 63) | (static_cast<std::uint64_t>(sender & 0xFFFFF) << 40) |
                            (static_cast<std::uint64_t>(tag.micro_batch & 0xFFFFFF) << 16) |
                            (static_cast<std::uint64_t>(tag.sender_virtual_stage & 0x3FFF) << 2) |
                            static_cast<std::uint64_t>(tag.phase);
  auto [it, created] = collectives_.try_emplace(key);
  if (created) {
    auto instance = std::make_unique<CollectiveInstance>();
    instance->key = key;
    instance->members = {sender, receiver};
    instance->member_op.assign(2, -1);
    instance->arrival_s.assign(2, 0.0);
    instance->extra_s.assign(2, 0.0);
    instance->plan.algorithm = CollectiveAlgorithm::Ring;
    if (!communication_.ideal) {
      const PipelineTransfer transfer = pipeline_transfer(program_.scenario, o);
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
    std::vector<int> nodes;
    for (int m : members) nodes.push_back(node_of(m));
    instance->plan = plan_collective(o.collective, o.bytes, nodes, communication_, options_.algorithm, bytes_scale());
    hide_under_gemm(instance->plan, plans_[member.stage()].lead[op], collective_sm_share());
    instance->member_op.assign(members.size(), -1);
    instance->arrival_s.assign(members.size(), 0.0);
    instance->extra_s.assign(members.size(), 0.0);
    instance->members = std::move(members);
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

StagePlan Engine::build_plan(int stage) const {
  const model::Scenario& scenario = program_.scenario;
  const std::vector<model::Op>& ops = program_.stage_ops[stage];
  const auto n = static_cast<std::int32_t>(ops.size());
  StagePlan plan;
  plan.stage = stage;
  plan.ops = &ops;
  plan.duration.assign(n, 0.0);
  plan.local.assign(n, 0);
  plan.rendezvous.assign(n, 0);
  plan.lead.assign(n, 0.0);
  plan.receipt_s.assign(n, 0.0);
  plan.pending.assign(n, 0);
  plan.collective_seq.assign(n, -1);
  plan.recv_slot.assign(n, -1);

  // How each group's collectives are timed on this stage (the same for every op of the stage).
  enum class GroupKind { Single, InsideTensorGroup, Flows };
  GroupKind group_kind[4];
  std::vector<int> group_nodes[4];
  const int rank0 = program_.layout.rank_of({0, stage, 0});
  for (int group = 0; group < 4; ++group) {
    const std::vector<int> ranks = program_.layout.group_members(static_cast<model::Group>(group), rank0);
    for (int rank : ranks) group_nodes[group].push_back(placement_.node_of_rank(rank));
    if (ranks.size() <= 1) {
      group_kind[group] = GroupKind::Single;
    } else if (fidelity_ == Fidelity::Group &&
               group_members(static_cast<model::Group>(group), rank0 / program_.layout.tp()).size() <= 1) {
      group_kind[group] = GroupKind::InsideTensorGroup;
    } else {
      group_kind[group] = GroupKind::Flows;
    }
  }
  std::map<std::tuple<int, int, double>, double> estimates;

  // Blocking pipeline exchanges (sim/framework.hpp): the compute op after the Send/Recv ops that separate it from
  // the previous compute op waits for all of them. With 1F1B and GPipe they also rendezvous: they are posted when
  // the previous compute op ends (serialized exchanges: one after the other, in the framework's order) and a
  // transfer starts once both sides have posted. The interleaved schedule's Program order pairs sends and receives
  // differently from Megatron's combined calls, so there its messages leave eagerly (a send still blocks its sender
  // until the bytes have arrived).
  const bool blocking = options_.blocking_p2p;
  const bool rendezvous = blocking && scenario.parallel.schedule != model::ScheduleKind::Interleaved;
  std::vector<std::vector<std::int32_t>> extra(n);
  if (blocking) {
    std::int32_t last_compute = -1;
    std::vector<std::int32_t> exchange;
    const bool serialized = serialized_exchanges(scenario);
    const auto close = [&](std::int32_t next_compute) {
      if (exchange.empty()) return;
      const std::vector<std::int32_t> order = exchange_order(scenario, ops, exchange, stage);
      for (std::size_t k = 0; k < order.size(); ++k) {
        if (rendezvous && last_compute >= 0) extra[order[k]].push_back(last_compute);
        if (rendezvous && serialized && k > 0) extra[order[k]].push_back(order[k - 1]);
        if (next_compute >= 0) extra[next_compute].push_back(order[k]);
      }
      exchange.clear();
    };
    for (std::int32_t i = 0; i < n; ++i) {
      if (ops[i].stream == model::Stream::Pipeline) {
        exchange.push_back(i);
        plan.rendezvous[i] = rendezvous ? 1 : 0;
      } else if (ops[i].stream == model::Stream::Compute) {
        close(i);
        last_compute = i;
      }
    }
    close(-1);
  }
  // framework.tp_comm_overlap: how long a backward TP collective can hide under the GEMM half beside it.
  std::map<std::pair<int, int>, double> hidden;
  const auto lead_of = [&](const model::Op& op) {
    const HiddenUnder under = tp_overlap(scenario, op);
    if (under == HiddenUnder::Nothing) return 0.0;
    const auto key = std::make_pair(static_cast<int>(op.what), static_cast<int>(under));
    auto [it, created] = hidden.try_emplace(key, 0.0);
    if (created) it->second = cost_.gemm_half_s(scenario, op.what, under == HiddenUnder::WeightGradient);
    return it->second;
  };

  // Predecessors: deps plus the previous op of the same ordered stream (plus the exchange rules above).
  std::vector<std::int32_t> predecessor_begin(n + 1, 0), predecessors;
  std::int32_t last_on_stream[3] = {-1, -1, -1};
  int collectives_seen[4] = {0, 0, 0, 0};
  for (std::int32_t i = 0; i < n; ++i) {
    const model::Op& op = ops[i];
    const std::size_t first = predecessors.size();
    for (std::int32_t dep : op.deps) {
      if (dep < 0 || dep >= i) {
        throw SimulationError(fmt::format("stage {} op {}: dependency {} is not an earlier op", stage, i, dep));
      }
      predecessors.push_back(dep);
    }
    for (std::int32_t before : extra[i]) predecessors.push_back(before);
    const auto stream = static_cast<int>(op.stream);
    if (ordered(op.stream) && last_on_stream[stream] >= 0) predecessors.push_back(last_on_stream[stream]);
    std::sort(predecessors.begin() + static_cast<std::ptrdiff_t>(first), predecessors.end());
    predecessors.erase(std::unique(predecessors.begin() + static_cast<std::ptrdiff_t>(first), predecessors.end()),
                       predecessors.end());
    predecessor_begin[i + 1] = static_cast<std::int32_t>(predecessors.size());
    if (ordered(op.stream)) last_on_stream[stream] = i;
    plan.pending[i] = predecessor_begin[i + 1] - predecessor_begin[i];

    switch (op.kind) {
      case model::OpKind::Compute:
        plan.local[i] = 1;
        plan.duration[i] = cost_.compute_time_s(scenario, op);
        break;
      case model::OpKind::Collective: {
        const auto group = static_cast<int>(op.group);
        plan.collective_seq[i] = collectives_seen[group]++;
        plan.lead[i] = lead_of(op);
        if (group_kind[group] == GroupKind::Single) {
          plan.local[i] = 1;  // a group of one: nothing to do
        } else if (group_kind[group] == GroupKind::InsideTensorGroup) {
          // All members in one TP group (TP collectives, or any group when dp = pp = 1): inside one node, on NVLinks
          // nothing else uses, so NCCL's time without flows.
          plan.local[i] = 1;
          const auto key = std::make_tuple(group, static_cast<int>(op.collective), op.bytes);
          auto [it, created] = estimates.try_emplace(key, 0.0);
          if (created) {
            it->second =
                plan_collective(op.collective, op.bytes, group_nodes[group], communication_, options_.algorithm)
                    .estimate_s;
          }
          // Only what the GEMM does not hide, and the SMs the collective took from it.
          plan.duration[i] = exposed_beside_gemm_s(it->second, plan.lead[i], collective_sm_share());
        }
        break;
      }
      case model::OpKind::Recv: {
        const int from = op.peer_stage;
        if (!plan.recv_by_tag.emplace(p2p_key(from, model::p2p_tag(op)), i).second) {
          throw SimulationError(fmt::format("stage {}: two Recv ops share the tag of op {}", stage, i));
        }
        if (rendezvous) break;  // matched as a two-member instance, not through an inbox
        plan.pending[i] += 1;   // the eager message itself
        if (!communication_.ideal) {
          plan.receipt_s[i] = receipt_s(pipeline_transfer(scenario, op));
        }
        plan.recv_slot[i] = plan.recv_count++;
        if (std::find(plan.peer_stages.begin(), plan.peer_stages.end(), from) == plan.peer_stages.end()) {
          plan.peer_stages.push_back(from);
        }
        break;
      }
      case model::OpKind::Send:
        break;
    }
  }
  // The host issues the ops in list order (model/program.hpp), without waiting for the GPU. A compute op waits for
  // its kernels' launches; a collective or a message is one call, whose time delays the ops after it (the GPU reaches
  // it only after the compute op before it, which the host issued first).
  plan.issue_first_s.assign(n, 0.0);
  plan.issue_last_s.assign(n, 0.0);
  plan.last_kernel_s.assign(n, 0.0);
  double issued_s = 0;
  for (std::int32_t i = 0; i < n; ++i) {
    const HostCost host = cost_.host_cost(scenario, ops[i]);
    plan.issue_first_s[i] = plan.issue_last_s[i] = issued_s;
    if (host.seconds <= 0) continue;
    plan.host_paced = true;
    if (ops[i].kind == model::OpKind::Compute) {
      const int kernels = std::max(1, host.kernels);
      plan.issue_first_s[i] = issued_s + host.seconds / kernels;
      plan.issue_last_s[i] = issued_s + host.seconds;
      plan.last_kernel_s[i] = plan.duration[i] / kernels;
    }
    issued_s += host.seconds;
  }
  if (!plan.host_paced) {  // a host that is never behind: nothing to look up while replaying
    plan.issue_first_s = {};
    plan.issue_last_s = {};
    plan.last_kernel_s = {};
  }
  // Successors (CSR).
  plan.successor_begin.assign(n + 1, 0);
  for (std::int32_t p : predecessors) ++plan.successor_begin[p + 1];
  for (std::int32_t i = 0; i < n; ++i) plan.successor_begin[i + 1] += plan.successor_begin[i];
  plan.successors.assign(predecessors.size(), 0);
  std::vector<std::int32_t> fill(plan.successor_begin.begin(), plan.successor_begin.end() - 1);
  for (std::int32_t i = 0; i < n; ++i) {
    for (std::int32_t k = predecessor_begin[i]; k < predecessor_begin[i + 1]; ++k) {
      plan.successors[fill[predecessors[k]]++] = i;
    }
  }
  return plan;
}

void Engine::build_plans() {
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

// Thousands of nodes take SimGrid minutes to build (topology/platform.hpp): say so up front, then how far it is.
void Engine::build_platform(topology::PlatformOptions options) {
  const int nodes = options.nodes;
  const double estimate_s = topology::estimated_build_seconds(nodes);
  if (options_.progress && estimate_s > 10) {
    fmt::print(stderr,
               "[twin sim] building the platform of {} nodes ({} GPUs) in SimGrid: about {} on a 2-core machine (it "
               "grows with the square of the nodes; bench/sim/platform_build.sh measures it), then the replay\n",
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
  if (options_.progress && wall() > 2.0) {
    fmt::print(stderr, "{}[twin sim] platform of {} nodes built in {:.1f} s\n", progress_on_terminal_ ? "\r" : "",
               nodes, wall());
    progress_printed_ = true;
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
  // SimGrid: one engine per process; small actor stacks (our actors never recurse), no chatter.
  // A deadlocked Program is reported by us (below), not by SimGrid's own message.
  std::vector<std::string> args{"twin-sim", "--cfg=contexts/stack-size:256", "--log=root.thres:critical",
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
  build_platform(platform_options);
  build_plans();

  std::set<int> recorded(options_.record_ranks.begin(), options_.record_ranks.end());
  for (int stage = 0; stage < layout.pp(); ++stage) recorded.insert(layout.rank_of({0, stage, 0}));
  const int replayers = fidelity_ == Fidelity::Rank ? layout.world_size() : layout.dp() * layout.pp();
  if (fidelity_ == Fidelity::Group) {
    // Endpoint slots: the TP groups of a node in the order of their first GPU.
    std::map<int, std::vector<std::pair<int, int>>> groups_of_node;
    for (int g = 0; g < replayers; ++g) {
      int first_local = node_.gpus;
      for (int rank : layout.group_members(model::Group::Tensor, representative_rank(g))) {
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
  for (int id = 0; id < replayers; ++id) {
    const int rank = representative_rank(id);
    const int stage = layout.coord_of(rank).pp;
    bool record = false;
    sg4::Host* host = nullptr;
    if (fidelity_ == Fidelity::Rank) {
      record = recorded.count(rank) > 0;
      host = platform_->gpu(placement_.gpu_of(rank));
    } else {
      for (int member : layout.group_members(model::Group::Tensor, rank)) record |= recorded.count(member) > 0;
      host = platform_->group_endpoint(node_of(id), group_slot_[id]);
    }
    replayers_.push_back(std::make_unique<Replayer>(*this, id, stage, host, record));
    total_ops_ += static_cast<std::int64_t>(program_.stage_ops[stage].size());
  }
  for (auto& replayer : replayers_) {
    Replayer* r = replayer.get();
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
    if (!replayer->finished()) {
      throw SimulationError("the replay deadlocked: " + replayer->describe_unfinished());
    }
  }

  SimResult result;
  result.fidelity = fidelity_;
  result.hardware =
      fmt::format("{} ({}), {}{}{}", node_.name, node_.gpu.name, fabric_.name,
                  fabric_.oversubscription > 1 ? fmt::format(", {:g}:1 oversubscribed", fabric_.oversubscription) : "",
                  fabric_.rail_optimized ? ", rail-optimized" : "");
  result.peak_flops_per_gpu = node_.gpu.peak_flops(program_.scenario.model.dtype);
  result.gpu_memory_bytes = node_.gpu.hbm_bytes;
  result.timeline.engine = "sim";
  for (const auto& replayer : replayers_) {
    result.timeline.iteration_time_s = std::max(result.timeline.iteration_time_s, replayer->latest_end_s());
  }
  for (int rank : recorded) {
    const int id = fidelity_ == Fidelity::Rank ? rank : rank / layout.tp();
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
  result.stats.actors = replayers;
  result.stats.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  return result;
}

}  // namespace twin::sim::detail
