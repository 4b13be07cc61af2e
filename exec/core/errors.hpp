// The runtime's errors, by who can act on them (the CLI maps each to a message and an exit status):
//
//   RunError          something the user can fix (a missing data file, a checkpoint from another plan, a truncated or
//                     broken shard, a rank count that does not match the plan): one complete sentence naming the file
//                     or flag, printed as it is; exit 2, as every mistake in what was typed
//   RunFailure        a run that started and failed: exit 1. Its kinds:
//   CommError         a communication failure (a timeout, a failed peer, mismatched calls): a failed run, exit 1
//   PeerFailure       a CommError that started on another rank (it aborted): secondary, the other rank's error is the
//                     cause
//   TrainingDiverged  the logits, the loss or the gradients became non-finite, or a guard saw a loss spike or the
//                     weights' norm jump: a failed run, exit 1
//   RanksStuck        ranks (threads) that never returned after the run failed: a failed run, exit 1; their threads
//                     cannot be stopped, so the process must end without returning (the CLI's _Exit)
//
// EveryRank marks an error every rank raises alike at the same point (a guard decides on values every rank holds): an
// MPI job prints it once, from rank 0.
//
// Bugs are InternalError (exec/core/check.hpp). The three roots, UserError, RunFailure and InternalError, are
// model/scenario/errors.hpp's.
#pragma once

#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "model/scenario/errors.hpp"

namespace twin::exec {

class RunError : public UserError {
 public:
  using UserError::UserError;
};

// A run that started and failed (exit 1): its message is the whole story, naming the rank.
using twin::RunFailure;

class CommError : public RunFailure {
 public:
  using RunFailure::RunFailure;
};

class PeerFailure : public CommError {
 public:
  using CommError::CommError;
};

// Raised by the rank that saw a non-finite value; it aborts the world like any failure, and its message already
// names the step, the rank and the op.
class TrainingDiverged : public RunFailure {
 public:
  using RunFailure::RunFailure;
};

class EveryRank {
 public:
  virtual ~EveryRank() = default;
};

// A guard tripped (a loss spike, the weights' norm jumping, too many skipped steps): every rank decides alike.
class GuardTripped : public TrainingDiverged, public EveryRank {
 public:
  using TrainingDiverged::TrainingDiverged;
};

// Whether `error` is raised alike by every rank (EveryRank).
inline bool raised_by_every_rank(const std::exception& error) {
  return dynamic_cast<const EveryRank*>(&error) != nullptr;
}

// The run failed and these threads never came back: `lines` says what failed first and which ranks are stuck.
class RanksStuck : public RunFailure {
 public:
  RanksStuck(const std::string& message, std::vector<std::string> lines)
      : RunFailure(message), lines_(std::move(lines)) {}
  const std::vector<std::string>& lines() const { return lines_; }

 private:
  std::vector<std::string> lines_;
};

}  // namespace twin::exec
