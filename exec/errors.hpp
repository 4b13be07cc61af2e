// RunError: something the user can fix (a missing data file, a checkpoint from another plan, a truncated shard, a
// rank count that does not match the plan). Its message is one complete sentence naming the file or flag; the CLI
// prints it as it is. Bugs are InternalError (exec/check.hpp); communication failures CommError (comm/).
#pragma once

#include <stdexcept>

namespace twin::exec {

class RunError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace twin::exec
