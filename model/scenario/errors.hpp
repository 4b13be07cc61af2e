// The errors twin reports, by who can act on them. Every layer throws one of these three, or a kind of one, and the
// command line prints it as `twin: error: ...` and exits with exit_status():
//
//   UserError      what the user gave is wrong: a scenario, a flag, a file, a checkpoint (exit 2). Each of its
//                  problems() is one complete sentence naming the field, flag or file; all of them are reported.
//   RunFailure     a run that started and failed: a rank died, stopped or timed out, training diverged (exit 1). Its
//                  message names the rank, the step or the op.
//   InternalError  a broken invariant: a bug in twin (exit 1, printed as an internal error).
//
// The layers' own kinds: model::ScenarioError, report::CompareError, sim::SimulationError and exec::RunError are
// UserErrors; exec::CommError, PeerFailure and TrainingDiverged are RunFailures; exec's TWIN_EXEC_CHECK throws an
// InternalError.
#pragma once

#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

namespace twin {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class UserError : public Error {
 public:
  explicit UserError(const std::string& problem);
  explicit UserError(std::vector<std::string> problems);
  const std::vector<std::string>& problems() const { return problems_; }

 private:
  std::vector<std::string> problems_;
};

class RunFailure : public Error {
 public:
  using Error::Error;
};

class InternalError : public Error {
 public:
  using Error::Error;
};

// What `twin` exits with.
enum ExitStatus : int {
  kExitSuccess = 0,
  kExitFailure = 1,  // a run that failed, or a bug
  kExitUsage = 2,    // the user's mistake: nothing ran, or nothing was written
};

// The exit status of a command that ended with `error`: kExitUsage for a UserError, kExitFailure for the rest.
ExitStatus exit_status(const std::exception& error);

// The lines `twin` prints for `error` (without the "twin: " prefix): one "error: ..." per problem of a UserError,
// "error: ..." for a RunFailure, "internal error: ..." for anything else.
std::vector<std::string> error_lines(const std::exception& error);

}  // namespace twin
