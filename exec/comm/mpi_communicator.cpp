// The MPI communicator, through libtwin_mpi_shim.so (mpi_shim.hpp says why MPI is never linked into twin directly).
#include "exec/comm/mpi_communicator.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <list>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/core.h>

#include "exec/comm/mpi_shim.hpp"
#include "model/program/program.hpp"  // model::Group, to_string

namespace twin::exec {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

#ifdef TWIN_HAVE_MPI
constexpr const char* kShimName = "libtwin_mpi_shim.so";

// Where the shim may be: $TWIN_MPI_SHIM, the build tree, next to the running binary.
std::vector<fs::path> shim_candidates() {
  std::vector<fs::path> paths;
  if (const char* env = std::getenv("TWIN_MPI_SHIM")) paths.emplace_back(env);
#ifdef TWIN_MPI_SHIM_PATH
  paths.emplace_back(TWIN_MPI_SHIM_PATH);
#endif
  std::error_code error;
  const fs::path self = fs::read_symlink("/proc/self/exe", error);
  if (!error) {
    const fs::path dir = self.parent_path();
    for (const fs::path& candidate : {dir / kShimName, dir / ".." / "exec" / kShimName, dir / ".." / "lib" / kShimName})
      paths.push_back(candidate);
  }
  return paths;
}

// The shim's function table, loaded once per process.
const TwinMpiApi* load_shim(std::string& problem) {
  static std::once_flag once;
  static TwinMpiApi api{};
  static bool loaded = false;
  static std::string load_problem;
  std::call_once(once, [] {
    std::string tried;
    for (const fs::path& path : shim_candidates()) {
      std::error_code error;
      if (!fs::exists(path, error)) {
        tried += "\n  " + path.string() + ": not found";
        continue;
      }
      void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) {
        tried += "\n  " + path.string() + ": " + dlerror();
        continue;
      }
      auto* fill = reinterpret_cast<void (*)(TwinMpiApi*)>(dlsym(handle, "twin_mpi_shim_api"));
      if (fill == nullptr) {
        tried += "\n  " + path.string() + ": no twin_mpi_shim_api";
        continue;
      }
      fill(&api);
      loaded = true;
      return;
    }
    load_problem = "cannot load " + std::string(kShimName) + " (set TWIN_MPI_SHIM to its path):" + tried;
  });
  problem = load_problem;
  return loaded ? &api : nullptr;
}

// Tags: collectives of each group kind use their own pair (phase 1 and 2), point-to-point messages start above.
constexpr int kP2PTagBase = 64;

// A group kind's index: its model::Group value (the interpreter names groups by model::to_string), or kGroupCount.
int kind_index(std::string_view kind) {
  static_assert(2 * (model::kGroupCount + 1) <= kP2PTagBase, "collective tags stay below the point-to-point ones");
  int index = 0;
  while (index < model::kGroupCount && model::to_string(static_cast<model::Group>(index)) != kind) ++index;
  return index;
}

int as_count(std::size_t bytes) {
  if (bytes > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    throw CommError(fmt::format("mpi communicator: a message of {} bytes exceeds MPI's int count", bytes));
  }
  return static_cast<int>(bytes);
}

