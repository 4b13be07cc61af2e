// What the libFuzzer targets share: the input written to a file of this process's own (the readers take paths, as
// twin's commands give them), and the one rule every reader is held to: bad input is refused with the reader's own
// error (the one `twin` prints as a `twin: error:` line), never another exception, a crash, a hang or a runaway
// allocation (AddressSanitizer, UndefinedBehaviorSanitizer and libFuzzer's -rss_limit_mb / -malloc_limit_mb see
// those).
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <typeinfo>

namespace twin::fuzz {

// A folder of this process's own under the system's temporary folder (several fuzzers may run at once).
inline const std::filesystem::path& scratch() {
  static const std::filesystem::path dir = [] {
    const std::filesystem::path d =
        std::filesystem::temp_directory_path() / ("twin-fuzz-" + std::to_string(static_cast<long>(::getpid())));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

// `data` as the file `name` in scratch(); its path.
inline std::string write_input(const std::string& name, const std::uint8_t* data, std::size_t size) {
  const std::filesystem::path path = scratch() / name;
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data),
                                                                static_cast<std::streamsize>(size));
  return path.string();
}

// Runs `read`; an exception of type Refusal is the reader refusing bad input (fine); any other is a finding: printed
// and aborted on, so that libFuzzer keeps the input.
template <typename Refusal, typename Read>
void expect_refusal_only(Read&& read) {
  try {
    read();
  } catch (const Refusal&) {
  } catch (const std::exception& error) {
    std::fprintf(stderr, "twin fuzz: not a refusal: %s: %s\n", typeid(error).name(), error.what());
    std::abort();
  }
}

}  // namespace twin::fuzz
