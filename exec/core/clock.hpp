// Seconds on the steady clock: the executor's durations (step times, timeouts), never a date.
#pragma once

#include <chrono>

namespace twin::exec {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace twin::exec