// Sleeps a little longer each time nothing happened: ranks may share cores, so spinning would starve them.
struct Backoff {
  int rounds = 0;
  void pause() {
    ++rounds;
    if (rounds < 50) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(std::min(1000, 10 * (rounds - 49))));
    }
  }
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(const TwinMpiApi& api, CommOptions options) : mpi_(api), options_(options) {
    check(mpi_.init(&rank_, &size_), "MPI initialisation");
  }

  ~MpiCommunicator() override {
    // Sends still in flight (the last activations) must complete before MPI goes away.
    const auto deadline = Clock::now() + std::chrono::duration<double>(options_.timeout_s);
    while (!pending_sends_.empty() && Clock::now() < deadline) {
      reap_sends();
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    mpi_.finalize();
  }

  std::string_view name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int world_size() const override { return size_; }

  void all_reduce(const CommGroup& group, void* data, std::size_t count, DType dtype, std::string_view label) override {
    const int me = index_in(group, rank_), size = static_cast<int>(group.members.size());
    if (size == 1) return;
    check_sum_dtype(dtype, group, label);
    const std::size_t element = dtype_bytes(dtype);
    auto chunk_begin = [&](int j) { return count * static_cast<std::size_t>(j) / static_cast<std::size_t>(size); };
    auto* bytes = static_cast<std::byte*>(data);
    // phase 1: chunk j of my data to member j; chunk `me` of everyone's data to me, summed in member order
    const std::size_t mine = chunk_begin(me + 1) - chunk_begin(me);
    std::vector<std::vector<std::byte>> received(static_cast<std::size_t>(size));
    Requests scatter(*this);
    for (int j = 0; j < size; ++j) {
      if (j == me) continue;
      scatter.send(bytes + chunk_begin(j) * element, (chunk_begin(j + 1) - chunk_begin(j)) * element, group.members[j],
                   tag(group, 1));
      received[j].resize(mine * element);
      scatter.recv(received[j].data(), mine * element, group.members[j], tag(group, 1));
    }
    scatter.wait(group, "all_reduce", label);
    sum_in_order(dtype, mine, me, bytes + chunk_begin(me) * element, received, bytes + chunk_begin(me) * element);
    // phase 2: all-gather the summed chunks
    Requests gather(*this);
    for (int j = 0; j < size; ++j) {
      if (j == me) continue;
      gather.send(bytes + chunk_begin(me) * element, mine * element, group.members[j], tag(group, 2));
      gather.recv(bytes + chunk_begin(j) * element, (chunk_begin(j + 1) - chunk_begin(j)) * element, group.members[j],
                  tag(group, 2));
    }
    gather.wait(group, "all_reduce", label);
  }

  void reduce_scatter(const CommGroup& group, const void* in, void* out, std::size_t count, DType dtype,
                      std::string_view label) override {
    const int me = index_in(group, rank_), size = static_cast<int>(group.members.size());
    check_sum_dtype(dtype, group, label);
    const std::size_t chunk = count * dtype_bytes(dtype);
    const auto* bytes = static_cast<const std::byte*>(in);
    std::vector<std::vector<std::byte>> received(static_cast<std::size_t>(size));
    Requests requests(*this);
    for (int j = 0; j < size; ++j) {
      if (j == me) continue;
      requests.send(bytes + chunk * static_cast<std::size_t>(j), chunk, group.members[j], tag(group, 1));
      received[j].resize(chunk);
      requests.recv(received[j].data(), chunk, group.members[j], tag(group, 1));
    }
    requests.wait(group, "reduce_scatter", label);
    sum_in_order(dtype, count, me, bytes + chunk * static_cast<std::size_t>(me), received,
                 static_cast<std::byte*>(out));
  }

  void all_gather(const CommGroup& group, const void* in, void* out, std::size_t count, DType dtype,
                  std::string_view label) override {
    const int me = index_in(group, rank_), size = static_cast<int>(group.members.size());
    const std::size_t chunk = count * dtype_bytes(dtype);
    auto* target = static_cast<std::byte*>(out);
    Requests requests(*this);
    for (int j = 0; j < size; ++j) {
      if (j == me) continue;
      requests.send(in, chunk, group.members[j], tag(group, 1));
      requests.recv(target + chunk * static_cast<std::size_t>(j), chunk, group.members[j], tag(group, 1));
    }
    std::byte* own = target + chunk * static_cast<std::size_t>(me);
    if (in != own && chunk > 0) std::memmove(own, in, chunk);
    requests.wait(group, "all_gather", label);
  }

  void broadcast(const CommGroup& group, void* data, std::size_t count, DType dtype, int root,
                 std::string_view label) override {
    const int me = index_in(group, rank_), size = static_cast<int>(group.members.size());
    const std::size_t bytes = count * dtype_bytes(dtype);
    Requests requests(*this);
    if (me == root) {
      for (int j = 0; j < size; ++j) {
        if (j != me) requests.send(data, bytes, group.members[j], tag(group, 1));
      }
    } else {
      requests.recv(data, bytes, group.members[root], tag(group, 1));
    }
    requests.wait(group, "broadcast", label);
  }

  void barrier(const CommGroup& group, std::string_view label) override {
    const int me = index_in(group, rank_), size = static_cast<int>(group.members.size());
    Requests requests(*this);
    for (int j = 0; j < size; ++j) {
      if (j == me) continue;
      requests.send(nullptr, 0, group.members[j], tag(group, 1));
      requests.recv(nullptr, 0, group.members[j], tag(group, 1));
    }
    requests.wait(group, "barrier", label);
  }

  // Every chunk posted at once (isend / irecv per peer), as the all-gather; messages of one tag between two ranks
  // arrive in order, so calls in the Program's order match. A chunk larger than expected fails in MPI (truncation).
  void all_to_all(const CommGroup& group, const void* in, const std::vector<std::size_t>& send_counts, void* out,
                  const std::vector<std::size_t>& recv_counts, DType dtype, std::string_view label) override {
    const int me = index_in(group, rank_), size = static_cast<int>(group.members.size());
    const std::vector<std::size_t> send_at = chunk_offsets(group, rank_, send_counts, label);
    const std::vector<std::size_t> recv_at = chunk_offsets(group, rank_, recv_counts, label);
    const std::size_t element = dtype_bytes(dtype);
    const auto* source = static_cast<const std::byte*>(in);
    auto* target = static_cast<std::byte*>(out);
    if (send_counts[me] != recv_counts[me]) {
      throw CommError(fmt::format("rank {}: all_to_all {} on the {} group: it sends itself {} elements, expects {}",
                                  rank_, label, group.kind, send_counts[me], recv_counts[me]));
    }
    Requests requests(*this);
    for (int j = 0; j < size; ++j) {
      if (j == me) continue;
      requests.send(source + send_at[j] * element, send_counts[j] * element, group.members[j], tag(group, 1));
      requests.recv(target + recv_at[j] * element, recv_counts[j] * element, group.members[j], tag(group, 1));
    }
    if (send_counts[me] > 0) {
      std::memcpy(target + recv_at[me] * element, source + send_at[me] * element, send_counts[me] * element);
    }
    requests.wait(group, "all_to_all", label);
  }

  void send(int peer, std::uint64_t tag, const void* data, std::size_t bytes) override {
    reap_sends();
    const int mpi_tag = p2p_tag(tag);
    auto& pending = pending_sends_.emplace_back();
    pending.bytes.resize(bytes);
    if (bytes > 0) std::memcpy(pending.bytes.data(), data, bytes);
    check(mpi_.isend(pending.bytes.data(), as_count(bytes), peer, mpi_tag, &pending.request), "MPI_Isend");
  }

  void recv(int peer, std::uint64_t tag, void* data, std::size_t bytes, std::string_view label) override {
    const int mpi_tag = p2p_tag(tag);
    const auto deadline = Clock::now() + std::chrono::duration<double>(options_.timeout_s);
    Backoff backoff;
    while (true) {
      reap_sends();
      int found = 0, count = 0;
      check(mpi_.iprobe(peer, mpi_tag, &found, &count), "MPI_Iprobe");
      if (found) {
        if (static_cast<std::size_t>(count) != bytes) {
          throw CommError(fmt::format("rank {}: recv {} from rank {}: the message has {} bytes, expected {}", rank_,
                                      label, peer, count, bytes));
        }
        check(mpi_.recv(data, as_count(bytes), peer, mpi_tag), "MPI_Recv");
        return;
      }
      if (Clock::now() > deadline) {
        throw CommError(
            fmt::format("rank {}: recv {} from rank {} timed out after {} s: rank {} never sent it "
                        "(dead, stuck or out of step)",
                        rank_, label, peer, options_.timeout_s, peer));
      }
      backoff.pause();
    }
  }

  void abort(std::string_view reason) override {
    std::fprintf(stderr, "twin: rank %d failed, aborting the MPI job: %.*s\n", rank_, static_cast<int>(reason.size()),
                 reason.data());
    std::fflush(stderr);
    mpi_.abort(1);
  }

 private:
  // The non-blocking sends and receives of one collective phase, and the peer of each.
  class Requests {
   public:
    explicit Requests(MpiCommunicator& self) : self_(self) {}
    ~Requests() {
      for (void*& request : requests_) {
        if (request != nullptr) self_.mpi_.cancel(&request);
      }
    }
    Requests(const Requests&) = delete;
    Requests& operator=(const Requests&) = delete;

    void send(const void* data, std::size_t bytes, int peer, int tag) {
      requests_.push_back(nullptr);
      peers_.push_back(peer);
      self_.check(self_.mpi_.isend(data, as_count(bytes), peer, tag, &requests_.back()), "MPI_Isend");
    }
    void recv(void* data, std::size_t bytes, int peer, int tag) {
      requests_.push_back(nullptr);
      peers_.push_back(peer);
      self_.check(self_.mpi_.irecv(data, as_count(bytes), peer, tag, &requests_.back()), "MPI_Irecv");
    }
    void wait(const CommGroup& group, std::string_view kind, std::string_view label) {
      const auto deadline = Clock::now() + std::chrono::duration<double>(self_.options_.timeout_s);
      Backoff backoff;
      while (true) {
        bool all_done = true;
        for (void*& request : requests_) {
          int done = 1;
          if (request != nullptr) self_.check(self_.mpi_.test(&request, &done), "MPI_Test");
          all_done = all_done && done;
        }
        if (all_done) return;
        self_.reap_sends();
        if (Clock::now() > deadline) {
          std::vector<int> missing;
          for (std::size_t i = 0; i < requests_.size(); ++i) {
            if (requests_[i] != nullptr && std::find(missing.begin(), missing.end(), peers_[i]) == missing.end()) {
              missing.push_back(peers_[i]);
            }
          }
          std::sort(missing.begin(), missing.end());
          const bool named = label.find(kind) != std::string_view::npos;  // as the threads communicator words it
          throw CommError(fmt::format("rank {}: {}{}{} on the {} group ({}) timed out after {} s: {} did not arrive",
                                      self_.rank_, named ? "" : kind, named ? "" : " ", label, group.kind,
                                      format_ranks(group.members), self_.options_.timeout_s, format_ranks(missing)));
        }
        backoff.pause();
      }
    }

   private:
    MpiCommunicator& self_;
    std::vector<void*> requests_;
    std::vector<int> peers_;
  };

  struct PendingSend {
    std::vector<std::byte> bytes;
    void* request = nullptr;
  };

  void check(int code, const char* call) const {
    if (code == 0) return;
    char text[512];
    mpi_.error_string(code, text, sizeof(text));
    throw CommError(fmt::format("rank {}: {} failed: {}", rank_, call, text));
  }

  void reap_sends() {
    for (auto it = pending_sends_.begin(); it != pending_sends_.end();) {
      int done = 0;
      mpi_.test(&it->request, &done);
      it = done ? pending_sends_.erase(it) : std::next(it);
    }
  }

  int p2p_tag(std::uint64_t tag) const {
    if (tag >= kMaxP2PTag || kP2PTagBase + tag > static_cast<std::uint64_t>(mpi_.tag_upper_bound)) {
      throw CommError(fmt::format("rank {}: message tag {} exceeds this MPI's tag space (MPI_TAG_UB = {})", rank_, tag,
                                  mpi_.tag_upper_bound));
    }
    return kP2PTagBase + static_cast<int>(tag);
  }

  int tag(const CommGroup& group, int phase) const { return kind_index(group.kind) * 2 + phase; }

  void check_sum_dtype(DType dtype, const CommGroup& group, std::string_view label) const {
    if (dtype != DType::F32 && dtype != DType::F64) {
      throw CommError(fmt::format("rank {}: {} on the {} group: the mpi communicator sums f32 or f64, not {}", rank_,
                                  label, group.kind, to_string(dtype)));
    }
  }

  // out (count) = sum over members j in order of (j == me ? own : received[j]); out may alias own.
  static void sum_in_order(DType dtype, std::size_t count, int me, const std::byte* own,
                           const std::vector<std::vector<std::byte>>& received, std::byte* out) {
    if (dtype == DType::F32) {
      sum_typed<float>(count, me, own, received, out);
    } else {
      sum_typed<double>(count, me, own, received, out);
    }
  }
  template <typename T>
  static void sum_typed(std::size_t count, int me, const std::byte* own,
                        const std::vector<std::vector<std::byte>>& received, std::byte* out) {
    auto source = [&](int j) {
      return reinterpret_cast<const T*>(j == me ? own : received[static_cast<std::size_t>(j)].data());
    };
    std::vector<T> sum(source(0), source(0) + count);
    for (int j = 1; j < static_cast<int>(received.size()); ++j) {
      const T* x = source(j);
      for (std::size_t k = 0; k < count; ++k) sum[k] += x[k];
    }
    if (count > 0) std::memcpy(out, sum.data(), count * sizeof(T));
  }

  const TwinMpiApi& mpi_;
  CommOptions options_;
  int rank_ = 0, size_ = 1;
  std::list<PendingSend> pending_sends_;
};

