// `twin run SCENARIO`: train for real with the executor (exec/): the same Program the simulator replays.
//   --launcher threads   every rank is a thread of this process (default)
//   --launcher mpi       re-executes this command under `mpirun -np WORLD`; each process joins as its rank
//   (started by mpirun or srun: OMPI_COMM_WORLD_RANK / PMI_RANK / SLURM_PROCID set) joins the job as its rank
// Rank 0 prints a progress line (step, loss, tokens/s, ETA) on stderr and writes --json / --trace at the end.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fmt/core.h>
#include <fmt/format.h>

#include "cli/commands.hpp"
#include "exec/checkpoint/checkpoint.hpp"
#include "exec/comm/mpi_communicator.hpp"
#include "exec/core/errors.hpp"
#include "exec/train/data.hpp"
#include "exec/train/faults.hpp"
#include "exec/train/guards.hpp"
#include "exec/train/run_report.hpp"
#include "exec/train/trainer.hpp"
#include "model/program/estimates.hpp"
#include "model/program/program.hpp"

namespace twin::cli {
namespace {

namespace fs = std::filesystem;

struct RunOptions {
  ScenarioOptions scenario;
  std::string backend = "cpu";
  std::string launcher = "threads";
  int steps = 50;
  std::string data;
  std::string checkpoint;
  int checkpoint_every = 0;
  int keep_checkpoints = 2;
  bool no_resume = false;
  std::string json;
  std::string trace;
  int trace_step = -1;
  double timeout_s = 60;
  int threads = 0;
  double peak_gflops = 0;
  bool quiet = false;
  bool skip_nonfinite = false;
  double loss_spike_factor = exec::kLossSpikeFactor;
  double weight_growth_limit = exec::kWeightGrowthLimit;
  std::string inject_failure;  // --inject-failure STEP:RANK (empty: none)
  int restarts = 0;            // --restarts N: relaunches from the last checkpoint after a failed run
  std::string inject_slow;     // --inject-slow RANK:FACTOR (empty: none)
};

// --inject-slow RANK:FACTOR: that rank's compute takes FACTOR (> 1) times as long (exec/train/faults.hpp, SlowRank).
exec::SlowRank slow_rank(const std::string& text) {
  const std::size_t colon = text.find(':');
  exec::SlowRank slow;
  try {
    std::size_t used = 0;
    if (colon == std::string::npos) throw std::invalid_argument("no colon");
    slow.rank = std::stoi(text.substr(0, colon), &used);
    if (used != colon) throw std::invalid_argument("rank");
    slow.factor = std::stod(text.substr(colon + 1), &used);
    if (used != text.size() - colon - 1) throw std::invalid_argument("factor");
  } catch (const std::exception&) {
    throw UserError(fmt::format("--inject-slow '{}': expected RANK:FACTOR, e.g. 1:3 (rank 1 computes 3 times as slowly)",
                                text));
  }
  if (slow.rank < 0 || !(slow.factor > 1) || !std::isfinite(slow.factor) || slow.factor > 1000) {
    throw UserError(fmt::format("--inject-slow '{}': the rank must be >= 0 and the factor above 1 and at most 1000",
                                text));
  }
  return slow;
}

// --inject-failure STEP:RANK: TWIN_FAULT's throw mode, from a flag (exec/train/faults.hpp).
exec::FaultInjection injected_failure(const std::string& text, int steps) {
  const std::size_t colon = text.find(':');
  int step = 0, rank = -1;
  try {
    std::size_t used = 0;
    if (colon == std::string::npos) throw std::invalid_argument("no colon");
    step = std::stoi(text.substr(0, colon), &used);
    if (used != colon) throw std::invalid_argument("step");
    rank = std::stoi(text.substr(colon + 1), &used);
    if (used != text.size() - colon - 1) throw std::invalid_argument("rank");
  } catch (const std::exception&) {
    throw UserError(fmt::format("--inject-failure '{}': expected STEP:RANK, e.g. 3:1 (step 1-based)", text));
  }
  if (step < 1 || step > steps || rank < 0) {
    throw UserError(fmt::format("--inject-failure '{}': the step must be 1..--steps ({}) and the rank >= 0", text,
                                steps));
  }
  exec::FaultInjection fault;
  fault.mode = exec::FaultInjection::Mode::Throw;
  fault.rank = rank;
  fault.step = step - 1;  // the trainer counts steps from 0
  return fault;
}

// The rank this process has in a job started by mpirun / srun, if any.
bool started_by_launcher() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

// Whether this process is a rank other than 0 of a job started by mpirun / srun (it leaves notes to rank 0).
bool launcher_rank_nonzero() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"}) {
    if (const char* value = std::getenv(name)) return std::atoi(value) != 0;
  }
  return false;
}

