#include "exec/train/faults.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/core.h>

#include "exec/core/errors.hpp"

namespace twin::exec {

namespace {

std::vector<std::string_view> split(std::string_view text, char separator) {
  std::vector<std::string_view> parts;
  while (true) {
    const std::size_t at = text.find(separator);
    parts.push_back(text.substr(0, at));
    if (at == std::string_view::npos) return parts;
    text.remove_prefix(at + 1);
  }
}

constexpr const char* kSyntax = "MODE:rank=R,step=S[,op=N][,seconds=X][,file=NAME]";

int whole_number(std::string_view spec, std::string_view key, std::string_view value, int minimum) {
  int parsed = 0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), parsed);
  if (error != std::errc() || end != value.data() + value.size() || parsed < minimum) {
    throw RunError(
        fmt::format("TWIN_FAULT '{}': {} must be a whole number of at least {}, got '{}'", spec, key, minimum, value));
  }
  return parsed;
}

}  // namespace

FaultInjection parse_fault(std::string_view spec) {
  FaultInjection fault;
  const std::size_t colon = spec.find(':');
  const std::string_view mode = spec.substr(0, colon);
  using Mode = FaultInjection::Mode;
  const std::pair<std::string_view, Mode> modes[] = {{"throw", Mode::Throw}, {"kill", Mode::Kill},
                                                     {"stop", Mode::Stop},   {"slow", Mode::Slow},
                                                     {"nan", Mode::Nan},     {"kill-writing", Mode::KillWriting}};
  for (const auto& [name, value] : modes) {
    if (mode == name) fault.mode = value;
  }
  if (fault.mode == Mode::None) {
    throw RunError(fmt::format("TWIN_FAULT '{}': unknown mode '{}' (throw, kill, stop, slow, nan, kill-writing; {})",
                               spec, mode, kSyntax));
  }
  bool has_rank = false, has_step = false, has_op = false, has_seconds = false;
  if (colon != std::string_view::npos) {
    for (std::string_view pair : split(spec.substr(colon + 1), ',')) {
      const std::size_t equals = pair.find('=');
      if (equals == std::string_view::npos) {
        throw RunError(fmt::format("TWIN_FAULT '{}': '{}' is not KEY=VALUE ({})", spec, pair, kSyntax));
      }
      const std::string_view key = pair.substr(0, equals), value = pair.substr(equals + 1);
      if (key == "rank") {
        fault.rank = whole_number(spec, key, value, 0);
        has_rank = true;
      } else if (key == "step") {
        fault.step = whole_number(spec, key, value, 1) - 1;
        has_step = true;
      } else if (key == "op") {
        fault.op = whole_number(spec, key, value, 0);
        has_op = true;
      } else if (key == "seconds") {
        const std::string text(value);
        char* end = nullptr;
        fault.seconds = std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(fault.seconds) || fault.seconds < 0) {
          throw RunError(fmt::format("TWIN_FAULT '{}': seconds must be a number of at least 0, got '{}'", spec, value));
        }
        has_seconds = true;
      } else if (key == "file") {
        fault.file = std::string(value);
      } else {
        throw RunError(fmt::format("TWIN_FAULT '{}': unknown key '{}' ({})", spec, key, kSyntax));
      }
    }
  }
  const bool writing = fault.mode == Mode::KillWriting;
  if ((!has_rank && !writing) || !has_step) {
    throw RunError(fmt::format("TWIN_FAULT '{}': {} needs {} ({})", spec, mode,
                               writing ? "step=S" : "rank=R and step=S", kSyntax));
  }
  if (fault.mode == Mode::Nan && !has_op) throw RunError(fmt::format("TWIN_FAULT '{}': nan needs op=N", spec));
  if (fault.mode == Mode::Slow && !has_seconds)
    throw RunError(fmt::format("TWIN_FAULT '{}': slow needs seconds=X", spec));
  if (writing && fault.file.empty()) {
    throw RunError(fmt::format("TWIN_FAULT '{}': kill-writing needs file=NAME (rank-00000.bin, manifest.json)", spec));
  }
  return fault;
}

FaultInjection fault_from_environment() {
  const char* spec = std::getenv("TWIN_FAULT");
  if (spec == nullptr || *spec == '\0') return {};
  return parse_fault(spec);
}

double ComputeSlowdown::after_compute(double seconds) {
  owed_s_ += (factor_ - 1) * seconds;
  if (owed_s_ < kMinSleep_s) return 0;
  const auto start = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(owed_s_));
  const double slept = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // An overshoot is not taken back from the next ops: a loaded host wakes a sleeper milliseconds late, and taking
  // that from the next step would leave it unslowed. The rank is then slower than FACTOR by the wake-up latency.
  owed_s_ = std::max(0.0, owed_s_ - slept);
  return slept;
}

void block_forever() {
  // Never destroyed: a blocked thread may outlive everything else in the process.
  static auto* mutex = new std::mutex;
  static auto* never = new std::condition_variable;
  std::unique_lock lock(*mutex);
  while (true) never->wait(lock);
}

}  // namespace twin::exec
