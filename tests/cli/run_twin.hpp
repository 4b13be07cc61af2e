// The `twin` command as a test runs it: through the shell, with its exit status and what it printed. Each CLI test
// file builds its command line (TWIN_BINARY, its flags, where its streams go) and hands it here.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <memory>
#include <string>

namespace twin::testing {

struct ShellResult {
  int status = -1;     // the exit status; -1: ended by a signal
  std::string output;  // what the command printed on the streams the command line captures
};

inline ShellResult run_shell(const std::string& command) {
  ShellResult result;
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  std::array<char, 4096> buffer{};
  while (std::fgets(buffer.data(), buffer.size(), pipe.get())) result.output += buffer.data();
  const int status = pclose(pipe.release());
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

}  // namespace twin::testing