int ranks_on_this_host(int world) {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"}) {
    if (const char* value = std::getenv(name)) return std::max(1, std::atoi(value));
  }
  return world;
}

std::string default_data_path() {
  return (fs::path(TWIN_SCENARIO_DIR).parent_path() / "data" / "corpus.txt").string();
}

std::string duration(double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return "?";
  const long s = std::lround(seconds);
  if (s >= 3600) return fmt::format("{}h{:02d}m", s / 3600, (s / 60) % 60);
  if (s >= 60) return fmt::format("{}m{:02d}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

std::string rate(double tokens_per_s) {
  return tokens_per_s >= 1e3 ? fmt::format("{:.1f}k tok/s", tokens_per_s / 1e3)
                             : fmt::format("{:.0f} tok/s", tokens_per_s);
}

// The progress line of rank 0: redrawn in place on a terminal, one line every few steps otherwise.
class Progress {
 public:
  explicit Progress(bool quiet) : quiet_(quiet), tty_(isatty(2) != 0) {}
  void step(const exec::StepReport& r) {
    if (quiet_) return;
    recent_.push_back(r.iteration_time_s);
    if (recent_.size() > 10) recent_.erase(recent_.begin());
    double mean = 0;
    for (double t : recent_) mean += t;
    mean /= static_cast<double>(recent_.size());
    const int done = r.step + 1;
    const std::string loss = r.skipped ? "skipped (non-finite)" : fmt::format("{:.4f}", r.loss);
    const std::string line =
        fmt::format("step {}/{}  loss {}  grad norm {:.3f}  lr {:.2e}  {}  ETA {}", done, r.steps, loss, r.grad_norm,
                    r.learning_rate, rate(r.tokens_per_s), duration(mean * (r.steps - done)));
    if (tty_) {
      fmt::print(stderr, "\r{:<100}", line);
      in_place_ = done != r.steps;
      if (done == r.steps) fmt::print(stderr, "\n");
    } else if (r.skipped || done == r.steps || done % std::max(1, r.steps / 20) == 0 || done <= 1) {
      fmt::print(stderr, "{}\n", line);
    }
    if (r.straggler.reported()) {
      if (tty_ && in_place_) fmt::print(stderr, "\n");
      fmt::print(stderr,
                 "straggler: step {}: rank {} computed {:.3f} s, {:.3f} s ({:.0f} %) more than its peers' median speed "
                 "gives its work; they waited {:.3f} s\n",
                 done, r.straggler.rank, r.straggler.compute_s, r.straggler.lag_s, 100 * r.straggler.lag_fraction,
                 r.straggler.peers_wait_s);
    }
    std::fflush(stderr);
  }
  void note(const std::string& text) {
    if (!quiet_) fmt::print(stderr, "{}\n", text);
  }
  // A progress line is on the terminal without its newline (an error must start on a line of its own).
  bool drawn_in_place() const { return in_place_; }

 private:
  bool quiet_, tty_;
  bool in_place_ = false;
  std::vector<double> recent_;
};

// argv of this process, from /proc/self/cmdline (CLI11 does not keep it).
std::vector<std::string> own_arguments() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  std::string current;
  for (char c : all) {
    if (c == '\0') {
      args.push_back(current);
      current.clear();
    } else {
      current.push_back(c);
    }
  }
  return args;
}

// The pid of the mpirun this process waits for, for the signal handler below (0: none).
volatile sig_atomic_t mpirun_pid = 0;

// Ctrl-C or a scheduler's SIGTERM reaches this process, which passes it on to mpirun (which ends its ranks).
void forward_to_mpirun(int signal) {
  if (mpirun_pid > 0) kill(static_cast<pid_t>(mpirun_pid), signal);
}

// `args` without `flag` and its value ("--flag V" or "--flag=V").
std::vector<std::string> without_flag(const std::vector<std::string>& args, const std::string& flag) {
  std::vector<std::string> kept;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == flag) {
      ++i;  // and its value
    } else if (args[i].rfind(flag + "=", 0) != 0) {
      kept.push_back(args[i]);
    }
  }
  return kept;
}