// Posted messages carry their own tag, above every Program's, so a mailbox and a communicator never mix.
class Mailbox final : public MpiMailbox {
 public:
  explicit Mailbox(const TwinMpiApi& api) : mpi_(api) { check(mpi_.init(&rank_, &size_), "MPI initialisation"); }

  ~Mailbox() override {
    // The last messages (a rank's final report) must leave before MPI goes away; a dead receiver does not hold
    // this rank for long.
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (!pending_.empty() && Clock::now() < deadline) {
      reap();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    mpi_.finalize();
  }

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }

  void post(int peer, std::string message) override {
    reap();
    auto& pending = pending_.emplace_back();
    pending.text = std::move(message);
    check(mpi_.isend(pending.text.data(), as_count(pending.text.size()), peer, kTag, &pending.request), "MPI_Isend");
  }

  std::optional<std::string> take(int peer) override {
    reap();
    int found = 0, count = 0;
    check(mpi_.iprobe(peer, kTag, &found, &count), "MPI_Iprobe");
    if (!found) return std::nullopt;
    std::string message(static_cast<std::size_t>(count), '\0');
    check(mpi_.recv(message.data(), count, peer, kTag), "MPI_Recv");
    return message;
  }

 private:
  static constexpr int kTag = kP2PTagBase - 1;  // below the point-to-point tags, above the collectives'
  static_assert(2 * (model::kGroupCount + 1) <= kTag, "the mailbox's tag stays above the collectives'");
  struct Pending {
    std::string text;
    void* request = nullptr;
  };

