// What every checkpoint file shares: its checksum, its atomic write and its checked read (checkpoint.hpp says what the
// files hold).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

namespace twin::exec {

// FNV-1a 64 of `n` bytes, and a checksum as the manifest writes it (16 hex digits).
std::uint64_t fnv1a(const char* data, std::size_t n);
std::string hex(std::uint64_t value);

// Writes `bytes` to `path` through a temporary, fsync and rename (a reader sees the old file or the new one, never
// half); a failure removes the temporary and throws a RunFailure naming the file. `kill_writing`: the file name whose
// write kills this process halfway (fault injection, exec/faults.hpp); empty: none.
void write_atomically(const std::filesystem::path& path, const std::string& bytes, const std::string& kill_writing);

// The whole file, or a RunError naming it (missing, unreadable, or not a regular file).
std::string read_file(const std::filesystem::path& path);

}  // namespace twin::exec