// Runs `mine` (this command's arguments) under mpirun, one rank per process, and returns its status. A rank that
// failed printed its own `twin: error:` line (exit 1 or 2, passed on); a rank that was killed (out of memory, a signal)
// could not, and mpirun's notice names it: then this process adds the one line that says the run failed (status 1).
int status_under_mpirun(int world, const std::vector<std::string>& mine) {
  std::vector<std::string> args = {"mpirun", "-np", std::to_string(world), "--bind-to", "none", "--oversubscribe"};
  if (geteuid() == 0) args.emplace_back("--allow-run-as-root");
  std::error_code error;
  const fs::path self = fs::read_symlink("/proc/self/exe", error);
  args.push_back(error ? mine.at(0) : self.string());
  args.insert(args.end(), mine.begin() + 1, mine.end());
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  fmt::print(stderr, "twin run: launching {} ranks: {}\n", world, fmt::join(args.begin(), args.begin() + 6, " "));
  std::fflush(stderr);
  std::fflush(stdout);
  int ready[2];  // closed on a successful exec: a read of 0 bytes says mpirun started, 4 bytes carry exec's errno
  if (pipe2(ready, O_CLOEXEC) != 0) throw std::runtime_error(fmt::format("pipe: {}", std::strerror(errno)));
  const pid_t child = fork();
  if (child < 0) throw std::runtime_error(fmt::format("fork: {}", std::strerror(errno)));
  if (child == 0) {
    close(ready[0]);
    execvp("mpirun", argv.data());
    const int exec_error = errno;
    [[maybe_unused]] const ssize_t written = write(ready[1], &exec_error, sizeof exec_error);
    _exit(127);
  }
  close(ready[1]);
  int exec_error = 0;
  const bool exec_failed = read(ready[0], &exec_error, sizeof exec_error) == sizeof exec_error;
  close(ready[0]);
  if (exec_failed) {
    waitpid(child, nullptr, 0);
    throw UserError(fmt::format("--launcher mpi: cannot run mpirun ({}); install openmpi-bin or use --launcher threads",
                                std::strerror(exec_error)));
  }
  mpirun_pid = child;
  std::signal(SIGINT, forward_to_mpirun);
  std::signal(SIGTERM, forward_to_mpirun);
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  mpirun_pid = 0;
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (code == 0 || code == 1 || code == 2) return code;  // the ranks reported it
  fmt::print(stderr,
             "twin: error: the MPI job failed (mpirun exited with status {}): a rank was killed before it could say "
             "why; mpirun's message above names it\n",
             code);
  return 1;
}