  void check(int code, const char* call) const {
    if (code == 0) return;
    char text[512];
    mpi_.error_string(code, text, sizeof(text));
    throw CommError(fmt::format("rank {}: {} failed: {}", rank_, call, text));
  }

  void reap() {
    for (auto it = pending_.begin(); it != pending_.end();) {
      int done = 0;
      mpi_.test(&it->request, &done);
      it = done ? pending_.erase(it) : std::next(it);
    }
  }

  const TwinMpiApi& mpi_;
  int rank_ = 0, size_ = 1;
  std::list<Pending> pending_;
};

#endif  // TWIN_HAVE_MPI

}  // namespace

bool have_mpi() {
#ifdef TWIN_HAVE_MPI
  return true;
#else
  return false;
#endif
}

void abort_mpi_job(int exit_code) {
  std::fflush(nullptr);
#ifdef TWIN_HAVE_MPI
  std::string problem;
  if (const TwinMpiApi* api = load_shim(problem)) api->abort(exit_code);
#endif
  std::_Exit(exit_code);
}

std::unique_ptr<Communicator> make_mpi_communicator(CommOptions options) {
#ifdef TWIN_HAVE_MPI
  std::string problem;
  const TwinMpiApi* api = load_shim(problem);
  if (api == nullptr) throw CommError("the mpi launcher needs MPI: " + problem);
  return std::make_unique<MpiCommunicator>(*api, options);
#else
  (void)options;
  throw CommError("this twin was built without MPI (apt install libopenmpi-dev openmpi-bin, then rebuild)");
#endif
}

std::unique_ptr<MpiMailbox> open_mpi_mailbox() {
#ifdef TWIN_HAVE_MPI
  std::string problem;
  const TwinMpiApi* api = load_shim(problem);
  if (api == nullptr) throw CommError("spreading simulations over MPI ranks needs MPI: " + problem);
  return std::make_unique<Mailbox>(*api);
#else
  throw CommError("this twin was built without MPI (apt install libopenmpi-dev openmpi-bin, then rebuild)");
#endif
}

}  // namespace twin::exec
