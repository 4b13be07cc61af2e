#include "exec/comm/threads_communicator.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <optional>

#include <fmt/core.h>
#include <fmt/format.h>

namespace twin::exec {

namespace {

using Clock = std::chrono::steady_clock;

enum class CollectiveKind { AllReduce, ReduceScatter, AllGather, Broadcast, Barrier, AllToAll };

const char* to_string(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::AllReduce:
      return "all_reduce";
    case CollectiveKind::ReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::AllGather:
      return "all_gather";
    case CollectiveKind::Broadcast:
      return "broadcast";
    case CollectiveKind::Barrier:
      return "barrier";
    case CollectiveKind::AllToAll:
      return "all_to_all";
  }
  return "?";
}

// One collective call of one group: what each member posted, and how far the members have got.
struct Slot {
  CollectiveKind kind = CollectiveKind::Barrier;
  std::size_t count = 0;
  DType dtype = DType::F32;
  int root = 0;
  std::vector<const void*> in;
  std::vector<void*> out;
  std::vector<const std::vector<std::size_t>*> send_counts, recv_counts;  // all_to_all: each member's chunk sizes
  std::vector<bool> arrived_member;
  int arrived = 0, finished = 0, left = 0;
};

struct GroupState {
  std::vector<int> members;
  std::vector<std::uint64_t> next_call;  // per member: index of its next collective on this group
  std::map<std::uint64_t, Slot> slots;   // calls in progress
};

struct Message {
  std::vector<std::byte> bytes;
};

}  // namespace

struct ThreadsWorld::State {
  int world_size;
  CommOptions options;
  std::mutex mutex;  // guards everything below (ranks of one process: one lock is simple and fast enough)
  std::condition_variable changed;
  std::map<std::pair<std::string, std::vector<int>>, GroupState> groups;
  std::map<std::tuple<int, int, std::uint64_t>, std::deque<Message>> mailboxes;  // (to, from, tag)
  std::optional<std::string> failure;  // set by abort(): the first failing rank's story
  std::vector<std::vector<int>> waiting_for;  // per rank: whom it is blocked on now (empty: not communicating)

  GroupState& group(const CommGroup& g) {
    auto [it, inserted] = groups.try_emplace({std::string(g.kind), g.members});
    if (inserted) {
      it->second.members = g.members;
      it->second.next_call.assign(g.members.size(), 0);
    }
    return it->second;
  }
};

namespace {

class ThreadsCommunicator final : public Communicator {
 public:
  ThreadsCommunicator(std::shared_ptr<ThreadsWorld::State> state, int rank) : s_(std::move(state)), rank_(rank) {}

  std::string_view name() const override { return "threads"; }
  int rank() const override { return rank_; }
  int world_size() const override { return s_->world_size; }

  void all_reduce(const CommGroup& group, void* data, std::size_t count, DType dtype, std::string_view label) override {
    collective(group, CollectiveKind::AllReduce, data, data, count, dtype, 0, label);
  }
  void reduce_scatter(const CommGroup& group, const void* in, void* out, std::size_t count, DType dtype,
                      std::string_view label) override {
    collective(group, CollectiveKind::ReduceScatter, in, out, count, dtype, 0, label);
  }
  void all_gather(const CommGroup& group, const void* in, void* out, std::size_t count, DType dtype,
                  std::string_view label) override {
    collective(group, CollectiveKind::AllGather, in, out, count, dtype, 0, label);
  }
  void broadcast(const CommGroup& group, void* data, std::size_t count, DType dtype, int root,
                 std::string_view label) override {
    collective(group, CollectiveKind::Broadcast, data, data, count, dtype, root, label);
  }
  void barrier(const CommGroup& group, std::string_view label) override {
    collective(group, CollectiveKind::Barrier, nullptr, nullptr, 0, DType::F32, 0, label);
  }
  void all_to_all(const CommGroup& group, const void* in, const std::vector<std::size_t>& send_counts, void* out,
                  const std::vector<std::size_t>& recv_counts, DType dtype, std::string_view label) override {
    chunk_offsets(group, rank_, send_counts, label);  // one count per member, or a clear error before posting
    chunk_offsets(group, rank_, recv_counts, label);
    collective(group, CollectiveKind::AllToAll, in, out, 0, dtype, 0, label, &send_counts, &recv_counts);
  }

  void send(int peer, std::uint64_t tag, const void* data, std::size_t bytes) override {
    Message message;
    message.bytes.resize(bytes);
    if (bytes > 0) std::memcpy(message.bytes.data(), data, bytes);
    {
      std::lock_guard lock(s_->mutex);
      s_->mailboxes[{peer, rank_, tag}].push_back(std::move(message));
    }
    s_->changed.notify_all();
  }