// Runs this same command under mpirun and ends with its status. With --restarts N, a job that failed (status 1: a
// rank failed or was killed) is launched again, up to N times, and resumes from the newest checkpoint, as torchrun's
// elastic agent restarts its workers; the ranks are not given --restarts (they are the job, not its agent), and an
// injected failure (--inject-failure, TWIN_FAULT) strikes the first launch only, as a real fault does.
[[noreturn]] void relaunch_under_mpirun(const RunOptions& o, int world) {
  std::vector<std::string> args = without_flag(own_arguments(), "--restarts");
  for (int restart = 0;; ++restart) {
    const int code = status_under_mpirun(world, args);
    if (code != 1 || restart >= o.restarts) throw CLI::RuntimeError(code);
    fmt::print(stderr, "twin run: the MPI job failed; restart {} of {} from the newest checkpoint in {}\n",
               restart + 1, o.restarts, o.checkpoint);
    args = without_flag(args, "--inject-failure");
    unsetenv("TWIN_FAULT");
  }
}

void write_outputs(const RunOptions& o, const model::Program& program, const exec::TrainResult& result,
                   const std::string& engine) {
  if (!o.json.empty()) {
    write_file_atomically(o.json, exec::run_json(program, result, engine, o.peak_gflops * 1e9).dump(2) + "\n");
  }
  if (!o.trace.empty()) write_file_atomically(o.trace, exec::run_trace(program, result));
}

void print_summary(const model::Program& program, const exec::TrainResult& r, const std::string& engine,
                   double elapsed_s) {
  if (r.losses.empty()) {
    fmt::print(stderr, "nothing to do: the checkpoint is already at step {} of {}\n", r.first_step, r.steps);
    return;
  }
  double mean_time = 0;
  for (double t : r.iteration_time_s) mean_time += t;
  mean_time /= static_cast<double>(r.iteration_time_s.size());
  fmt::print(stderr, "trained steps {}..{} ({}) in {}: loss {:.4f} -> {:.4f}, {:.3f} s per step, {}\n",
             r.first_step + 1, r.steps, engine, duration(elapsed_s), r.losses.front(), r.losses.back(), mean_time,
             rate(r.tokens_per_s));
  if (const std::string kernels = exec::compute_by_kernel_note(program, r); !kernels.empty()) {
    fmt::print(stderr, "{}\n", kernels);
  }
  if (!r.last_checkpoint.empty()) fmt::print(stderr, "checkpoint: {}\n", r.last_checkpoint);
}

[[noreturn]] void fail(const std::string& message) {
  fmt::print(stderr, "twin: error: {}\n", message);
  throw CLI::RuntimeError(1);
}

// Refuses a run whose ranks in this process cannot fit in host memory, before allocating anything: fp32 weights,
// gradients and Adam state (16 bytes per parameter) plus the schedule's stashed activations, per rank.
void check_host_memory(const model::Scenario& scenario, int ranks_here) {
  model::Scenario fp32 = scenario;
  fp32.model.dtype = model::DType::FP32;
  const auto memory = model::estimate_memory(fp32);
  double needed = 0;
  for (const auto& stage : memory.stages) {
    needed += stage.peak_bytes * static_cast<double>(scenario.parallel.tp * scenario.parallel.dp);
  }
  needed *= static_cast<double>(ranks_here) / static_cast<double>(scenario.parallel.world_size());
  const double available = available_memory_bytes();
  constexpr double GiB = 1024.0 * 1024 * 1024;
  if (available > 0 && needed > available) {
    throw UserError(fmt::format(
        "{} needs about {:.1f} GiB for its {} rank{} in this process (fp32 weights, gradients, Adam state and "
        "activations) but this machine has {:.1f} GiB available: train a smaller model (e.g. twin run gpt-tiny), or "
        "simulate this one with twin sim",
        scenario.model.name, needed / GiB, ranks_here, ranks_here > 1 ? "s" : "", available / GiB));
  }
}

