// Helpers of the executor tests: scenarios built from TOML, the shipped corpus, and child processes (the twin binary).
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <ostream>
#include <string>
#include <vector>

#include "exec/train/data.hpp"
#include "exec/train/trainer.hpp"
#include "model/program/program.hpp"
#include "model/scenario/scenario.hpp"

namespace twin::exec::testing {

inline std::string source_dir() {
  const char* dir = std::getenv("TWIN_SOURCE_DIR");
  return dir ? dir : TWIN_SOURCE_DIR_FALLBACK;
}

inline const TextDataset& corpus() {
  static const TextDataset data = load_text(source_dir() + "/data/corpus.txt", 1024);
  return data;
}

// The parity model of the issue: 8 layers, hidden 128, 4 heads, seq 64, byte vocabulary; global batch 8 of 1.
inline std::string parity_toml() {
  return R"(
[model]
name = "parity"
layers = 8
hidden = 128
heads = 4
seq_len = 64
vocab = 256
dtype = "fp32"

[parallel]
micro_batch = 1
global_batch = 8

[cluster]
node = "cpu-host"

[training]
seed = 7
learning_rate = 1e-3
min_learning_rate = 1e-4
warmup_steps = 2
decay_steps = 10
grad_clip = 1.0
)";
}

// The tiny model (scenarios/gpt-tiny.toml's shape) with smaller batches, for tests that need speed.
inline std::string small_toml() {
  return R"(
[model]
name = "small"
layers = 2
hidden = 64
heads = 4
seq_len = 32
vocab = 256
dtype = "fp32"

[parallel]
micro_batch = 2
global_batch = 8

[cluster]
node = "cpu-host"

[training]
seed = 11
learning_rate = 3e-3
warmup_steps = 2
decay_steps = 20
)";
}

inline model::Scenario scenario(const std::string& toml, const std::vector<std::string>& sets = {}) {
  std::vector<model::Override> overrides;
  for (const auto& text : sets) overrides.push_back(model::parse_override(text));
  return model::parse_scenario(toml, "test", overrides);
}

inline TrainResult train(const model::Scenario& s, TrainOptions options) {
  if (options.threads_per_rank == 0) options.threads_per_rank = 1;
  if (options.trace_step == -1) options.trace_step = -2;  // no timeline unless asked
  const model::Program program = model::build_program(s, model::Granularity::Op);
  return train_threads(program, corpus(), options);
}

inline std::string temp_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("twin-exec-test-" + name + "-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A child process running `args` (args[0] is the program), stdout and stderr to `log`.
class Child {
 public:
  Child(const std::vector<std::string>& args, const std::string& log) {
    pid_ = fork();
    if (pid_ == 0) {
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      std::vector<char*> argv;
      for (const auto& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
      argv.push_back(nullptr);
      execvp(argv[0], argv.data());
      _exit(127);
    }
  }
  // Exit status (128 + signal when killed).
  int wait() {
    int status = 0;
    waitpid(pid_, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  bool running() {
    int status = 0;
    return waitpid(pid_, &status, WNOHANG) == 0;
  }
  void kill_now() { ::kill(pid_, SIGKILL); }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
};

inline int run_command(const std::vector<std::string>& args, const std::string& log) {
  return Child(args, log).wait();
}

inline bool on_path(const std::string& program) {
  return std::system(("command -v " + program + " > /dev/null 2>&1").c_str()) == 0;
}

// A parameterised parity test's plan: its name (the test's, via PrintTo) and the --set overrides that make it.
struct Plan {
  const char* name;
  std::vector<std::string> sets;
};
inline void PrintTo(const Plan& plan, std::ostream* out) {
  *out << plan.name;
}

}  // namespace twin::exec::testing
