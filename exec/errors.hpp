// The runtime's errors, by who can act on them (the CLI maps each to a message and an exit status):
//
//   RunError          something the user can fix (a missing data file, a checkpoint from another plan, a truncated or
//                     broken shard, a rank count that does not match the plan): one complete sentence naming the file
//                     or flag, printed as it is; exit 2, as every mistake in what was typed
//   RunFailure        a run that started and failed: exit 1. Its kinds:
//   CommError         a communication failure (a timeout, a failed peer, mismatched calls): a failed run, exit 1
//   PeerFailure       a CommError that started on another rank (it aborted): secondary, the other rank's error is the
//                     cause
//   TrainingDiverged  the logits, the loss or the gradients became non-finite: a failed run, exit 1
//
// Bugs are InternalError (exec/check.hpp). The three roots, UserError, RunFailure and InternalError, are
// model/errors.hpp's.
#pragma once

#include "model/errors.hpp"

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

}  // namespace twin::exec
