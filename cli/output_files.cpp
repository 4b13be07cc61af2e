// Writing an output file so that a reader never sees half of it, and the checks of every output before the work.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <system_error>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/core.h>

#include "cli/commands.hpp"
#include "model/scenario/files.hpp"

namespace twin::cli {

namespace fs = std::filesystem;

namespace {

// The file an output path names when nothing is there yet: a dangling symbolic link is followed to the name it
// points at (so that the link keeps pointing at the new file), at most 40 links deep, as the kernel does.
fs::path new_file_target(const fs::path& path) {
  fs::path target = path;
  for (int depth = 0; depth < 40; ++depth) {
    std::error_code error;
    if (!fs::is_symlink(fs::symlink_status(target, error))) return target;
    const fs::path next = fs::read_symlink(target, error);
    if (error) throw UserError(fmt::format("cannot follow the link '{}': {}", target.string(), error.message()));
    target = next.is_absolute() ? next : target.parent_path() / next;
  }
  throw UserError(fmt::format("'{}': too many levels of symbolic links", path.string()));
}

// A stream that is not a file (standard output, a pipe, a terminal, a device) cannot be replaced by a rename: it is
// written in place.
void write_in_place(const std::string& path, const std::string& contents) {
  std::FILE* out = std::fopen(path.c_str(), "wb");
  if (out == nullptr) throw UserError(fmt::format("cannot write '{}': {}", path, std::strerror(errno)));
  const bool written = std::fwrite(contents.data(), 1, contents.size(), out) == contents.size();
  const int saved = errno;
  if (std::fclose(out) != 0 || !written) {  // a full disk is a failure of the run, not the user's mistake: exit 1
    throw RunFailure(fmt::format("writing '{}' failed: {}", path, std::strerror(written ? errno : saved)));
  }
}

}  // namespace

void write_file_atomically(const std::string& path, const std::string& contents) {
  if (path.empty()) throw UserError("an output file name is empty");
  std::error_code no_status;                                   // a path with nothing there yet has none: that is fine
  const fs::file_status status = fs::status(path, no_status);  // through any links
  if (fs::is_directory(status)) throw UserError(fmt::format("'{}' is a directory: give a file name", path));
  if (fs::exists(status) && !fs::is_regular_file(status)) {
    write_in_place(path, contents);
    return;
  }
  // Replace the file a link points at, not the link.
  std::error_code error;
  const fs::path target = fs::exists(status) ? fs::canonical(path, error) : new_file_target(path);
  if (error) throw UserError(fmt::format("cannot resolve '{}': {}", path, error.message()));
  // A name of this process's own beside the target: two runs writing the same file never share a temporary.
  const fs::path temporary = fmt::format("{}.tmp{}", target.string(), ::getpid());
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) throw UserError(fmt::format("cannot write '{}': {}", path, std::strerror(errno)));
    out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
    out.flush();
    if (!out) {
      out.close();
      std::error_code ignored;
      fs::remove(temporary, ignored);
      throw RunFailure(fmt::format("writing '{}' failed (disk full?)", path));
    }
  }
  fs::rename(temporary, target, error);
  if (error) {
    std::error_code ignored;
    fs::remove(temporary, ignored);  // leave nothing half-done behind
    throw UserError(
        fmt::format("cannot rename '{}' to '{}': {}", temporary.string(), target.string(), error.message()));
  }
}

void require_distinct_outputs(const std::vector<std::pair<std::string, std::string>>& flags_and_paths) {
  for (std::size_t a = 0; a < flags_and_paths.size(); ++a) {
    for (std::size_t b = a + 1; b < flags_and_paths.size(); ++b) {
      const auto& [flag_a, path_a] = flags_and_paths[a];
      const auto& [flag_b, path_b] = flags_and_paths[b];
      if (path_a.empty() || path_b.empty()) continue;
      std::error_code ignored;
      if (fs::weakly_canonical(path_a, ignored) == fs::weakly_canonical(path_b, ignored)) {
        throw UserError(
            fmt::format("{} and {} name the same file '{}': one would overwrite the other", flag_a, flag_b, path_a));
      }
    }
  }
}

namespace {

// Whether `path` can take the output, without writing it: see require_outputs_before_work.
void require_writable_output(const std::string& flag, const std::string& path) {
  if (path.empty()) throw UserError(fmt::format("{}: the file name is empty", flag));
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (fs::is_directory(status)) throw UserError(fmt::format("{} '{}' is a directory: give a file name", flag, path));
  if (fs::exists(status) && !fs::is_regular_file(status)) {
    struct stat info {};
    if (::stat(path.c_str(), &info) != 0) {
      throw UserError(fmt::format("{} '{}': cannot write: {}", flag, path, std::strerror(errno)));
    }
    if (S_ISBLK(info.st_mode)) {
      throw UserError(fmt::format("{} '{}' is a block device: twin writes files and streams, not disks", flag, path));
    }
    // A pipe or socket is not opened here: opening and closing it would give its reader an early end of file. A
    // character device (a terminal, /dev/null, /dev/full) is opened and closed, which tells it nothing.
    if (S_ISCHR(info.st_mode)) {
      const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
      if (fd < 0) throw UserError(fmt::format("{} '{}': cannot write: {}", flag, path, std::strerror(errno)));
      ::close(fd);
    } else if (::access(path.c_str(), W_OK) != 0) {
      throw UserError(fmt::format("{} '{}': cannot write: {}", flag, path, std::strerror(errno)));
    }
    return;
  }
  const fs::path target = fs::exists(status) ? fs::canonical(path, error) : fs::absolute(new_file_target(path), error);
  const fs::path probe =
      target.parent_path() / fmt::format(".{}.twin-write-test-{}", target.filename().string(), ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw UserError(fmt::format("{} '{}': cannot write in '{}': {} (checked before the work, so that it is not lost "
                                "at its end)",
                                flag, path, target.parent_path().string(), std::strerror(errno)));
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

}  // namespace

void require_outputs_before_work(const std::vector<std::pair<std::string, std::string>>& outputs,
                                 const std::vector<std::pair<std::string, std::string>>& inputs) {
  require_distinct_outputs(outputs);
  for (const auto& [flag, path] : outputs) {
    if (path.empty()) continue;
    require_writable_output(flag, path);
    model::require_output_is_not_an_input(flag, path, inputs);
  }
}

}  // namespace twin::cli
