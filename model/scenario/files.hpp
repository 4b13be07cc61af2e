// twin's one policy for the files it reads, and how an output is told apart from them (README "Reliability"):
//   - an input is a regular file, after its links: a directory, a FIFO, a device or a socket is refused by name before
//     a byte is read (a FIFO is opened without blocking, so that a pipe with no writer never hangs twin);
//   - each kind of input has a size cap, well above the largest real file of its kind, so that a wrong file (a disk
//     image, /dev/zero behind a link) is refused at once instead of filling memory;
//   - an output is never the same file as an input: compared by device and inode, so that links and hard links to an
//     input are seen too.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace twin::model {

// The size caps, by kind of input. Each is far above what its kind holds in practice (the sizes in the comments) and
// far below what would exhaust a host's memory when read whole.
inline constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
inline constexpr std::uint64_t kMaxScenarioBytes = 4 * kMiB;     // a scenario: under 2 KB
inline constexpr std::uint64_t kMaxProfileBytes = 16 * kMiB;     // a GPU or host profile: a few KB
inline constexpr std::uint64_t kMaxSummaryBytes = 256 * kMiB;    // a summary JSON: KB; twin's traces: tens of MB
inline constexpr std::uint64_t kMaxTraceBytes = 8192 * kMiB;     // a Kineto trace (or a log): a few GB uncompressed
inline constexpr std::uint64_t kMaxManifestBytes = 256 * kMiB;   // a checkpoint manifest: KB plus 8 bytes a loss

// A file opened for reading under the policy; closed when it goes.
class InputFile {
 public:
  // Opens `path`, named in errors as `what` ("--profile", "cluster.gpu_profile", "checkpoint file"): throws
  // UserError "<what> '<path>': ..." when it is missing, unreadable, not a regular file, or over `max_bytes`.
  InputFile(const std::string& path, std::string_view what, std::uint64_t max_bytes);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  int fd() const { return fd_; }
  std::uint64_t size_bytes() const { return size_bytes_; }
  // The descriptor, now the caller's to close (e.g. handed to gzdopen).
  int release();
  // The whole file; a file that grew past the cap since it was opened is refused as over it.
  std::string read_all();

 private:
  int fd_ = -1;
  std::uint64_t size_bytes_ = 0;
  std::uint64_t max_bytes_ = 0;
  std::string path_;
  std::string what_;
};

// The whole of `path` under the policy (InputFile's errors).
std::string read_input_file(const std::string& path, std::string_view what, std::uint64_t max_bytes);

// A file's identity, after its links: what two names of one file share. nullopt when nothing is there.
struct FileIdentity {
  std::uint64_t device = 0;
  std::uint64_t inode = 0;
  bool operator==(const FileIdentity&) const = default;
};
std::optional<FileIdentity> file_identity(const std::string& path);

// Throws UserError when the output `output_path` (given by `output_flag`) is one of `inputs` (pairs of what names
// the input and its path): writing it would destroy what twin reads. Paths not there yet, and empty ones, pass.
void require_output_is_not_an_input(std::string_view output_flag, const std::string& output_path,
                                    const std::vector<std::pair<std::string, std::string>>& inputs);

// What a file of `st_mode` is, for a message: "a directory", "a named pipe (FIFO)", "a device", ...
std::string kind_of_file(unsigned st_mode);

}  // namespace twin::model
