// What every checkpoint file shares: its checksum, its atomic write and its checked read (checkpoint.hpp says what the
// files hold).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>

namespace twin::exec {

// FNV-1a 64 of `n` bytes, and a checksum as the manifest writes it (16 hex digits).
std::uint64_t fnv1a(const char* data, std::size_t n);
std::string hex(std::uint64_t value);

// Writes `bytes` to `path` through a temporary, fsync and rename (a reader sees the old file or the new one, never
// half); a failure removes the temporary and throws a RunFailure naming the file. `kill_writing`: the file name whose
// write kills this process halfway (fault injection, exec/train/faults.hpp); empty: none.
void write_atomically(const std::filesystem::path& path, const std::string& bytes, const std::string& kill_writing);

// The whole file, or a RunError naming it (missing, unreadable, not a regular file, or over `max_bytes`): the input
// policy of model/scenario/files.hpp, with the checkpoint's own messages.
std::string read_file(const std::filesystem::path& path,
                      std::uint64_t max_bytes = std::numeric_limits<std::uint64_t>::max());

// Appends `value`'s bytes (the files are read back on machines of the same byte order: twin checks the magic).
template <typename T>
void put(std::string& out, const T& value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

// Reads a checkpoint file's bytes in order; running past the end is a truncated (or foreign) file, a RunError naming
// it as `what` ("shard", "FP8 state").
class BinaryReader {
 public:
  BinaryReader(const std::string& bytes, const std::filesystem::path& path, const char* what)
      : bytes_(bytes), path_(path), what_(what) {}
  template <typename T>
  T get() {
    T value;
    take(&value, sizeof(T));
    return value;
  }
  void take(void* out, std::size_t n);
  // The next n bytes as a string; n (a length the file gives) is checked against the bytes left before anything is
  // allocated, so that a corrupt length is a truncated file, not a 4 GiB allocation.
  std::string take_string(std::size_t n);
  bool at_end() const { return position_ == bytes_.size(); }
  std::size_t remaining() const { return bytes_.size() - position_; }

 private:
  void need(std::size_t n) const;  // throws the truncated-file RunError unless n bytes are left
  const std::string& bytes_;
  const std::filesystem::path& path_;
  const char* what_;
  std::size_t position_ = 0;
};

}  // namespace twin::exec
