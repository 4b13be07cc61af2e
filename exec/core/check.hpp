// One checking path for the runtime: TWIN_EXEC_CHECK(cond, fmt, args...) throws InternalError with the condition, a
// formatted explanation and file:line. For broken invariants (a bug), never for a user's mistake: those are
// RunError (exec/core/errors.hpp) with a sentence for the user.
#pragma once

#include <cstring>
#include <stdexcept>
#include <string>

#include <fmt/core.h>

#include "model/scenario/errors.hpp"

namespace twin::exec {

using twin::InternalError;

[[noreturn]] inline void fail_check(const char* condition, const std::string& message, const char* file, int line) {
  const char* in_repo = std::strstr(file, "exec/");
  throw InternalError(fmt::format("{} (check failed: {}, {}:{})", message, condition, in_repo ? in_repo : file, line));
}

}  // namespace twin::exec

#define TWIN_EXEC_CHECK(cond, ...)                                                                \
  do {                                                                                            \
    if (!(cond)) ::twin::exec::fail_check(#cond, ::fmt::format(__VA_ARGS__), __FILE__, __LINE__); \
  } while (0)