// The checks that need no training, before step 1: a run must not train for an hour and then find that it cannot write
// its results (require_outputs_before_work), nor overwrite its corpus or scenario with them; the checkpoint directory
// is created and written to, and a fresh start (--no-resume) is refused where a newer run's checkpoints would outlive
// it. Throws UserError naming the flag.
void require_writable_outputs(const RunOptions& o, const std::string& data_path) {
  require_outputs_before_work({{"--json", o.json}, {"--trace", o.trace}},
                              {{"--data", data_path}, {"the scenario", resolve_scenario_path(o.scenario.scenario)}});
  if (o.checkpoint.empty()) return;
  exec::require_writable_checkpoint_directory(o.checkpoint);  // a RunError: a UserError
  if (o.no_resume) {
    const int first_written = o.checkpoint_every > 0 ? std::min(o.checkpoint_every, o.steps) : o.steps;
    exec::require_no_newer_checkpoint(o.checkpoint, first_written);
  }
}

exec::TrainOptions train_options(const RunOptions& o, Progress& progress) {
  exec::TrainOptions options;
  options.backend = o.backend;
  options.steps = o.steps;
  options.checkpoint_dir = o.checkpoint;
  options.checkpoint_every = o.checkpoint_every;
  options.keep_checkpoints = o.keep_checkpoints;
  options.resume = !o.no_resume;
  options.comm_timeout_s = o.timeout_s;
  options.threads_per_rank = o.threads;
  options.skip_nonfinite = o.skip_nonfinite;
  for (const auto& [flag, value] : {std::pair{"--loss-spike-factor", o.loss_spike_factor},
                                    std::pair{"--weight-growth-limit", o.weight_growth_limit}}) {
    if (value > 0 && value <= 1) {
      throw UserError(
          fmt::format("{} {:g} would stop every run: give a factor above 1, or 0 to turn the guard off", flag, value));
    }
  }
  options.guards.loss_spike_factor = o.loss_spike_factor;
  options.guards.weight_growth_limit = o.weight_growth_limit;
  if (o.trace_step > o.steps) {
    throw UserError(fmt::format("--trace-step {} is past the last step (--steps {})", o.trace_step, o.steps));
  }
  options.trace_step = o.trace_step == -1 ? -1 : o.trace_step - 1;  // the trainer counts steps from 0
  options.fault = exec::fault_from_environment();
  if (!o.inject_failure.empty()) {
    if (options.fault.mode != exec::FaultInjection::Mode::None) {
      throw UserError("--inject-failure and TWIN_FAULT both inject a fault: give one");
    }
    options.fault = injected_failure(o.inject_failure, o.steps);
  }
  if (!o.inject_slow.empty()) options.slow = slow_rank(o.inject_slow);
  options.on_step = [&progress](const exec::StepReport& r) { progress.step(r); };
  options.on_note = [&progress](const std::string& text) { progress.note(text); };
  return options;
}

// Every rank of this process as a thread. A run whose stuck ranks never returned ends the process here, without
// returning to destroy what their threads still use.
void run_threads(const RunOptions& o, const model::Program& program, const exec::TrainOptions& options,
                 const exec::TextDataset& data, Progress& progress) {
  const int world = program.layout.world_size();
  progress.note(
      fmt::format("twin run: {} on {} rank{} as threads (tp {} x pp {} x dp {}), {} backend, data {} ({} "
                  "tokens)",
                  program.scenario.model.name, world, world > 1 ? "s" : "", program.layout.tp(), program.layout.pp(),
                  program.layout.dp(), o.backend, data.path, data.bytes.size()));
  const auto wall_start = std::chrono::steady_clock::now();
  exec::TrainResult result;
  try {
    result = exec::train_threads(program, data, options);
  } catch (const exec::RanksStuck& stuck) {
    if (progress.drawn_in_place()) fmt::print(stderr, "\n");
    for (const std::string& line : stuck.lines()) fmt::print(stderr, "twin: error: {}\n", line);
    std::fflush(nullptr);
    std::_Exit(1);  // a failed run, as a timed-out MPI job ends
  }
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  if (!o.quiet) print_summary(program, result, "threads", elapsed);
  write_outputs(o, program, result, fmt::format("exec ({}, threads)", o.backend));
}