  void recv(int peer, std::uint64_t tag, void* data, std::size_t bytes, std::string_view label) override {
    std::unique_lock lock(s_->mutex);
    const auto key = std::make_tuple(rank_, peer, tag);
    const auto deadline = Clock::now() + timeout();
    const Waiting waiting(*s_, rank_, {peer});
    while (true) {
      throw_if_failed(label);
      auto it = s_->mailboxes.find(key);
      if (it != s_->mailboxes.end() && !it->second.empty()) {
        Message message = std::move(it->second.front());
        it->second.pop_front();
        if (it->second.empty()) s_->mailboxes.erase(it);
        if (message.bytes.size() != bytes) {
          throw CommError(fmt::format("rank {}: recv {} from rank {}: the message has {} bytes, expected {}", rank_,
                                      label, peer, message.bytes.size(), bytes));
        }
        if (bytes > 0) std::memcpy(data, message.bytes.data(), bytes);
        return;
      }
      if (s_->changed.wait_until(lock, deadline) == std::cv_status::timeout && Clock::now() >= deadline) {
        throw_if_failed(label);
        throw timed_out(
            fmt::format("rank {}: recv {} from rank {} timed out after {} s: rank {} never sent it "
                        "(dead, stuck or out of step){}",
                        rank_, label, peer, s_->options.timeout_s, peer, blocked_chain({peer})));
      }
    }
  }

  void abort(std::string_view reason) override { abort_world(*s_, rank_, reason); }

  static void abort_world(ThreadsWorld::State& s, int rank, std::string_view reason) {
    {
      std::lock_guard lock(s.mutex);
      if (!s.failure) s.failure = fmt::format("rank {} failed: {}", rank, reason);
    }
    s.changed.notify_all();
  }

