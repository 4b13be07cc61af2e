// The bytes of checkpoint files: checksums, atomic writes, checked reads (checkpoint_io.hpp).
#include "exec/checkpoint/io.hpp"

#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/core.h>

#include "exec/core/errors.hpp"

namespace twin::exec {

namespace fs = std::filesystem;

std::uint64_t fnv1a(const char* data, std::size_t n) {
  std::uint64_t hash = 0xcbf29ce484222325ull;
  for (std::size_t i = 0; i < n; ++i) {
    hash ^= static_cast<unsigned char>(data[i]);
    hash *= 0x100000001b3ull;
  }
  return hash;
}

std::string hex(std::uint64_t value) {
  return fmt::format("{:016x}", value);
}

// temp file + fsync + rename: a reader (or a resumed run after SIGKILL) sees the old file or the new one, never half.
// A failure (a full disk, a file size limit) removes the temporary and stops the run naming the file.
void write_atomically(const fs::path& path, const std::string& bytes, const std::string& kill_writing) {
  const fs::path temporary = path.string() + ".tmp";
  auto fail = [&](const std::string& what, int error) {
    ::unlink(temporary.c_str());
    throw RunFailure(
        fmt::format("checkpoint: {} '{}' failed: {} (this checkpoint is incomplete and resuming ignores "
                    "it; the previous ones are untouched)",
                    what, temporary.string(), std::strerror(error)));
  };
  // O_NOFOLLOW: a temporary that is a symbolic link is a failure, never followed out of the checkpoint folder.
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) fail("creating", errno);
  const bool interrupt = !kill_writing.empty() && path.filename() == kill_writing;
  const std::size_t size = interrupt ? bytes.size() / 2 : bytes.size();
  std::size_t written = 0;
  while (written < size) {
    const ssize_t n = ::write(fd, bytes.data() + written, size - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      ::close(fd);
      fail("writing", error);
    }
    written += static_cast<std::size_t>(n);
  }
  if (interrupt) {  // fault injection: the process dies with half the file written, as a power cut would leave it
    ::fsync(fd);
    ::raise(SIGKILL);
  }
  if (::fsync(fd) != 0) {
    const int error = errno;
    ::close(fd);
    fail("writing", error);
  }
  if (::close(fd) != 0) fail("writing", errno);
  std::error_code error;
  fs::rename(temporary, path, error);
  if (error) {
    ::unlink(temporary.c_str());
    throw RunFailure(
        fmt::format("checkpoint: cannot rename '{}' to '{}': {}", temporary.string(), path.string(), error.message()));
  }
}

// The whole file, or a RunError naming it. Anything but a regular file is refused before reading (a directory or a
// symbolic-link loop in its place, a named pipe that would block the run forever).
std::string read_file(const fs::path& path, std::uint64_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    throw RunError(
        fmt::format("checkpoint file '{}' is missing or unreadable: {}", path.string(), std::strerror(errno)));
  }
  struct FileCloser {
    int fd;
    ~FileCloser() { ::close(fd); }
  } closer{fd};
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    throw RunError(fmt::format("checkpoint file '{}' is unreadable: {}", path.string(), std::strerror(errno)));
  }
  if (!S_ISREG(info.st_mode)) {
    throw RunError(fmt::format("checkpoint file '{}' is unreadable: it is {}, not a regular file", path.string(),
                               S_ISDIR(info.st_mode) ? "a directory" : "a special file"));
  }
  if (static_cast<std::uint64_t>(info.st_size) > max_bytes) {
    throw RunError(fmt::format("checkpoint file '{}' has {} bytes, more than the {} MiB a file of its kind may have",
                               path.string(), info.st_size, max_bytes >> 20));
  }
  std::string bytes(static_cast<std::size_t>(info.st_size), '\0');
  std::size_t done = 0;
  while (true) {
    if (done == bytes.size()) bytes.resize(bytes.size() + 65536);  // the file grew since fstat: read to its end
    const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      throw RunError(fmt::format("checkpoint file '{}' is unreadable: {}", path.string(), std::strerror(errno)));
    }
    if (n == 0) break;
    done += static_cast<std::size_t>(n);
  }
  bytes.resize(done);
  return bytes;
}

void BinaryReader::need(std::size_t n) const {
  if (n > remaining()) {
    throw RunError(fmt::format("checkpoint {} '{}' is truncated: it ends at byte {}, its contents need {}", what_,
                               path_.string(), bytes_.size(), position_ + n));
  }
}

void BinaryReader::take(void* out, std::size_t n) {
  need(n);
  std::memcpy(out, bytes_.data() + position_, n);
  position_ += n;
}

std::string BinaryReader::take_string(std::size_t n) {
  need(n);
  std::string text(bytes_.data() + position_, n);
  position_ += n;
  return text;
}

}  // namespace twin::exec