// What a failure under MPI exits with: model/scenario/errors.hpp's mapping (2 for what the user can fix, 1 for a failed run).
int exit_code_of(const std::exception& error) { return twin::exit_status(error); }

// One rank of an MPI job. A failure is printed as one `twin: error:` line and ends the job with the exit status the
// threads launcher gives the same failure: by the rank that raised it, or, when every rank raises it alike (a guard),
// by rank 0 alone while the others wait to be ended.
void run_mpi_rank(const RunOptions& o, const model::Program& program, exec::TrainOptions options,
                  const std::string& data_path, Progress& progress) {
  const int world = program.layout.world_size();
  auto comm = exec::make_mpi_communicator(exec::CommOptions{o.timeout_s});
  const int threads = o.threads > 0 ? o.threads : exec::default_threads_per_rank(ranks_on_this_host(world));
  const auto wall_start = std::chrono::steady_clock::now();
  const exec::CommGroup everyone = [&] {
    exec::CommGroup group{"world", {}};
    for (int r = 0; r < comm->world_size(); ++r) group.members.push_back(r);
    return group;
  }();
  if (comm->rank() != 0) {
    options.on_step = nullptr;
    options.on_note = nullptr;
  }
  try {
    // The data, on every rank; a rank that cannot read it says so (once: the lowest such rank), and every rank
    // learns that the job ends (from the all-gather), so that none waits in the first collective for the timeout.
    std::optional<exec::TextDataset> data;
    std::string problem;
    try {
      data = exec::load_text(data_path, static_cast<std::size_t>(program.scenario.model.seq_len) + 2);
    } catch (const exec::RunError& error) {
      problem = error.what();
    }
    std::vector<double> failed(static_cast<std::size_t>(comm->world_size()));
    const double mine = problem.empty() ? 0.0 : 1.0;
    comm->all_gather(everyone, &mine, failed.data(), 1, exec::DType::F64, "data check");
    const auto first_failed = std::find(failed.begin(), failed.end(), 1.0);
    if (first_failed != failed.end()) {
      if (first_failed - failed.begin() == comm->rank()) {
        fmt::print(stderr, "twin: error: {}\n", problem);
        exec::abort_mpi_job(2);
      }
      comm->barrier(everyone, "waiting for the rank that reports the data error to end the job");
      exec::abort_mpi_job(2);
    }
    if (comm->rank() == 0) {
      progress.note(
          fmt::format("twin run: {} on {} MPI ranks (tp {} x pp {} x dp {}), {} backend, data {} ({} "
                      "tokens)",
                      program.scenario.model.name, comm->world_size(), program.layout.tp(), program.layout.pp(),
                      program.layout.dp(), o.backend, data->path, data->bytes.size()));
    }
    const exec::TrainResult result = exec::train_rank(program, *data, options, *comm, threads);
    if (comm->rank() == 0) {
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
      if (!o.quiet) print_summary(program, result, "mpi", elapsed);
      write_outputs(o, program, result, fmt::format("exec ({}, mpi)", o.backend));
    }
  } catch (const std::exception& error) {
    if (comm->world_size() == 1) throw;
    if (progress.drawn_in_place() && comm->rank() == 0) fmt::print(stderr, "\n");
    if (!exec::raised_by_every_rank(error)) {
      fmt::print(stderr, "twin: error: {}\n", error.what());
      exec::abort_mpi_job(exit_code_of(error));
    }
    if (comm->rank() == 0) {
      fmt::print(stderr, "twin: error: {}\n", error.what());
      exec::abort_mpi_job(exit_code_of(error));
    }
    try {
      comm->barrier(everyone, "waiting for rank 0 to end the job");
    } catch (const std::exception&) {
    }
    exec::abort_mpi_job(exit_code_of(error));
  }
}