 private:
  std::chrono::nanoseconds timeout() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(s_->options.timeout_s));
  }

  // Marks `rank` as blocked on `ranks` while it lives (constructed and destroyed under the state's mutex).
  class Waiting {
   public:
    Waiting(ThreadsWorld::State& state, int rank, std::vector<int> ranks) : state_(state), rank_(rank) {
      state_.waiting_for[rank_] = std::move(ranks);
    }
    ~Waiting() { state_.waiting_for[rank_].clear(); }
    Waiting(const Waiting&) = delete;
    Waiting& operator=(const Waiting&) = delete;

   private:
    ThreadsWorld::State& state_;
    int rank_;
  };

  // Why `late` have not come, when they are blocked themselves: follows who waits for whom (under the mutex) to the
  // ranks that wait for nobody, the dead or stuck ones a user should look at. Empty when `late` wait for nobody.
  std::string blocked_chain(const std::vector<int>& late) const {
    std::vector<bool> seen(static_cast<std::size_t>(s_->world_size), false);
    std::vector<int> frontier = late, blocked, idle;
    for (int r : late) seen[r] = true;
    seen[rank_] = true;
    while (!frontier.empty()) {
      std::vector<int> next;
      for (int r : frontier) {
        const std::vector<int>& targets = s_->waiting_for[r];
        if (targets.empty()) {
          idle.push_back(r);
          continue;
        }
        blocked.push_back(r);
        for (int t : targets) {
          if (!seen[t]) {
            seen[t] = true;
            next.push_back(t);
          }
        }
      }
      frontier = std::move(next);
    }
    if (blocked.empty()) return {};
    std::sort(blocked.begin(), blocked.end());
    std::sort(idle.begin(), idle.end());
    return fmt::format("; {} {} blocked in turn, on a chain that ends at {}", format_ranks(blocked),
                       blocked.size() == 1 ? "is" : "are",
                       idle.empty() ? std::string("ranks waiting for each other")
                                    : format_ranks(idle) + " (in no communication: dead, or stuck)");
  }

  // A timeout ends the run: the world's failure is recorded before this rank stops waiting (under the mutex, which
  // the caller holds), so that a rank blocked on this one, whose own deadline comes next, abandons naming this
  // story rather than timing out itself on a rank that, no longer waiting, looks merely slow.
  CommError timed_out(std::string message) const {
    if (!s_->failure) s_->failure = fmt::format("rank {} failed: {}", rank_, message);
    s_->changed.notify_all();
    return CommError(std::move(message));
  }

  void throw_if_failed(std::string_view label) const {
    if (s_->failure) throw PeerFailure(fmt::format("rank {}: {} abandoned: {}", rank_, label, *s_->failure));
  }

  // "all_reduce <label> on the tensor group (ranks 2, 3)"; the kind is left out when the label already names it.
  std::string describe(const CommGroup& group, CollectiveKind kind, std::string_view label) const {
    const bool named = label.find(to_string(kind)) != std::string_view::npos;
    return fmt::format("{}{}{} on the {} group ({})", named ? "" : to_string(kind), named ? "" : " ", label, group.kind,
                       format_ranks(group.members));
  }

  // Waits under `lock` until done() or the deadline; on timeout, names the members `missing` returns.
  template <typename Done, typename Missing>
  void wait(std::unique_lock<std::mutex>& lock, Clock::time_point deadline, Done done, Missing missing,
            const std::string& what, const char* verb) {
    while (!done()) {
      throw_if_failed(what);
      if (s_->changed.wait_until(lock, deadline) == std::cv_status::timeout && !done()) {
        throw_if_failed(what);
        const std::vector<int> late = missing();
        throw timed_out(fmt::format("rank {}: {} timed out after {} s: {} did not {}{}", rank_, what,
                                    s_->options.timeout_s, format_ranks(late), verb, blocked_chain(late)));
      }
    }
  }

  void collective(const CommGroup& group, CollectiveKind kind, const void* in, void* out, std::size_t count,
                  DType dtype, int root, std::string_view label, const std::vector<std::size_t>* send_counts = nullptr,
                  const std::vector<std::size_t>* recv_counts = nullptr) {
    const int me = index_in(group, rank_);
    const int size = static_cast<int>(group.members.size());
    if (kind == CollectiveKind::AllReduce || kind == CollectiveKind::ReduceScatter) {
      if (dtype != DType::F32 && dtype != DType::F64) {
        throw CommError(fmt::format("rank {}: {}: the threads communicator sums f32 or f64, not {}", rank_,
                                    describe(group, kind, label), to_string(dtype)));
      }
    }
    std::unique_lock lock(s_->mutex);
    throw_if_failed(label);
    GroupState& g = s_->group(group);
    const std::uint64_t call = g.next_call[me]++;
    Slot& slot = g.slots[call];
    if (slot.arrived == 0) {
      slot.kind = kind;
      slot.count = count;
      slot.dtype = dtype;
      slot.root = root;
      slot.in.assign(size, nullptr);
      slot.out.assign(size, nullptr);
      slot.send_counts.assign(size, nullptr);
      slot.recv_counts.assign(size, nullptr);
      slot.arrived_member.assign(size, false);
    } else if (slot.kind != kind || slot.count != count || slot.dtype != dtype || slot.root != root) {
      const std::string problem = fmt::format(
          "rank {} called {} ({} x {}) as call {} of the {} group ({}), where another member called {} ({} x {})",
          rank_, to_string(kind), count, to_string(dtype), call, group.kind, format_ranks(group.members),
          to_string(slot.kind), slot.count, to_string(slot.dtype));
      lock.unlock();
      abort_world(*s_, rank_, problem);
      throw CommError(problem);
    }
    slot.in[me] = in;
    slot.out[me] = out;
    slot.send_counts[me] = send_counts;
    slot.recv_counts[me] = recv_counts;
    slot.arrived_member[me] = true;
    ++slot.arrived;
    if (slot.arrived == size) s_->changed.notify_all();

    const std::string what = describe(group, kind, label);
    const auto deadline = Clock::now() + timeout();
    std::optional<Waiting> waiting;
    if (slot.arrived < size) {
      std::vector<int> others;
      for (int i = 0; i < size; ++i) {
        if (!slot.arrived_member[i]) others.push_back(group.members[i]);
      }
      waiting.emplace(*s_, rank_, std::move(others));
    }
    wait(
        lock, deadline, [&] { return slot.arrived == size; },
        [&] {
          std::vector<int> missing;
          for (int i = 0; i < size; ++i) {
            if (!slot.arrived_member[i]) missing.push_back(group.members[i]);
          }
          return missing;
        },
        what, "arrive");
    waiting.reset();

    lock.unlock();
    std::exception_ptr work_error;
    try {
      work(slot, me, size, group);
    } catch (...) {  // still finish below: the others must not wait for this member forever
      work_error = std::current_exception();
    }
    lock.lock();
    ++slot.finished;
    if (slot.finished == size) s_->changed.notify_all();
    // In work() every member reads and writes the others' buffers: none may leave (unwinding, freeing its buffers)
    // before all have finished, even when another rank has failed meanwhile. work() never blocks, so this is short.
    const auto finish_deadline = deadline + timeout();
    while (slot.finished != size) {
      if (s_->changed.wait_until(lock, finish_deadline) == std::cv_status::timeout && slot.finished != size) {
        throw timed_out(fmt::format("rank {}: {} timed out after {} s: not every member finished its share", rank_,
                                    what, s_->options.timeout_s));
      }
    }
    if (++slot.left == size) g.slots.erase(call);
    if (work_error) std::rethrow_exception(work_error);
  }

  // This member's share of the collective, with every member's buffers posted in `slot`.
  static void work(const Slot& slot, int me, int size, const CommGroup& group) {
    const std::size_t element = dtype_bytes(slot.dtype);
    switch (slot.kind) {
      case CollectiveKind::Barrier:
        return;
      case CollectiveKind::AllReduce: {
        const std::size_t begin = slot.count * me / size, end = slot.count * (me + 1) / size;
        if (end == begin) return;
        if (slot.dtype == DType::F32) {
          reduce_chunk<float>(slot, begin, end,
                              [&](int member) { return static_cast<float*>(slot.out[member]) + begin; });
        } else {
          reduce_chunk<double>(slot, begin, end,
                               [&](int member) { return static_cast<double*>(slot.out[member]) + begin; });
        }
        return;
      }
      case CollectiveKind::ReduceScatter: {
        const std::size_t begin = slot.count * me, end = slot.count * (me + 1);
        if (slot.dtype == DType::F32) {
          reduce_chunk<float>(slot, begin, end,
                              [&](int member) { return member == me ? static_cast<float*>(slot.out[me]) : nullptr; });
        } else {
          reduce_chunk<double>(slot, begin, end,
                               [&](int member) { return member == me ? static_cast<double*>(slot.out[me]) : nullptr; });
        }
        return;
      }
      case CollectiveKind::AllGather: {
        const std::size_t bytes = slot.count * element;
        auto* out = static_cast<std::byte*>(slot.out[me]);
        for (int member = 0; member < size; ++member) {
          std::byte* target = out + bytes * member;
          if (slot.in[member] != target && bytes > 0) std::memcpy(target, slot.in[member], bytes);
        }
        return;
      }
      case CollectiveKind::Broadcast:
        if (me != slot.root && slot.count > 0) std::memcpy(slot.out[me], slot.in[slot.root], slot.count * element);
        return;
      case CollectiveKind::AllToAll:
        receive_chunks(slot, me, size, element, group);
        return;
    }
  }

  // all_to_all: chunk `me` of every member's in, into chunk `member` of my out, once the sizes agree.
  static void receive_chunks(const Slot& slot, int me, int size, std::size_t element, const CommGroup& group) {
    const std::vector<std::size_t>& mine = *slot.recv_counts[me];
    std::size_t out_offset = 0;
    for (int member = 0; member < size; ++member) {
      const std::vector<std::size_t>& theirs = *slot.send_counts[member];
      if (theirs[me] != mine[member]) {
        throw CommError(fmt::format(
            "rank {}: all_to_all on the {} group ({}): rank {} sends it {} elements, it expects {}", group.members[me],
            group.kind, format_ranks(group.members), group.members[member], theirs[me], mine[member]));
      }
      std::size_t in_offset = 0;
      for (int j = 0; j < me; ++j) in_offset += theirs[j];
      if (mine[member] > 0) {
        std::memcpy(static_cast<std::byte*>(slot.out[me]) + out_offset * element,
                    static_cast<const std::byte*>(slot.in[member]) + in_offset * element, mine[member] * element);
      }
      out_offset += mine[member];
    }
  }

  // Elements [begin, end) of the sum of every member's input, in member order, copied to target(member) (where that
  // member wants element `begin`) for each member whose target is not null.
  template <typename T, typename Target>
  static void reduce_chunk(const Slot& slot, std::size_t begin, std::size_t end, Target target) {
    const int size = static_cast<int>(slot.in.size());
    std::vector<T> sum(static_cast<const T*>(slot.in[0]) + begin, static_cast<const T*>(slot.in[0]) + end);
    for (int member = 1; member < size; ++member) {
      const T* x = static_cast<const T*>(slot.in[member]) + begin;
      for (std::size_t k = 0; k < sum.size(); ++k) sum[k] += x[k];
    }
    for (int member = 0; member < size; ++member) {
      T* out = target(member);
      if (out != nullptr) std::copy(sum.begin(), sum.end(), out);
    }
  }

  std::shared_ptr<ThreadsWorld::State> s_;
  int rank_;
};

}  // namespace

ThreadsWorld::ThreadsWorld(int world_size, CommOptions options) : state_(std::make_shared<State>()) {
  state_->world_size = world_size;
  state_->options = options;
  state_->waiting_for.assign(static_cast<std::size_t>(world_size), {});
}

ThreadsWorld::~ThreadsWorld() = default;

int ThreadsWorld::world_size() const {
  return state_->world_size;
}

std::unique_ptr<Communicator> ThreadsWorld::communicator(int rank) {
  if (rank < 0 || rank >= state_->world_size) {
    throw CommError(fmt::format("ThreadsWorld: rank {} outside a world of {}", rank, state_->world_size));
  }
  return std::make_unique<ThreadsCommunicator>(state_, rank);
}

void ThreadsWorld::abort(int rank, std::string_view reason) {
  ThreadsCommunicator::abort_world(*state_, rank, reason);
}

}  // namespace twin::exec
