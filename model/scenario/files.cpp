// The input policy: open without blocking, fstat what was opened (not the name, which may change in between), then read
// with the cap in force.
#include "model/scenario/files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/core.h>

#include "model/scenario/errors.hpp"

namespace twin::model {

std::string kind_of_file(unsigned st_mode) {
  if (S_ISDIR(st_mode)) return "a directory";
  if (S_ISFIFO(st_mode)) return "a named pipe (FIFO)";
  if (S_ISCHR(st_mode)) return "a character device";
  if (S_ISBLK(st_mode)) return "a block device";
  if (S_ISSOCK(st_mode)) return "a socket";
  if (S_ISREG(st_mode)) return "a regular file";
  return "not a regular file";
}

namespace {

std::string size_text(std::uint64_t bytes) {
  return bytes >= kMiB ? fmt::format("{:.0f} MiB", static_cast<double>(bytes) / kMiB) : fmt::format("{} bytes", bytes);
}

}  // namespace

InputFile::InputFile(const std::string& path, std::string_view what, std::uint64_t max_bytes)
    : max_bytes_(max_bytes), path_(path), what_(what) {
  if (path.empty()) throw UserError(fmt::format("{}: the file name is empty", what_));
  // O_NONBLOCK: a FIFO opens at once instead of waiting for a writer; fstat then refuses it.
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd_ < 0) {
    throw UserError(fmt::format("{} '{}': cannot open: {}", what_, path_, std::strerror(errno)));
  }
  struct stat info {};
  std::string problem;
  if (::fstat(fd_, &info) != 0) {
    problem = fmt::format("cannot read: {}", std::strerror(errno));
  } else if (!S_ISREG(info.st_mode)) {
    problem = fmt::format("is {}, not a regular file: give a file", kind_of_file(info.st_mode));
  } else if (static_cast<std::uint64_t>(info.st_size) > max_bytes_) {
    problem = fmt::format("has {} bytes, more than the {} a file of this kind may have (is it the right file?)",
                          static_cast<std::uint64_t>(info.st_size), size_text(max_bytes_));
  } else {
    // Blocking again, for readers (gzread) that do not expect EAGAIN; a regular file never blocks anyway.
    const int flags = ::fcntl(fd_, F_GETFL);
    if (flags >= 0) ::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
  }
  if (!problem.empty()) {
    ::close(fd_);
    fd_ = -1;
    throw UserError(fmt::format("{} '{}' {}", what_, path_, problem));
  }
  size_bytes_ = static_cast<std::uint64_t>(info.st_size);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

int InputFile::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

std::string InputFile::read_all() {
  std::string bytes(static_cast<std::size_t>(size_bytes_), '\0');
  std::size_t done = 0;
  while (true) {
    if (done == bytes.size()) {  // the file grew since fstat: read on to its end, within the cap
      if (bytes.size() >= max_bytes_) {
        char probe = 0;
        ssize_t n = 0;
        do n = ::read(fd_, &probe, 1);
        while (n < 0 && errno == EINTR);
        if (n <= 0) break;
        throw UserError(fmt::format("{} '{}' grew past {} while it was read", what_, path_, size_text(max_bytes_)));
      }
      bytes.resize(std::min<std::uint64_t>(bytes.size() + 65536, max_bytes_));
    }
    const ssize_t n = ::read(fd_, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw UserError(fmt::format("{} '{}': cannot read: {}", what_, path_, std::strerror(errno)));
    if (n == 0) break;
    done += static_cast<std::size_t>(n);
  }
  bytes.resize(done);
  return bytes;
}

std::string read_input_file(const std::string& path, std::string_view what, std::uint64_t max_bytes) {
  return InputFile(path, what, max_bytes).read_all();
}

std::optional<FileIdentity> file_identity(const std::string& path) {
  struct stat info {};
  if (path.empty() || ::stat(path.c_str(), &info) != 0) return std::nullopt;
  return FileIdentity{static_cast<std::uint64_t>(info.st_dev), static_cast<std::uint64_t>(info.st_ino)};
}

void require_output_is_not_an_input(std::string_view output_flag, const std::string& output_path,
                                    const std::vector<std::pair<std::string, std::string>>& inputs) {
  const std::optional<FileIdentity> output = file_identity(output_path);
  if (!output) return;
  for (const auto& [what, path] : inputs) {
    if (file_identity(path) == output) {
      throw UserError(fmt::format("{} '{}' is the same file as {} '{}': writing it would destroy the input; give "
                                  "another output file",
                                  output_flag, output_path, what, path));
    }
  }
}

}  // namespace twin::model