void run(const RunOptions& o) {
  const model::Scenario scenario = load_scenario(o.scenario);
  const bool joined = started_by_launcher();
  const int world_size = static_cast<int>(scenario.parallel.world_size());
  // Every size guard before anything that grows with the plan: the Program's op count from the scenario's sizes
  // (the host-memory estimate below builds the schedule), then host memory, then the Program.
  try {
    require_program_fits_memory(scenario, model::Granularity::Op);
  } catch (const UserError& error) {  // twin run has no --granularity to suggest: it runs every kernel
    std::string message = error.what();
    if (const auto at = message.find(", or use --granularity layer"); at != std::string::npos) message.erase(at);
    throw UserError(message);
  }
  // Every rank runs on this host unless a launcher spread them (mpirun's own --launcher mpi stays on this host).
  check_host_memory(scenario, joined ? ranks_on_this_host(world_size) : world_size);
  const model::Program program = build_program_within_memory(scenario, model::Granularity::Op);
  const int world = program.layout.world_size();
  Progress progress(o.quiet);
  const exec::TrainOptions options = train_options(o, progress);
  if (options.fault.mode != exec::FaultInjection::Mode::None && options.fault.rank >= world) {
    throw UserError(fmt::format("--inject-failure: rank {} is past the run's {} ranks", options.fault.rank, world));
  }
  if (options.slow.rank >= world) {
    throw UserError(fmt::format("--inject-slow: rank {} is past the run's {} ranks", options.slow.rank, world));
  }
  if (o.restarts > 0 && o.checkpoint.empty()) {
    throw UserError("--restarts relaunches from the last checkpoint: give --checkpoint DIR (and --checkpoint-every K)");
  }
  if (o.restarts > 0 && joined) {
    throw UserError(
        "--restarts relaunches the job from the command that starts it (--launcher threads or mpi); in a job started "
        "by mpirun or srun let the scheduler requeue it (it resumes from --checkpoint)");
  }
  const std::string data_path = o.data.empty() ? default_data_path() : o.data;
  const auto min_tokens = static_cast<std::size_t>(scenario.model.seq_len) + 2;
  try {
    if (!joined) {
      require_writable_outputs(o, data_path);  // before step 1 (and once, before mpirun starts the ranks)
      exec::check_text_file(data_path, min_tokens);
      if (o.launcher == "mpi") relaunch_under_mpirun(o, world);
    }
    if (scenario.model.dtype != model::DType::FP32 && o.backend == "cpu" && !launcher_rank_nonzero()) {
      progress.note(
          fmt::format("note: the cpu backend trains in fp32 (model.dtype = \"{}\" sets what the simulator "
                      "counts)",
                      model::to_string(scenario.model.dtype)));
    }
    if (joined) {
      run_mpi_rank(o, program, options, data_path, progress);
      return;
    }
    const exec::TextDataset data = exec::load_text(data_path, min_tokens);
    // As torchrun's elastic agent: a failed run is started again, up to --restarts times, and resumes from the
    // newest complete checkpoint (an injected failure strikes once, as a real fault does).
    exec::TrainOptions attempt = options;
    for (int restart = 0;; ++restart) {
      try {
        run_threads(o, program, attempt, data, progress);
        break;
      } catch (const exec::RunFailure& error) {
        if (restart >= o.restarts) throw;
        if (progress.drawn_in_place()) fmt::print(stderr, "\n");
        fmt::print(stderr, "twin run: {}; restart {} of {} from the newest checkpoint in {}\n", error.what(),
                   restart + 1, o.restarts, o.checkpoint);
        attempt.fault = {};
      }
    }
  } catch (const exec::RunFailure& error) {  // a communication failure, a diverged run
    if (progress.drawn_in_place()) fmt::print(stderr, "\n");
    fail(error.what());
  }
}

}  // namespace

