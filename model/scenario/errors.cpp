#include "model/scenario/errors.hpp"

#include <utility>

namespace twin {

UserError::UserError(const std::string& problem) : Error(problem), problems_{problem} {}

UserError::UserError(std::vector<std::string> problems)
    : Error(problems.empty() ? std::string("invalid input") : problems.front()), problems_(std::move(problems)) {
  if (problems_.empty()) problems_.push_back(what());
}

ExitStatus exit_status(const std::exception& error) {
  return dynamic_cast<const UserError*>(&error) ? kExitUsage : kExitFailure;
}

std::vector<std::string> error_lines(const std::exception& error) {
  if (const auto* user = dynamic_cast<const UserError*>(&error)) {
    std::vector<std::string> lines;
    for (const std::string& problem : user->problems()) lines.push_back("error: " + problem);
    return lines;
  }
  if (dynamic_cast<const RunFailure*>(&error)) return {std::string("error: ") + error.what()};
  return {std::string("internal error: ") + error.what()};
}

}  // namespace twin
