// simulate(): checks, then runs the Engine in a forked child (SimGrid allows one simulation per process) and reads
// the result back through a pipe.
#include "sim/simulate.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "sim/engine.hpp"
#include "topology/placement.hpp"

namespace twin::sim {

std::string_view to_string(Fidelity fidelity) {
  switch (fidelity) {
    case Fidelity::Auto:
      return "auto";
    case Fidelity::Rank:
      return "rank";
    case Fidelity::Group:
      return "group";
    case Fidelity::Replica:
      return "replica";
  }
  return "?";
}

Fidelity parse_fidelity(std::string_view text) {
  for (Fidelity fidelity : {Fidelity::Auto, Fidelity::Rank, Fidelity::Group, Fidelity::Replica}) {
    if (text == to_string(fidelity)) return fidelity;
  }
  throw std::invalid_argument("unknown fidelity '" + std::string(text) + "' (expected rank, group, replica or auto)");
}

Fidelity choose_fidelity(const model::Program& program, const SimOptions& options) {
  topology::NodeSpec node;
  try {
    node = options.node ? *options.node : topology::node_spec(program.scenario.cluster);
  } catch (const std::invalid_argument& error) {
    throw SimulationError(error.what());
  }
  std::optional<topology::Placement> placement;
  try {
    placement.emplace(program.layout, node.gpus, options.placement);
  } catch (const std::invalid_argument& error) {
    throw SimulationError(error.what());
  }
  const int tp = program.layout.tp();
  const bool group_possible = node.gpus % tp == 0 && placement->tensor_groups_inside_nodes();
  switch (options.fidelity) {
    case Fidelity::Rank:
      return Fidelity::Rank;
    case Fidelity::Group:
      if (!group_possible) {
        throw SimulationError(
            fmt::format("group fidelity needs every TP group inside one node (TP {} on {}-GPU nodes, "
                        "placement {}); use --fidelity rank",
                        tp, node.gpus, placement->order()));
      }
      return Fidelity::Group;
    case Fidelity::Replica:
      if (!group_possible) {
        throw SimulationError(
            fmt::format("replica fidelity needs every TP group inside one node (TP {} on {}-GPU nodes, "
                        "placement {}); use --fidelity rank",
                        tp, node.gpus, placement->order()));
      }
      if (!options.degradations.empty()) {
        throw SimulationError(
            "--fidelity replica: --slow-gpu, --slow-link and --failed-uplink make one replica unlike the others, "
            "which replica fidelity mirrors: use --fidelity group");
      }
      return Fidelity::Replica;
    case Fidelity::Auto:
      if (!group_possible || program.layout.world_size() <= options.group_fidelity_above_gpus) return Fidelity::Rank;
      return program.layout.world_size() > options.replica_fidelity_above_gpus && replica_exact_enough(program, options)
                 ? Fidelity::Replica
                 : Fidelity::Group;
  }
  return Fidelity::Rank;
}

namespace {

// --- a tiny binary encoding of SimResult for the pipe -------------------------------------------------------------
class Writer {
 public:
  template <typename T>
  void put(const T& value) {
    const auto* bytes = reinterpret_cast<const char*>(&value);
    data_.append(bytes, sizeof(T));
  }
  void put_string(const std::string& text) {
    put<std::uint64_t>(text.size());
    data_ += text;
  }
  const std::string& data() const { return data_; }

 private:
  std::string data_;
};

class Reader {
 public:
  explicit Reader(const std::string& data) : data_(data) {}
  template <typename T>
  T get() {
    if (position_ + sizeof(T) > data_.size()) throw SimulationError("simulation child: truncated result");
    T value;
    std::memcpy(&value, data_.data() + position_, sizeof(T));
    position_ += sizeof(T);
    return value;
  }
  std::string get_string() {
    const auto size = get<std::uint64_t>();
    if (position_ + size > data_.size()) throw SimulationError("simulation child: truncated result");
    std::string text = data_.substr(position_, size);
    position_ += size;
    return text;
  }