void register_run_command(CLI::App& app) {
  auto options = std::make_shared<RunOptions>();
  options->scenario.scenario = "gpt-tiny";  // a model that trains here; mtnlg-530b is for the simulator
  CLI::App* command = app.add_subcommand(
      "run", "train for real: the scenario's Program executed by the CPU backend, ranks as threads or MPI processes");
  add_scenario_options(*command, options->scenario);
  command->add_option("--backend", options->backend, "compute backend: cpu (fp32), cuda (bf16, when built with CUDA)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  command->add_option("--launcher", options->launcher, "threads: ranks as threads of this process; mpi: under mpirun")
      ->check(CLI::IsMember({"threads", "mpi"}));
  command->add_option("--steps", options->steps, "train until this many steps are done (default 50)")
      ->check(at_least(1));
  command->add_option("--data", options->data, "text file to train on (default: data/corpus.txt)");
  command
      ->add_option("--checkpoint", options->checkpoint,
                   "checkpoint directory: resumes from its newest checkpoint (one of another plan is re-sharded), "
                   "writes new ones")
      ->check(CLI::Validator(
          [](std::string& path) -> std::string {
            if (path.empty()) return "the directory name is empty";
            std::error_code error;
            const bool exists = std::filesystem::exists(path, error);
            if (exists && !std::filesystem::is_directory(path, error)) {
              return fmt::format("'{}' exists and is not a directory", path);
            }
            return {};
          },
          "DIR"));
  command
      ->add_option("--checkpoint-every", options->checkpoint_every,
                   "steps between checkpoints (default: only after the last step)")
      ->check(at_least(0));
  command->add_option("--keep-checkpoints", options->keep_checkpoints, "complete checkpoints to keep (default 2)")
      ->check(at_least(1));
  command->add_flag("--no-resume", options->no_resume, "start from step 0 even if --checkpoint holds a checkpoint");
  command->add_option("--json", options->json, "write losses, per-step times, tokens/s and the summary as JSON")
      ->check(output_file());
  command->add_option("--trace", options->trace, "write the Chrome trace (Perfetto) of the traced step")
      ->check(output_file());
  command->add_option("--trace-step", options->trace_step, "step to time op by op, 1..--steps (default: the last)")
      ->check(at_least(1));
  command
      ->add_option("--timeout", options->timeout_s,
                   "seconds a collective or receive waits for its peers before failing (default 60)")
      ->check(between(0.001, 1e6));
  // More threads than a rank could use would only exhaust memory (each has its own stack and buffers).
  command->add_option("--threads", options->threads, "compute threads per rank (default: cores / ranks)")
      ->check(between(0, 1024));
  command->add_option("--peak-gflops", options->peak_gflops, "one rank's peak GFLOP/s, for the summary's MFU")
      ->check(between(1e-3, 1e9));
  command->add_flag("--quiet", options->quiet, "print nothing but errors (no header, progress or summary)");
  command->add_flag("--skip-nonfinite", options->skip_nonfinite,
                    "skip an update whose logits, loss or gradients are non-finite, as a loss scaler does (5 in a row "
                    "end the run)");
  command
      ->add_option("--loss-spike-factor", options->loss_spike_factor,
                   "stop when a step's loss exceeds this many times the median of the last 20 (default 3; 0: off)")
      ->check(between(0, 1e6));
  command
      ->add_option("--weight-growth-limit", options->weight_growth_limit,
                   "stop when one update multiplies the weights' norm by more than this (default 2; 0: off)")
      ->check(between(0, 1e6));
  command->add_option("--inject-failure", options->inject_failure,
                      "STEP:RANK: that rank fails at the start of that step (1-based), as TWIN_FAULT=throw does; the "
                      "run stops naming it");
  command->add_option("--inject-slow", options->inject_slow,
                      "RANK:FACTOR: that rank's compute takes FACTOR (> 1) times as long, every step, as a slow GPU's "
                      "would; the straggler detector names it");
  command
      ->add_option("--restarts", options->restarts,
                   "after a failed run, start again from the newest checkpoint up to N times (needs --checkpoint)")
      ->check(between(0, 1000));
  command->callback([options] { run(*options); });
}

}  // namespace twin::cli
