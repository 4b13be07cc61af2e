// Replica fidelity (sim/simulate.hpp): group fidelity's actors of one pipeline replica, DP index 0, replay their ops;
// every other actor mirrors the replayed actor with its coordinates but DP index 0 and costs nothing but the flows of
// its collectives.
//
// A collective's group either holds replayed actors (a data-parallel group holds every replica's actor of one stage,
// an expert group that spans replicas holds replica 0's) and is replayed as at group fidelity, its mirrored members
// arriving with the replayed ones; or it holds none (another replica's context-parallel group, expert group or
// embedding pair): those mirror groups move their bytes beside the replayed group's instance, phase by phase, each
// planned on its own members' nodes, and the instance's phase ends when the last of all its flows does. A mirror
// group is found as the image of the replayed group under a shift of the DP coordinate.
#include <algorithm>
#include <cmath>
#include <memory>
#include <set>

#include <simgrid/s4u.hpp>

#include "sim/engine.hpp"

namespace twin::sim {

bool replica_exact_enough(const model::Program& program, const SimOptions& options) {
  return program.layout.dp() > 1 && options.degradations.empty();
}

namespace detail {

bool Engine::replayed(int id) const {
  return program_.layout.coord_of(representative_rank(id)).dp == 0;
}

int Engine::mirror_of(int id) const {
  model::RankCoord coord = program_.layout.coord_of(representative_rank(id));
  coord.dp = 0;
  return program_.layout.rank_of(coord) / program_.layout.tp();
}

simgrid::s4u::Host* Engine::host_of(int id) const {
  const auto& replayer = replayers_[static_cast<std::size_t>(id)];
  if (replayer) return replayer->host();
  return platform_->group_endpoint(node_of(id), group_slot_[static_cast<std::size_t>(id)]);
}

const std::vector<std::vector<int>>& Engine::mirror_groups(model::Group group, const std::vector<int>& members) {
  const std::uint64_t key = static_cast<std::uint64_t>(group) << 32 | static_cast<std::uint32_t>(members.front());
  auto [it, created] = mirror_groups_.try_emplace(key);
  if (!created) return it->second;
  const model::RankLayout& layout = program_.layout;
  std::vector<int> sorted = members;
  std::sort(sorted.begin(), sorted.end());
  std::set<int> seen;  // first members of the images met so far
  const model::RankCoord first = layout.coord_of(representative_rank(members.front()));
  for (int shift = 1; shift < layout.dp(); ++shift) {
    model::RankCoord coord = first;
    coord.dp = (first.dp + shift) % layout.dp();
    const int image = layout.rank_of(coord) / layout.tp();
    if (std::binary_search(sorted.begin(), sorted.end(), image)) continue;  // the group spans replicas
    std::vector<int> others = group_members(group, image);
    if (!seen.insert(others.front()).second) continue;
    if (std::any_of(others.begin(), others.end(), [this](int id) { return replayed(id); })) continue;
    it->second.push_back(std::move(others));
  }
  return it->second;
}

void Engine::add_mirror_flows(CollectiveInstance& instance, const model::Op& op) {
  if (instance.plan.phases.empty()) return;  // timed without flows: nothing of it on the fabric
  const std::vector<std::vector<int>>& groups = mirror_groups(op.group, instance.members);
  if (groups.empty()) return;
  instance.flow_members = instance.members;
  std::vector<FlowPhase>& phases = instance.plan.phases;
  for (const std::vector<int>& group : groups) {
    const CollectivePlan mirror = plan_of(op, group, group.front());
    const auto offset = static_cast<int>(instance.flow_members.size());
    instance.flow_members.insert(instance.flow_members.end(), group.begin(), group.end());
    for (std::size_t p = 0; p < mirror.phases.size(); ++p) {
      if (p == phases.size()) phases.emplace_back();
      for (Flow flow : mirror.phases[p].flows) {
        flow.from += offset;
        flow.to += offset;
        phases[p].flows.push_back(flow);
      }
      phases[p].latency_s = std::max(phases[p].latency_s, mirror.phases[p].latency_s);
      phases[p].min_s = std::max(phases[p].min_s, mirror.phases[p].min_s);
    }
  }
}

void Replayer::post_phases() {
  engine_.count_activity();
  add_wait(phases_->get_async<void>(&phase_payload_), {Wait::PhaseDone, 0, 0, nullptr});
}

simgrid::s4u::Mailbox* Engine::flow_inbox(simgrid::s4u::Host* host) {
  auto [it, created] = flow_inboxes_.try_emplace(host, nullptr);
  if (!created) return it->second;
  simgrid::s4u::Mailbox* inbox = simgrid::s4u::Mailbox::by_name("flows-to-" + host->get_name());
  // The receiver takes each flow as it arrives (a flow left in a permanent mailbox keeps its record until taken), and
  // never holds the simulation open.
  const simgrid::s4u::ActorPtr receiver = simgrid::s4u::Actor::create("flows-in", host, [inbox] {
    simgrid::s4u::Actor::self()->daemonize();
    for (;;) inbox->get<void>();
  });
  inbox->set_receiver(receiver);
  it->second = inbox;
  return inbox;
}

namespace {

// One flow of a phase, as a helper sends it: from a host to the inbox of another.
struct Transfer {
  simgrid::s4u::Host* from;
  simgrid::s4u::Mailbox* to;
  std::uint64_t bytes;
};

// A helper's body: moves to each flow's source in turn and sends it, waits for every one, and if it is the last of
// its phase's helpers to be done, goes home and posts the instance to its owner's phases mailbox.
void send_flows(const std::vector<Transfer>& part, simgrid::s4u::Mailbox* owner, CollectiveInstance* instance,
                simgrid::s4u::Host* home, const std::shared_ptr<std::size_t>& helpers_left) {
  static int payload = 0;  // a message carries a pointer; the flows' receivers read none
  std::vector<simgrid::s4u::CommPtr> comms;
  comms.reserve(part.size());
  for (const Transfer& t : part) {
    if (t.from != simgrid::s4u::this_actor::get_host()) simgrid::s4u::this_actor::set_host(t.from);
    comms.push_back(t.to->put_async(&payload, t.bytes));
  }
  for (const simgrid::s4u::CommPtr& comm : comms) comm->wait();
  if (--*helpers_left > 0) return;
  simgrid::s4u::this_actor::set_host(home);
  owner->put_init(instance, 0)->detach();
}

}  // namespace

// The owner of a data-parallel collective of replica 0 owns every replica's flows: hundreds of them per phase, and
// several collectives overlap. Waiting on any of n activities costs SimGrid time in n at every event, so the owner
// would pay for each flow in the flows in flight (Llama 3 405B on 8,192 H100: 27.5 s wall with the owner waiting on
// every flow, 6.4 s with a helper per phase). Helper actors start the phase's flows, each waits for its own one after
// the other, and the last to be done posts the instance to the owner at the time its last flow ended (a message of no
// bytes, no latency).
//
// Each flow is a message from a helper, moved to the flow's source host, to the permanent receiver of its destination
// host (flow_inbox), not a host-to-host transfer: SimGrid 3.32 keeps every host-to-host transfer in flight in one list
// that it walks each time one ends (CommImpl::finish; docs/simulator.md, "Where rank fidelity's time goes"), so that
// each flow cost time in the number of flows in flight in the whole simulation, while a message is listed with its
// sender only, here the helper's own flows. Both cross the same route from the same host to the same host, started
// at the same time, with no latency paid by SimGrid (topology::configure_flow_model).
bool Replayer::start_phase_by_helper(CollectiveInstance* instance) {
  // A pipeline message or a small group's phase: the owner waits for its few flows itself (an actor per message
  // made MT-NLG's 130,000 messages at DP 1 take 37 s instead of group fidelity's 23 s).
  // At group fidelity only the phases of many flows (data- and expert-parallel collectives across nodes) go to helpers.
  const std::size_t kFlowsForAHelper = engine_.replica() ? 8 : 64;
  // A helper moves to each new source, and a move walks every activity the actor holds (Actor::set_host): a phase of
  // n flows from n hosts in one helper would cost n^2 / 2 steps. So at most this many flows a helper (32, 64 and 128
  // timed alike), the flows sorted by source host; the helpers start theirs in this order, at the phase's start.
  constexpr std::size_t kFlowsPerHelper = 64;
  const FlowPhase& phase = instance->plan.phases[instance->phase];
  if (phase.flows.size() < kFlowsForAHelper) return false;
  const std::vector<int>& ends = instance->flow_members.empty() ? instance->members : instance->flow_members;
  std::vector<Transfer> transfers;
  transfers.reserve(phase.flows.size());
  for (const Flow& flow : phase.flows) {
    const auto bytes = flow.bytes <= 0 ? std::uint64_t{0} : static_cast<std::uint64_t>(std::llround(flow.bytes));
    transfers.push_back({engine_.host_of(ends[flow.from]), engine_.flow_inbox(engine_.host_of(ends[flow.to])), bytes});
    engine_.count_activity();
  }
  engine_.count_activity();  // the notice
  std::stable_sort(transfers.begin(), transfers.end(),
                   [](const Transfer& a, const Transfer& b) { return a.from->get_name() < b.from->get_name(); });
  auto helpers_left = std::make_shared<std::size_t>((transfers.size() + kFlowsPerHelper - 1) / kFlowsPerHelper);
  for (std::size_t first = 0; first < transfers.size(); first += kFlowsPerHelper) {
    const auto begin = transfers.begin() + static_cast<std::ptrdiff_t>(first);
    const auto end =
        transfers.begin() + static_cast<std::ptrdiff_t>(std::min(transfers.size(), first + kFlowsPerHelper));
    simgrid::s4u::Actor::create("flows", host_,
                                [part = std::vector<Transfer>(begin, end), owner = phases_, instance, home = host_,
                                 helpers_left] { send_flows(part, owner, instance, home, helpers_left); });
  }
  return true;
}

}  // namespace detail
}  // namespace twin::sim