 private:
  const std::string& data_;
  std::size_t position_ = 0;
};

std::string encode(const SimResult& result) {
  Writer w;
  w.put<std::uint8_t>(0);
  w.put(result.fidelity);
  w.put_string(result.hardware);
  w.put(result.peak_flops_per_gpu);
  w.put(result.gpu_memory_bytes);
  w.put(result.stats);
  w.put_string(result.timeline.engine);
  w.put(result.timeline.iteration_time_s);
  w.put<std::uint64_t>(result.timeline.ranks.size());
  for (const auto& rank : result.timeline.ranks) {
    w.put(rank.rank);
    w.put(rank.stage);
    w.put<std::uint64_t>(rank.spans.size());
    for (const auto& span : rank.spans) w.put(span);
  }
  return w.data();
}

SimResult decode(const std::string& data) {
  Reader r(data);
  if (r.get<std::uint8_t>() != 0) throw SimulationError(r.get_string());
  SimResult result;
  result.fidelity = r.get<Fidelity>();
  result.hardware = r.get_string();
  result.peak_flops_per_gpu = r.get<double>();
  result.gpu_memory_bytes = r.get<double>();
  result.stats = r.get<EngineStats>();
  result.timeline.engine = r.get_string();
  result.timeline.iteration_time_s = r.get<double>();
  const auto ranks = r.get<std::uint64_t>();
  for (std::uint64_t i = 0; i < ranks; ++i) {
    report::RankTimeline rank;
    rank.rank = r.get<int>();
    rank.stage = r.get<int>();
    const auto spans = r.get<std::uint64_t>();
    rank.spans.resize(spans);
    for (auto& span : rank.spans) span = r.get<report::OpSpan>();
    result.timeline.ranks.push_back(std::move(rank));
  }
  return result;
}

std::string encode_error(const std::string& message) {
  Writer w;
  w.put<std::uint8_t>(1);
  w.put_string(message);
  return w.data();
}

double peak_rss_bytes(int who) {
  rusage usage{};
  getrusage(who, &usage);
  return static_cast<double>(usage.ru_maxrss) * 1024.0;  // Linux: kilobytes
}

SimResult run_here(const model::Program& program, const CostModel& cost, const SimOptions& options) {
  detail::Engine engine(program, cost, options);
  SimResult result = engine.run();
  result.stats.peak_rss_bytes = peak_rss_bytes(RUSAGE_SELF);
  return result;
}

bool write_all(int fd, const std::string& data) {
  std::size_t written = 0;
  while (written < data.size()) {
    const ssize_t n = ::write(fd, data.data() + written, data.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    written += static_cast<std::size_t>(n);
  }
  return true;
}

SimResult run_isolated(const model::Program& program, const CostModel& cost, const SimOptions& options) {
  int fds[2];
  if (::pipe(fds) != 0) throw SimulationError(std::string("pipe: ") + std::strerror(errno));
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t child = ::fork();
  if (child < 0) throw SimulationError(std::string("fork: ") + std::strerror(errno));
  if (child == 0) {
    ::close(fds[0]);
    std::string message;
    try {
      message = encode(run_here(program, cost, options));
    } catch (const std::exception& error) {
      message = encode_error(error.what());
    } catch (...) {
      message = encode_error("unknown error in the simulation");
    }
    const bool ok = write_all(fds[1], message);
    ::close(fds[1]);
    std::fflush(stderr);
    ::_exit(ok ? 0 : 1);
  }
  ::close(fds[1]);
  std::string data;
  char buffer[1 << 16];
  const auto started = std::chrono::steady_clock::now();
  bool timed_out = false;
  while (true) {
    if (options.wall_limit_s > 0) {
      const double left =
          options.wall_limit_s - std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      pollfd readable{fds[0], POLLIN, 0};
      if (left <= 0 || ::poll(&readable, 1, static_cast<int>(left * 1000) + 1) == 0) {
        timed_out = true;
        ::kill(child, SIGKILL);
        break;
      }
    }
    const ssize_t n = ::read(fds[0], buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    data.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  rusage usage{};
  while (::wait4(child, &status, 0, &usage) < 0 && errno == EINTR) {
  }
  if (timed_out) throw SimulationError(fmt::format("stopped after the wall-time limit of {} s", options.wall_limit_s));
  if (data.empty()) {
    if (WIFSIGNALED(status)) {
      throw SimulationError(
          fmt::format("the simulation process died of signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status))));
    }
    throw SimulationError(fmt::format("the simulation process exited with status {} and no result",
                                      WIFEXITED(status) ? WEXITSTATUS(status) : -1));
  }
  SimResult result = decode(data);
  result.stats.peak_rss_bytes = static_cast<double>(usage.ru_maxrss) * 1024.0;
  return result;
}

}  // namespace

SimResult simulate(const model::Program& program, const CostModel& cost, const SimOptions& options) {
  choose_fidelity(program, options);  // user errors surface here, before any process is forked
  if (program.stages() != program.layout.pp()) throw SimulationError("program: one op list per stage expected");
  return options.isolate ? run_isolated(program, cost, options) : run_here(program, cost, options);
}

}  // namespace twin::sim
