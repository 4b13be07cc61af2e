// Ranks talk through exec's MPI mailbox (exec/comm/mpi_communicator.hpp), one JSON message at a time: a rank other
// than 0 sends each outcome as soon as its child ends, so what it finished before dying is kept, a word at least every
// second while it works, and "done" or "failed" at the end. Rank 0 listens between its own children.
#include "cli/simulation_ranks.hpp"

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string_view>
#include <thread>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "model/scenario/errors.hpp"
#ifdef TWIN_HAVE_RUN_COMMAND
#include "exec/comm/mpi_communicator.hpp"
#endif

namespace twin::cli {
namespace {

using Clock = std::chrono::steady_clock;

std::optional<int> environment_int(std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (const char* value = std::getenv(name)) return std::atoi(value);
  }
  return std::nullopt;
}

// The variants rank `rank` of `size` simulates: every size-th from its own index.
std::vector<std::size_t> share_of(int rank, int size, std::size_t variants) {
  std::vector<std::size_t> share;
  for (std::size_t i = static_cast<std::size_t>(rank); i < variants; i += static_cast<std::size_t>(size)) {
    share.push_back(i);
  }
  return share;
}

#ifdef TWIN_HAVE_RUN_COMMAND

// A test's way to make one rank fail after its first outcome: TWIN_SEARCH_FAULT=throw:rank=R (the rank reports an
// error and stops) or kill:rank=R (the rank is killed by SIGKILL, as the kernel's OOM killer would).
struct RankFault {
  std::string mode;  // "", "throw" or "kill"
  int rank = -1;
};

RankFault rank_fault() {
  const char* spec = std::getenv("TWIN_SEARCH_FAULT");
  if (spec == nullptr || *spec == '\0') return {};
  const std::string_view text(spec);
  const auto colon = text.find(":rank=");
  const std::string mode(text.substr(0, colon));
  if (colon == std::string_view::npos || (mode != "throw" && mode != "kill")) {
    throw UserError(fmt::format("TWIN_SEARCH_FAULT '{}': expected throw:rank=R or kill:rank=R", text));
  }
  return {mode, std::atoi(spec + colon + 6)};
}

nlohmann::json outcome_message(std::size_t index, const SimulationOutcome& outcome) {
  return {
      {"index", index}, {"summary", outcome.summary}, {"error", outcome.error}, {"exit_status", outcome.exit_status}};
}

// A rank other than 0: simulates its share and reports to rank 0 as it goes; false when it failed.
bool work_for_rank_zero(exec::MpiMailbox& mailbox, const std::vector<std::size_t>& share,
                        const std::vector<std::vector<std::string>>& lists, const std::string& scenario_path, int jobs,
                        const std::string& command, const std::vector<std::string>& extra_arguments) {
  const RankFault fault = rank_fault();
  auto last_word = Clock::now();
  PoolHooks hooks;
  hooks.finished = [&](std::size_t i, const SimulationOutcome& outcome) {
    mailbox.post(0, outcome_message(share[i], outcome).dump());
    last_word = Clock::now();
    if (fault.rank != mailbox.rank()) return;
    if (fault.mode == "kill") {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the outcome leaves first
      raise(SIGKILL);
    }
    throw std::runtime_error("failed on purpose (TWIN_SEARCH_FAULT)");
  };
  hooks.tick = [&] {
    if (Clock::now() - last_word < std::chrono::seconds(1)) return;
    mailbox.post(0, R"({"alive":true})");
    last_word = Clock::now();
  };
  try {
    simulate_in_children(scenario_path, lists, jobs, command, extra_arguments, false, hooks);
    mailbox.post(0, R"({"done":true})");
    return true;
  } catch (const std::exception& error) {
    mailbox.post(0, nlohmann::json{{"failed", error.what()}}.dump());
    return false;
  }
}

// A rank other than 0, its share done: every outcome of the batch as rank 0 gathered them, so that this rank takes
// the same next step (a search's next batch) as rank 0.
std::vector<SimulationOutcome> outcomes_from_rank_zero(exec::MpiMailbox& mailbox) {
  for (;;) {
    if (const std::optional<std::string> message = mailbox.take(0)) {
      std::vector<SimulationOutcome> outcomes;
      // Kept in a variable: a range-for over a member of a temporary would read it after its end.
      const nlohmann::json parsed = nlohmann::json::parse(*message);
      for (const nlohmann::json& m : parsed.at("outcomes")) {
        outcomes.push_back({m.at("summary"), m.at("error").get<std::string>(), m.at("exit_status").get<int>()});
      }
      return outcomes;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Whether rank 0 took a rank for dead (end_job_if_a_rank_died).
bool a_rank_died = false;

// What rank 0 knows of another rank.
struct Peer {
  Clock::time_point last_heard = Clock::now();
  bool heard = false;
  bool done = false;
  std::string failure;  // why its unreported variants failed ("" while it works)
  bool listening() const { return !done && failure.empty(); }
};

// Rank 0: reads every message that has arrived and takes a rank silent for too long for dead.
void listen(exec::MpiMailbox& mailbox, std::vector<Peer>& peers, std::vector<SimulationOutcome>& outcomes,
            std::vector<bool>& reported) {
  for (int r = 1; r < static_cast<int>(peers.size()); ++r) {
    Peer& peer = peers[static_cast<std::size_t>(r)];
    while (peer.listening()) {
      const std::optional<std::string> message = mailbox.take(r);
      if (!message) break;
      peer.last_heard = Clock::now();
      peer.heard = true;
      const nlohmann::json m = nlohmann::json::parse(*message);
      if (m.contains("index")) {
        const auto i = m.at("index").get<std::size_t>();
        outcomes.at(i) =
            SimulationOutcome{m.at("summary"), m.at("error").get<std::string>(), m.at("exit_status").get<int>()};
        reported.at(i) = true;
      } else if (m.contains("failed")) {
        peer.failure = "failed: " + m.at("failed").get<std::string>();
      } else if (m.contains("done")) {
        peer.done = true;
      }
    }
    // Before its first word a rank may still be enumerating what rank 0 already has: it is given longer.
    const double silent_s = std::chrono::duration<double>(Clock::now() - peer.last_heard).count();
    if (peer.listening() && silent_s > (peer.heard ? 1 : 6) * kSilentRankS) {
      peer.failure = fmt::format("fell silent for {:.0f} s (killed, or its node lost)", silent_s);
      a_rank_died = true;
    }
  }
}

// Rank 0: its own share simulated, the others' gathered, and every outcome sent back to the ranks still working.
// `peers` lasts from batch to batch: a rank found dead stays dead.
std::vector<SimulationOutcome> gather_on_rank_zero(exec::MpiMailbox& mailbox, std::vector<Peer>& peers,
                                                   const std::vector<std::vector<std::string>>& override_lists,
                                                   const std::string& scenario_path, int jobs,
                                                   const std::string& command,
                                                   const std::vector<std::string>& extra_arguments, bool progress) {
  const int size = mailbox.world_size();
  std::vector<SimulationOutcome> outcomes(override_lists.size(), SimulationOutcome{{}, "not simulated", -1});
  std::vector<bool> reported(override_lists.size(), false);
  peers.resize(static_cast<std::size_t>(size));
  for (Peer& peer : peers) {
    if (!peer.failure.empty()) continue;
    peer = Peer{};  // a new batch: it starts afresh
  }
  const std::vector<std::size_t> share = share_of(0, size, override_lists.size());
  std::vector<std::vector<std::string>> lists;
  for (std::size_t i : share) lists.push_back(override_lists[i]);
  if (progress) {
    fmt::print(stderr, "twin {}: {} variants over {} MPI ranks, {} on rank 0 (its progress below)\n", command,
               override_lists.size(), size, share.size());
  }
  PoolHooks hooks;
  hooks.tick = [&] { listen(mailbox, peers, outcomes, reported); };
  const std::vector<SimulationOutcome> own =
      simulate_in_children(scenario_path, lists, jobs, command, extra_arguments, progress, hooks);
  for (std::size_t j = 0; j < share.size(); ++j) outcomes[share[j]] = own[j];
  auto anyone_listening = [&] {
    for (std::size_t r = 1; r < peers.size(); ++r) {
      if (peers[r].listening()) return true;
    }
    return false;
  };
  while (anyone_listening()) {
    listen(mailbox, peers, outcomes, reported);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 1; r < size; ++r) {
    const Peer& peer = peers[static_cast<std::size_t>(r)];
    if (peer.failure.empty()) continue;
    int lost = 0;
    for (std::size_t i : share_of(r, size, override_lists.size())) {
      if (reported[i]) continue;
      outcomes[i] = SimulationOutcome{{}, fmt::format("rank {} {} before reporting it", r, peer.failure), -1};
      ++lost;
    }
    if (lost > 0) {
      fmt::print(stderr,
                 "twin: warning: rank {} of {} {}: {} of its variants are marked failed, the others' are kept\n", r,
                 size, peer.failure, lost);
    }
  }
  nlohmann::json all = nlohmann::json::array();
  for (std::size_t i = 0; i < outcomes.size(); ++i) all.push_back(outcome_message(i, outcomes[i]));
  const std::string message = nlohmann::json{{"outcomes", all}}.dump();
  for (int r = 1; r < size; ++r) {
    if (peers[static_cast<std::size_t>(r)].failure.empty()) mailbox.post(r, message);
  }
  return outcomes;
}

#endif  // TWIN_HAVE_RUN_COMMAND

// The job's ranks for as long as a command's simulator lives: MPI starts once per process, so the mailbox stays open
// from batch to batch, and rank 0 remembers which ranks died.
struct RanksSession {
  int calls = 0;  // progress is shown for the first call only: a search's later batches are a plan or two each
#ifdef TWIN_HAVE_RUN_COMMAND
  std::unique_ptr<exec::MpiMailbox> mailbox;
  std::vector<Peer> peers;
  bool failed = false;  // this rank (not 0) failed: it leaves the job's work
  ~RanksSession() {
    // A dead rank: MPI_Finalize (the mailbox's end) would wait for it; the job ends once rank 0 has written.
    if (a_rank_died) (void)mailbox.release();  // left open on purpose: end_job_if_a_rank_died ends the job
  }
#endif
};

// simulate_in_children over the job's ranks: variant i is simulated by rank i % size, `jobs` at a time on each, and
// every rank returns every outcome (rank 0 gathers them and sends them to the others). A rank that fails, or falls
// silent for kSilentRankS, is named on stderr and the variants it had not reported are outcomes whose error names it;
// such a rank returns nothing. Outside a job (or in a job of one rank) it is simulate_in_children.
std::optional<std::vector<SimulationOutcome>> simulate_across_ranks(
    RanksSession& session, const std::string& scenario_path,
    const std::vector<std::vector<std::string>>& override_lists, int jobs, const std::string& command,
    const std::vector<std::string>& extra_arguments, bool progress) {
  const LaunchedRank launched = launched_rank();
  if (launched.size <= 1) {
    return simulate_in_children(scenario_path, override_lists, jobs, command, extra_arguments, progress);
  }
#ifdef TWIN_HAVE_RUN_COMMAND
  if (session.failed) return std::nullopt;
  if (!session.mailbox) {
    try {
      session.mailbox = exec::open_mpi_mailbox();
    } catch (const std::exception& error) {
      throw UserError(fmt::format("twin {} was started as rank {} of {} (mpirun / srun): {}", command, launched.rank,
                                  launched.size, error.what()));
    }
  }
  exec::MpiMailbox& mailbox = *session.mailbox;
  if (mailbox.world_size() != launched.size || mailbox.rank() != launched.rank) {
    throw UserError(fmt::format(
        "twin {}: the launcher started rank {} of {} but MPI sees rank {} of {} (srun needs --mpi=pmix or pmi2 for "
        "this twin's OpenMPI)",
        command, launched.rank, launched.size, mailbox.rank(), mailbox.world_size()));
  }
  if (mailbox.rank() == 0) {
    return gather_on_rank_zero(mailbox, session.peers, override_lists, scenario_path, jobs, command, extra_arguments,
                               progress);
  }
  const std::vector<std::size_t> share = share_of(mailbox.rank(), mailbox.world_size(), override_lists.size());
  std::vector<std::vector<std::string>> lists;
  for (std::size_t i : share) lists.push_back(override_lists[i]);
  if (!work_for_rank_zero(mailbox, share, lists, scenario_path, jobs, command, extra_arguments)) {
    session.failed = true;
    return std::nullopt;
  }
  return outcomes_from_rank_zero(mailbox);
#else
  (void)session;
  throw UserError(
      fmt::format("twin {} was started as rank {} of {} (mpirun / srun), but this twin was built without "
                  "the executor and its MPI: run it as one process",
                  command, launched.rank, launched.size));
#endif
}

}  // namespace

LaunchedRank launched_rank() {
  // SLURM_NTASKS is also set in a batch script outside srun: only a step's count says that srun started this.
  const std::optional<int> size = environment_int({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"});
  const std::optional<int> rank = environment_int({"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"});
  if (!size || !rank || *size <= 1) return {};
  return {*rank, *size};
}

api::VariantSimulator ranks_simulator(int jobs, const std::string& command, std::vector<std::string> extra_arguments,
                                      bool progress, bool& follower) {
  auto session = std::make_shared<RanksSession>();
  follower = launched_rank().rank != 0;
  return [jobs, command, extra = std::move(extra_arguments), progress, session](
             const std::string& path, const std::vector<std::vector<std::string>>& lists, const api::SimRequest&) {
    std::vector<api::VariantOutcome> outcomes;
    std::optional<std::vector<SimulationOutcome>> gathered =
        simulate_across_ranks(*session, path, lists, jobs, command, extra, progress && session->calls++ == 0);
    if (!gathered) return outcomes;  // this rank failed: it stops here, rank 0 carries on without it
    for (SimulationOutcome& one : *gathered) {
      outcomes.push_back({std::move(one.summary), std::move(one.error), one.exit_status});
    }
    return outcomes;
  };
}

void end_job_if_a_rank_died() {
#ifdef TWIN_HAVE_RUN_COMMAND
  if (!a_rank_died) return;
  std::fflush(stdout);
  std::fflush(stderr);
  exec::abort_mpi_job(0);
#endif
}

}  // namespace twin::cli
