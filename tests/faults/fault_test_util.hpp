// Helpers of the fault-injection suite: `twin run` as a child process with TWIN_FAULT (and a file size limit), its
// exit status, log and --json, and the uninterrupted run's losses to compare a resumed run with, bit for bit.
#pragma once

#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "exec_test_util.hpp"

namespace twin::exec::faults {

namespace fs = std::filesystem;

struct Outcome {
  int status = -1;  // exit status, 128 + signal when killed
  std::string log;  // stderr and stdout
  double seconds = 0;
};

struct RunSpec {
  std::vector<std::string> args;  // after `twin run SCENARIO --data CORPUS --threads 1`
  std::string fault;              // TWIN_FAULT, or empty
  long file_size_limit = 0;       // RLIMIT_FSIZE in bytes (0: none): a full disk as the writer sees it
  bool quiet = true;              // --quiet (false: the notes, e.g. what resuming found, are in the log)
};

// The scenario of every fault test: the small model of tests/exec on 2 ranks (pp 2) unless a test sets more.
class FaultFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::temp_dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    scenario_file_ = dir_ + "/small.toml";
    std::ofstream(scenario_file_) << testing::small_toml();
  }
  void TearDown() override { fs::remove_all(dir_); }

  const std::string& dir() const { return dir_; }
  static constexpr int kDeadline_s = 90;

  Outcome twin_run(const RunSpec& spec, const std::string& name) const {
    std::vector<std::string> args = {
        TWIN_BINARY, "run", scenario_file_, "--data", testing::source_dir() + "/data/corpus.txt", "--threads", "1"};
    if (spec.quiet) args.emplace_back("--quiet");
    args.insert(args.end(), spec.args.begin(), spec.args.end());
    const std::string log = dir_ + "/" + name + ".log";
    const auto start = std::chrono::steady_clock::now();
    const pid_t pid = fork();
    if (pid == 0) {
      setpgid(0, 0);  // its own process group, so that a hung run is killed with everything it started
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      if (!spec.fault.empty()) setenv("TWIN_FAULT", spec.fault.c_str(), 1);
      if (spec.file_size_limit > 0) {
        signal(SIGXFSZ, SIG_IGN);  // a write past the limit then fails with EFBIG instead of killing the process
        const rlimit limit{static_cast<rlim_t>(spec.file_size_limit), static_cast<rlim_t>(spec.file_size_limit)};
        setrlimit(RLIMIT_FSIZE, &limit);
      }
      std::vector<char*> argv;
      for (const auto& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
      argv.push_back(nullptr);
      execvp(argv[0], argv.data());
      _exit(127);
    }
    // A regression that hangs must not leave processes behind: past the deadline the child's whole process group
    // (twin, and mpirun with its ranks) is killed, and the test fails on the status.
    const auto deadline = start + std::chrono::seconds(kDeadline_s);
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(-pid, SIGKILL);
        waitpid(pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    Outcome outcome;
    outcome.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    outcome.log = testing::read_text(log);
    outcome.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return outcome;
  }

  nlohmann::json json(const std::string& name) const {
    return nlohmann::json::parse(testing::read_text(dir_ + "/" + name));
  }

  // The losses of the run nobody interrupted, in this process (the threads and MPI launchers give the same bits).
  static std::vector<double> uninterrupted(const std::vector<std::string>& sets, int steps) {
    TrainOptions options;
    options.steps = steps;
    return testing::train(testing::scenario(testing::small_toml(), sets), options).losses;
  }

 private:
  std::string dir_, scenario_file_;
};

// `--set` arguments of a plan.
inline std::vector<std::string> set_args(const std::vector<std::string>& sets) {
  std::vector<std::string> args;
  for (const auto& set : sets) args.insert(args.end(), {"--set", set});
  return args;
}

inline std::vector<std::string> operator+(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The message names `rank` as the one the others waited for: directly, or at the end of a chain of waiting ranks.
inline bool names_late_rank(const std::string& log, int rank) {
  const std::string r = std::to_string(rank);
  for (const std::string& text :
       {"rank " + r + " did not arrive", "from rank " + r + " timed out", "a chain that ends at rank " + r + " (",
        "ranks " + r + " did not arrive", "rank " + r + " is stuck", "rank " + r + " never sent"}) {
    if (log.find(text) != std::string::npos) return true;
  }
  return false;
}

}  // namespace twin::exec::faults
