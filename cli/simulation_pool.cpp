// Child `twin sim` processes: spawned with posix_spawn on /proc/self/exe (the same binary), stdout discarded, stderr
// kept in a log beside the --json summary in a scratch folder that is removed afterwards.
#include "cli/simulation_pool.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <system_error>
#include <thread>

#include <fmt/core.h>

#include "model/scenario/errors.hpp"

extern char** environ;

namespace twin::cli {
namespace {

namespace fs = std::filesystem;

pid_t start_simulation(const std::string& scenario_path, const std::vector<std::string>& overrides,
                       const std::vector<std::string>& extra_arguments, const fs::path& json_path,
                       const fs::path& log_path, const std::string& command) {
  std::vector<std::string> args{"/proc/self/exe", "sim", scenario_path, "--quiet", "--json", json_path.string()};
  for (const auto& set : overrides) args.insert(args.end(), {"--set", set});
  args.insert(args.end(), extra_arguments.begin(), extra_arguments.end());
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = 0;
  const int error = posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (error != 0)
    throw std::runtime_error(fmt::format("twin {}: cannot start a simulation: {}", command, strerror(error)));
  return pid;
}

SimulationOutcome read_outcome(const fs::path& json_path, const fs::path& log_path, int status) {
  SimulationOutcome outcome;
  outcome.exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(json_path);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || !in) {
    std::ifstream log(log_path);
    std::string line, last;
    while (std::getline(log, line)) {
      if (!line.empty()) last = line;
    }
    outcome.error = last.empty() ? "simulation failed" : last;
    return outcome;
  }
  try {
    outcome.summary = nlohmann::json::parse(in);
    // A variant's row never draws its pipeline, and on a large plan the boxes are most of the document: a search's
    // tens of summaries are kept without them.
    outcome.summary.erase("pipeline");
  } catch (const nlohmann::json::exception& error) {
    outcome.error = fmt::format("unreadable summary {}: {}", json_path.string(), error.what());
  }
  return outcome;
}

}  // namespace

std::vector<SimulationOutcome> simulate_in_children(const std::string& scenario_path,
                                                    const std::vector<std::vector<std::string>>& override_lists,
                                                    int jobs, const std::string& command,
                                                    const std::vector<std::string>& extra_arguments, bool progress) {
  return simulate_in_children(scenario_path, override_lists, jobs, command, extra_arguments, progress, PoolHooks{});
}

std::vector<SimulationOutcome> simulate_in_children(const std::string& scenario_path,
                                                    const std::vector<std::vector<std::string>>& override_lists,
                                                    int jobs, const std::string& command,
                                                    const std::vector<std::string>& extra_arguments, bool progress,
                                                    const PoolHooks& hooks) {
  std::vector<SimulationOutcome> outcomes(override_lists.size(), SimulationOutcome{{}, "not simulated", -1});
  const fs::path scratch = fs::temp_directory_path() / fmt::format("twin-{}-{}", command, getpid());
  fs::create_directories(scratch);
  std::map<pid_t, std::size_t> running;
  // However this ends (a spawn that fails midway included), no child outlives it and the scratch folder goes.
  struct Cleanup {
    const fs::path& scratch;
    std::map<pid_t, std::size_t>& running;
    ~Cleanup() {
      for (const auto& [pid, index] : running) {
        kill(pid, SIGTERM);
        waitpid(pid, nullptr, 0);
      }
      std::error_code ignored;
      fs::remove_all(scratch, ignored);
    }
  } cleanup{scratch, running};
  auto paths = [&scratch](std::size_t i) {
    return std::pair{scratch / fmt::format("variant-{}.json", i), scratch / fmt::format("variant-{}.log", i)};
  };
  std::size_t next = 0, done = 0;
  const auto started = std::chrono::steady_clock::now();
  const bool on_terminal = isatty(STDERR_FILENO) != 0;
  while (done < override_lists.size()) {
    while (next < override_lists.size() && running.size() < static_cast<std::size_t>(jobs)) {
      const auto [json, log] = paths(next);
      running[start_simulation(scenario_path, override_lists[next], extra_arguments, json, log, command)] = next;
      ++next;
    }
    int status = 0;
    // With a tick to call, look every 20 ms instead of sleeping until a child ends.
    const pid_t pid = waitpid(-1, &status, hooks.tick ? WNOHANG : 0);
    if (pid == 0) {
      hooks.tick();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    if (pid < 0) break;
    const auto it = running.find(pid);
    if (it == running.end()) continue;
    const auto [json, log] = paths(it->second);
    outcomes[it->second] = read_outcome(json, log, status);
    if (hooks.finished) hooks.finished(it->second, outcomes[it->second]);
    running.erase(it);
    ++done;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    // What is left at the pace so far (the variants differ in size, so it is a guide).
    const std::size_t left = override_lists.size() - done;
    const std::string eta = left > 0 ? fmt::format(", about {:.0f} s left", elapsed / done * left) : "";
    if (progress) {
      fmt::print(stderr, "{}[twin {}] {}/{} simulated, {:.0f} s{}{}", on_terminal ? "\r" : "", command, done,
                 override_lists.size(), elapsed, eta, on_terminal ? "   " : "\n");
    }
  }
  if (progress && on_terminal) fmt::print(stderr, "\n");
  return outcomes;
}

int default_jobs() {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // The launcher's count of ranks on this host (mpirun, MPICH / Intel MPI, srun).
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_STEP_TASKS_PER_NODE"}) {
    if (const char* value = std::getenv(name)) return std::max(1, cores / std::max(1, std::atoi(value)));
  }
  return cores;
}

void require_a_run_to_price(bool priced, bool train_tokens_given) {
  if (priced && !train_tokens_given) {
    throw twin::UserError("--usd-per-gpu-hour prices a training run's GPU-hours: give its length with --train-tokens");
  }
}

std::vector<std::string> child_sim_arguments(const std::string& train_tokens, const std::string& usd_per_gpu_hour,
                                             bool goodput) {
  require_a_run_to_price(!usd_per_gpu_hour.empty(), !train_tokens.empty());
  std::vector<std::string> arguments;
  if (!train_tokens.empty()) arguments = {"--train-tokens", train_tokens};
  if (!usd_per_gpu_hour.empty()) arguments.insert(arguments.end(), {"--usd-per-gpu-hour", usd_per_gpu_hour});
  if (goodput) arguments.push_back("--goodput");
  return arguments;
}

}  // namespace twin::cli
