// The checkpoint folder as a whole: which step folders it holds, which are complete, pruning, setting a bad one
// aside, and the lock that keeps a second run out of it.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <string_view>
#include <utility>

#include <fmt/core.h>

#include "exec/checkpoint/checkpoint.hpp"
#include "exec/core/errors.hpp"

namespace twin::exec {

namespace fs = std::filesystem;

namespace {

// Whether `step_dir` holds an entry named manifest.json, without following it: a manifest that is a directory or a
// symbolic-link loop still marks the checkpoint complete, and reading it then says what is wrong with it.
bool has_manifest(const fs::path& step_dir) {
  std::error_code error;
  return fs::exists(fs::symlink_status(step_dir / "manifest.json", error));
}

// Whether `path` itself is a symbolic link (not followed).
bool is_link(const fs::path& path) {
  std::error_code error;
  return fs::is_symlink(fs::symlink_status(path, error));
}

// The step-NNNNNNNN entries of `dir`, by step. A step entry that is a symbolic link is none of them: the folder's
// policy is that no link is followed out of it, so resuming never reads through one and pruning never deletes
// through one (require_writable_checkpoint_directory refuses a folder holding one before a run starts).
std::vector<std::pair<int, fs::path>> step_directories(const fs::path& dir) {
  std::vector<std::pair<int, fs::path>> found;
  std::error_code error;
  for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
    if (is_link(it->path())) continue;
    if (const auto step = step_of_directory_name(it->path().filename().string())) found.emplace_back(*step, it->path());
  }
  if (error) {
    throw RunError(fmt::format("cannot list the checkpoint directory '{}': {}", dir.string(), error.message()));
  }
  std::sort(found.begin(), found.end());
  return found;
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

}  // namespace

std::optional<int> step_of_directory_name(const std::string& name) {
  constexpr std::string_view kPrefix = "step-";
  if (name.size() <= kPrefix.size() || name.compare(0, kPrefix.size(), kPrefix) != 0) return std::nullopt;
  const char* first = name.data() + kPrefix.size();
  const char* last = name.data() + name.size();
  if (!std::all_of(first, last, [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  int step = 0;
  const auto [end, error] = std::from_chars(first, last, step);
  if (error != std::errc() || end != last) return std::nullopt;
  return step;
}

std::optional<fs::path> latest_checkpoint(const fs::path& dir) {
  std::error_code error;
  if (!fs::is_directory(dir, error)) return std::nullopt;
  const auto steps = step_directories(dir);
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    if (has_manifest(it->second)) return it->second;
  }
  return std::nullopt;
}

std::vector<fs::path> unfinished_checkpoints(const fs::path& dir) {
  std::error_code error;
  if (!fs::is_directory(dir, error)) return {};
  std::vector<fs::path> unfinished;
  const auto steps = step_directories(dir);
  for (auto it = steps.rbegin(); it != steps.rend() && !has_manifest(it->second); ++it)
    unfinished.push_back(it->second);
  std::reverse(unfinished.begin(), unfinished.end());
  return unfinished;
}

void prune_checkpoints(const fs::path& dir, int keep, int protect) {
  std::vector<std::pair<int, fs::path>> complete;  // oldest first
  std::vector<std::pair<int, fs::path>> incomplete;
  int newest = -1;
  for (const auto& [step, path] : step_directories(dir)) {
    if (!has_manifest(path)) {
      incomplete.emplace_back(step, path);
      continue;
    }
    // Only a checkpoint that reads back as what its name says counts: a copied or renamed one (step-7 holding step 2's
    // manifest) or a broken one must neither push a good one out nor be removed here; resuming from it says what is
    // wrong.
    try {
      read_manifest(path);
    } catch (const RunError&) {
      continue;
    }
    complete.emplace_back(step, path);
    newest = step;
  }
  std::error_code error;
  for (std::size_t i = 0; i + static_cast<std::size_t>(std::max(keep, 1)) < complete.size(); ++i) {
    if (complete[i].first != protect) fs::remove_all(complete[i].second, error);
  }
  for (const auto& [step, path] : incomplete) {
    if (step < newest) fs::remove_all(path, error);
  }
}

std::optional<fs::path> set_aside_checkpoint(const fs::path& dir, int step) {
  const fs::path from = step_directory(dir, step);
  std::error_code error;
  if (!fs::is_directory(from, error)) return std::nullopt;
  fs::path to = dir / ("rejected-" + from.filename().string());
  for (int n = 2; fs::exists(fs::symlink_status(to, error)); ++n) {
    to = dir / fmt::format("rejected-{}-{}", from.filename().string(), n);
  }
  fs::rename(from, to, error);
  if (error) return std::nullopt;  // another rank moved it first
  return to;
}

void require_writable_checkpoint_directory(const fs::path& dir) {
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) {
    throw RunError(fmt::format("--checkpoint '{}': cannot create the directory: {}", dir.string(), error.message()));
  }
  for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    if ((name == "twin.lock" || step_of_directory_name(name)) && is_link(it->path())) {
      throw RunError(fmt::format("--checkpoint '{}': '{}' is a symbolic link; twin follows no link out of its "
                                 "checkpoint folder (it would write, read or delete files elsewhere): remove it",
                                 dir.string(), it->path().string()));
    }
  }
  const fs::path probe = dir / fmt::format(".twin-write-test-{}", ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) {
    throw RunError(
        fmt::format("--checkpoint '{}': cannot write in the directory: {}", dir.string(), std::strerror(errno)));
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

void require_no_newer_checkpoint(const fs::path& dir, int first_step) {
  std::error_code error;
  if (!fs::is_directory(dir, error)) return;
  const auto steps = step_directories(dir);
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    if (it->first <= first_step) return;
    if (has_manifest(it->second)) {
      throw RunError(fmt::format(
          "--checkpoint '{}' holds a checkpoint of step {} ('{}'), newer than step {}, the first this run writes: "
          "with --no-resume, pruning would delete this run's checkpoints and a later resume would continue the old "
          "run; remove the old checkpoints (the step-* folders) or use another directory",
          dir.string(), it->first, it->second.string(), first_step));
    }
  }
}

CheckpointLock::CheckpointLock(const fs::path& dir) {
  std::error_code error;
  fs::create_directories(dir, error);
  const fs::path path = dir / "twin.lock";
  // O_NOFOLLOW: a lock file that is a link is refused (ELOOP), never followed to a file elsewhere and overwritten.
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd_ < 0 && errno == ELOOP) {
    throw RunError(fmt::format("--checkpoint '{}': its lock file '{}' is a symbolic link; twin follows no link out of "
                               "its checkpoint folder: remove it",
                               dir.string(), path.string()));
  }
  if (fd_ < 0) {
    throw RunError(fmt::format("--checkpoint '{}': cannot create its lock file '{}': {}", dir.string(), path.string(),
                               std::strerror(errno)));
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    char holder[512] = {};
    const ssize_t n = ::pread(fd_, holder, sizeof(holder) - 1, 0);
    std::string text = n > 0 ? std::string(holder, static_cast<std::size_t>(n)) : "an unknown process";
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    ::close(fd_);
    fd_ = -1;
    throw RunError(
        fmt::format("--checkpoint '{}' is in use by another twin run ({}; lock file '{}'): wait for it to "
                    "end, or use another directory",
                    dir.string(), text, path.string()));
  }
  const std::string holder = fmt::format("pid {} on host {}\n", ::getpid(), host_name());
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, holder.data(), holder.size(), 0) < 0) {
    // the lock holds all the same; only the message a second run would print is poorer
  }
}

CheckpointLock::~CheckpointLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

}  // namespace twin::exec
