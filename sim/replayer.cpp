// One actor: a rank (rank fidelity) or a TP group (group fidelity) replaying its stage's op list.
//
// An op's times are known as soon as its predecessors' are: a compute op (or an analytical collective) that becomes
// ready at t runs [t, t + duration] even if t lies in the simulated future, without any SimGrid activity. Only
// three things involve SimGrid: a Send (a message to the peer's inbox, started when the clock reaches its ready
// time), a Recv (a message arriving in an inbox), and a collective with flows. Members register with a collective as
// soon as they know when they reach it; the last one to register owns it: it starts the flows when the clock reaches
// the latest arrival, and when they are done it tells the others (a zero-byte message to their doorbell). The actor
// blocks on its messages and flows, with a timeout to the next thing it must start.
#include <fmt/format.h>
#include <algorithm>
#include <cmath>
#include <limits>

#include <simgrid/s4u.hpp>

#include "model/ops/exchanges.hpp"
#include "sim/engine.hpp"

namespace twin::sim::detail {

namespace sg4 = simgrid::s4u;

namespace {
// Kernel timers land within rounding of the requested date: an op due within this of now is issued now.
constexpr double kTimeTolerance = 1e-9;

std::uint64_t to_bytes(double bytes) {
  return bytes <= 0 ? 0 : static_cast<std::uint64_t>(std::llround(bytes));
}
}  // namespace

Replayer::Replayer(Engine& engine, int id, int stage, sg4::Host* host, bool record)
    : engine_(engine),
      id_(id),
      stage_(stage),
      plan_(engine.plan(stage)),
      host_(host),
      wake_at_s_(std::numeric_limits<double>::infinity()),
      expert_scale_(engine.expert_load_scale(id)),
      compute_scale_(engine.compute_scale(id)) {
  const std::size_t ops = plan_.ops->size();
  ready_.assign(ops, 0.0);
  pending_ = plan_.pending;
  if (record) {
    start_.assign(ops, 0.0);
    active_.assign(ops, 0.0);
    end_.assign(ops, 0.0);
  }
  arrival_s_.assign(plan_.recv_count, 0.0);
  transfer_start_s_.assign(plan_.recv_count, 0.0);
  host_lag_s_.assign(plan_.host_syncs.size(), 0.0);
  for (int from : plan_.peer_stages) {
    inboxes_.push_back(sg4::Mailbox::by_name(fmt::format("replayer{}<-stage{}", id, from)));
  }
  inbox_payload_.assign(inboxes_.size(), nullptr);
  doorbell_ = sg4::Mailbox::by_name(fmt::format("replayer{}-doorbell", id));
}

sg4::Mailbox* Replayer::inbox(int from_stage) const {
  const auto it = std::find(plan_.peer_stages.begin(), plan_.peer_stages.end(), from_stage);
  return inboxes_[static_cast<std::size_t>(it - plan_.peer_stages.begin())];
}

void Replayer::add_wait(sg4::ActivityPtr activity, Waiting waiting) {
  waits_.push_back(std::move(activity));
  waiting_.push_back(waiting);
}

void Replayer::post_inbox(int slot) {
  engine_.count_activity();
  add_wait(inboxes_[slot]->get_async<void>(&inbox_payload_[slot]), {Wait::Inbox, slot, 0, nullptr});
}

void Replayer::post_doorbell() {
  engine_.count_activity();
  add_wait(doorbell_->get_async<void>(&doorbell_payload_), {Wait::Doorbell, 0, 0, nullptr});
}

void Replayer::run() {
  // Messages start flowing to us as soon as they are sent (eager), whether a get is posted or not.
  for (sg4::Mailbox* inbox : inboxes_) inbox->set_receiver(sg4::Actor::self());
  doorbell_->set_receiver(sg4::Actor::self());
  for (int slot = 0; slot < static_cast<int>(inboxes_.size()); ++slot) post_inbox(slot);
  post_doorbell();
  if (engine_.fidelity() == Fidelity::Group) {  // replica fidelity included (sim/replica.cpp: helpers)
    phases_ = sg4::Mailbox::by_name(fmt::format("replayer{}-phases", id_));
    phases_->set_receiver(sg4::Actor::self());
    post_phases();
  }

  for (std::int32_t op = 0; op < static_cast<std::int32_t>(pending_.size()); ++op) {
    if (pending_[op] == 0) ready_list_.push_back(op);
  }
  engine_.settle(*this);
  while (true) {
    issue_due();
    if (finished() && owned_collectives_ == 0) break;
    const double now = sg4::Engine::get_clock();
    const double timeout = due_.empty() ? -1.0 : std::max(0.0, due_.top().time_s - now);
    wake_at_s_ = timeout < 0 ? std::numeric_limits<double>::infinity() : now + timeout;
    if (timeout >= 0) engine_.count_activity();
    const ssize_t index = sg4::Activity::wait_any_for(waits_, timeout);
    if (index >= 0) handle(static_cast<std::size_t>(index));
    engine_.settle(*this);
  }
  for (sg4::Mailbox* inbox : inboxes_) inbox->set_receiver(nullptr);
  doorbell_->set_receiver(nullptr);
  if (phases_ != nullptr) phases_->set_receiver(nullptr);
}

bool Replayer::needs_wake() const {
  if (doorbell_pending_) return false;
  if (finished() && owned_collectives_ == 0) return true;  // so that it can leave
  return !due_.empty() && due_.top().time_s < wake_at_s_ - kTimeTolerance;
}

void Replayer::ring() {
  doorbell_pending_ = true;
  engine_.count_activity();
  doorbell_->put_init(this, 0)->detach();  // the payload is unused but must not be null
}

void Replayer::finish(std::int32_t op, double start_s, double active_s, double end_s) {
  if (!start_.empty()) {
    start_[op] = start_s;
    active_[op] = active_s;
    end_[op] = end_s;
  }
  latest_end_s_ = std::max(latest_end_s_, end_s);
  if (!plan_.host_syncs.empty()) note_host_sync(op, end_s);
  ++resolved_;
  engine_.note_resolved();
  for (std::int32_t i = plan_.successor_begin[op]; i < plan_.successor_begin[op + 1]; ++i) {
    const std::int32_t next = plan_.successors[i];
    ready_[next] = std::max(ready_[next], end_s);
    if (--pending_[next] == 0) ready_list_.push_back(next);
  }
}

double Replayer::host_lag_s(std::int32_t op) const {
  const auto& syncs = plan_.host_syncs;
  const auto before = static_cast<std::size_t>(std::lower_bound(syncs.begin(), syncs.end(), op) - syncs.begin());
  const std::size_t known = std::min(before, host_syncs_done_);
  return known == 0 ? 0 : host_lag_s_[known - 1];
}

// The host issued the sync at its issue time plus the lag so far, then waited for the GPU to finish it at `end_s`.
void Replayer::note_host_sync(std::int32_t op, double end_s) {
  const auto& syncs = plan_.host_syncs;
  const auto it = std::lower_bound(syncs.begin(), syncs.end(), op);
  if (it == syncs.end() || *it != op) return;
  const auto index = static_cast<std::size_t>(it - syncs.begin());
  const double before = index == 0 ? 0 : host_lag_s_[index - 1];
  host_lag_s_[index] = std::max(before, end_s - plan_.issue_last_s[op]);
  host_syncs_done_ = std::max(host_syncs_done_, index + 1);
}

void Replayer::drain() {
  // A queue, not recursion: a chain of local ops can be tens of thousands long. become_ready may append to it.
  for (std::size_t i = 0; i < ready_list_.size(); ++i) become_ready(ready_list_[i]);
  ready_list_.clear();
}

void Replayer::become_ready(std::int32_t op) {
  const model::Op& o = (*plan_.ops)[op];
  if (plan_.local[op]) {
    // Ready once its predecessors are done; running once the host has issued its first kernel; done no earlier than
    // its last kernel after the host issued that one. A fused op whose kernels the host paces runs in pieces over
    // [start, end]; it is recorded as busy for its duration at the end (active = end - duration), so that the time
    // the GPU waited for the host between its kernels counts as the host's.
    const double ready = ready_[op];
    const double duration =
        (plan_.expert_s.empty() ? plan_.duration[op] : plan_.duration[op] - (1 - expert_scale_) * plan_.expert_s[op]) *
        (o.kind == model::OpKind::Compute ? compute_scale_ : 1.0);
    if (!plan_.host_paced) {
      finish(op, ready, ready, ready + duration);
      return;
    }
    const double lag = host_lag_s(op);
    const double start = std::max(ready, plan_.issue_first_s[op] + lag);
    const double host_end = plan_.issue_last_s[op] + lag + plan_.last_kernel_s[op];
    if (host_end > start + duration) {
      finish(op, ready, host_end - duration, host_end);
    } else {
      finish(op, ready, start, start + duration);
    }
    return;
  }
  // A message or a collective is posted once the host has made the call.
  if (plan_.host_paced) ready_[op] = std::max(ready_[op], plan_.issue_last_s[op] + host_lag_s(op));
  const double ready = ready_[op];
  if (plan_.rendezvous[op]) {
    arrive(op);  // a blocking Send/Recv: a two-member instance with its peer
  } else if (o.kind == model::OpKind::Recv) {
    const std::int32_t slot = plan_.recv_slot[op];
    finish(op, ready, std::max(ready, transfer_start_s_[slot]), std::max(ready, arrival_s_[slot]));
  } else if (o.kind == model::OpKind::Send) {
    schedule(ready, Due::Issue, op, nullptr);  // its message leaves at the simulated time
  } else {
    arrive(op);  // a collective: register now, even if `ready` lies ahead of the clock
  }
}

void Replayer::schedule(double time_s, Due kind, std::int32_t op, CollectiveInstance* instance) {
  due_.push({time_s, sequence_++, kind, op, instance});
}

void Replayer::issue_due() {
  while (!due_.empty() && due_.top().time_s <= sg4::Engine::get_clock() + kTimeTolerance) {
    const DueEvent event = due_.top();
    due_.pop();
    if (event.kind == Due::Issue) {
      send(event.op);
    } else {
      start_phase(event.instance);
    }
    engine_.settle(*this);
  }
}

void Replayer::send(std::int32_t op) {
  const model::Op& o = (*plan_.ops)[op];
  Replayer& peer = engine_.replayer(engine_.peer_replayer(*this, o.peer_stage));
  const double bytes = engine_.communication().ideal
                           ? 0
                           : model::pipeline_transfer(engine_.program().scenario, o).wire_bytes * engine_.bytes_scale();
  // The payload names the op; the receiver finds the matching Recv from its tag.
  void* payload = reinterpret_cast<void*>(static_cast<std::uintptr_t>(op) + 1);
  engine_.count_activity();
  add_wait(peer.inbox(stage_)->put_async(payload, to_bytes(bytes)), {Wait::Send, op, ready_[op], nullptr});
}

void Replayer::arrive(std::int32_t op) {
  CollectiveInstance* instance = engine_.collective(*this, op);
  const auto me = std::find(instance->members.begin(), instance->members.end(), id_) - instance->members.begin();
  instance->member_op[me] = op;
  instance->arrival_s[me] = ready_[op];
  if (++instance->arrived < instance->expected) return;
  // Everyone is registered: the running actor owns the collective. It starts when the latest member reaches it.
  Replayer& owner = engine_.running();
  ++owner.owned_collectives_;
  instance->started_s = *std::max_element(instance->arrival_s.begin(), instance->arrival_s.end());
  if (instance->plan.phases.empty()) {
    owner.complete_collective(instance, instance->started_s + instance->plan.estimate_s);
  } else {
    // Flows start from the owner's loop (SimGrid calls are not allowed while draining), now or later.
    owner.schedule(instance->started_s, Due::StartPhase, 0, instance);
  }
}

void Replayer::start_phase(CollectiveInstance* instance) {
  while (instance->phase < instance->plan.phases.size() && instance->plan.phases[instance->phase].flows.empty()) {
    ++instance->phase;  // nothing to move in this phase (e.g. one member per node)
  }
  if (instance->phase >= instance->plan.phases.size()) {
    complete_collective(instance, sg4::Engine::get_clock() + instance->plan.phases.back().latency_s);
    return;
  }
  const FlowPhase& phase = instance->plan.phases[instance->phase];
  instance->phase_started_s = sg4::Engine::get_clock();
  instance->flows_left = static_cast<int>(phase.flows.size());
  if (engine_.fidelity() == Fidelity::Group && start_phase_by_helper(instance)) return;
  const std::vector<int>& ends = instance->flow_members.empty() ? instance->members : instance->flow_members;
  for (const Flow& flow : phase.flows) {
    sg4::Host* from = engine_.host_of(ends[flow.from]);
    sg4::Host* to = engine_.host_of(ends[flow.to]);
    engine_.count_activity();
    add_wait(sg4::Comm::sendto_async(from, to, to_bytes(flow.bytes)), {Wait::CollectiveFlow, 0, 0, instance});
  }
}

void Replayer::complete_collective(CollectiveInstance* instance, double completion_s) {
  instance->completion_s = completion_s;
  --owned_collectives_;
  for (std::size_t i = 0; i < instance->members.size(); ++i) {
    if (instance->member_op[i] < 0) continue;  // replica fidelity: a mirrored member, which replays nothing
    Replayer& member = engine_.replayer(instance->members[i]);
    // extra_s: what a member does after the flows (a pipeline receiver's all-gather of a scattered tensor).
    member.finish(instance->member_op[i], instance->arrival_s[i], instance->started_s,
                  completion_s + instance->extra_s[i]);
    engine_.touch(member);
  }
  engine_.forget(instance);
}

void Replayer::handle(std::size_t index) {
  const sg4::ActivityPtr activity = waits_[index];
  const Waiting waiting = waiting_[index];
  waits_[index] = waits_.back();
  waits_.pop_back();
  waiting_[index] = waiting_.back();
  waiting_.pop_back();
  const double now = sg4::Engine::get_clock();
  switch (waiting.kind) {
    case Wait::Inbox: {
      const int from_stage = plan_.peer_stages[waiting.index];
      const auto sender_op =
          static_cast<std::int32_t>(reinterpret_cast<std::uintptr_t>(inbox_payload_[waiting.index]) - 1);
      const model::Op& sent = engine_.program().stage_ops[from_stage][sender_op];
      const auto it = plan_.recv_by_tag.find(p2p_key(from_stage, model::p2p_tag(sent)));
      if (it == plan_.recv_by_tag.end()) {
        throw SimulationError(fmt::format("stage {} got a message from stage {} (micro-batch {}) that no Recv matches",
                                          stage_, from_stage, sent.micro_batch));
      }
      const std::int32_t op = it->second;
      const Replayer& sender = engine_.replayer(engine_.peer_replayer(*this, from_stage));
      const std::int32_t slot = plan_.recv_slot[op];
      transfer_start_s_[slot] = activity->get_start_time();
      const int messages = model::pipeline_transfer(engine_.program().scenario, sent).messages;
      arrival_s_[slot] = now + messages * engine_.p2p_latency_s(sender, *this) + plan_.receipt_s[op];
      if (--pending_[op] == 0) ready_list_.push_back(op);
      post_inbox(waiting.index);
      break;
    }
    case Wait::Doorbell:
      // Someone resolved our ops for us and we have something to start (or nothing left to do).
      doorbell_pending_ = false;
      post_doorbell();
      break;
    case Wait::Send: {
      const model::Op& o = (*plan_.ops)[waiting.index];
      const Replayer& peer = engine_.replayer(engine_.peer_replayer(*this, o.peer_stage));
      const int messages = model::pipeline_transfer(engine_.program().scenario, o).messages;
      finish(waiting.index, waiting.start_s, waiting.start_s, now + messages * engine_.p2p_latency_s(*this, peer));
      break;
    }
    case Wait::CollectiveFlow:
      if (--waiting.instance->flows_left == 0) end_phase(waiting.instance, now);
      break;
    case Wait::PhaseDone:
      end_phase(static_cast<CollectiveInstance*>(phase_payload_), now);
      post_phases();
      break;
  }
}

// The last flow of the instance's phase ended at `now_s`: the next phase, or the collective done.
void Replayer::end_phase(CollectiveInstance* instance, double now_s) {
  const FlowPhase& phase = instance->plan.phases[instance->phase];
  const double done_s = std::max(now_s, instance->phase_started_s + phase.min_s) + phase.latency_s;
  ++instance->phase;
  if (instance->phase < instance->plan.phases.size()) {
    schedule(done_s, Due::StartPhase, 0, instance);
  } else {
    complete_collective(instance, done_s);
  }
}

std::string Replayer::describe_unfinished() const {
  for (std::int32_t op = 0; op < static_cast<std::int32_t>(pending_.size()); ++op) {
    if (pending_[op] > 0) {
      const model::Op& o = (*plan_.ops)[op];
      return fmt::format("replayer {} (stage {}) waits at op {} ({} {}, micro-batch {}) for {} predecessor(s)", id_,
                         stage_, op, model::to_string(o.kind), model::to_string(o.phase), o.micro_batch, pending_[op]);
    }
  }
  return fmt::format("replayer {} (stage {}) waits for a collective", id_, stage_);
}

}  // namespace twin::sim::detail
