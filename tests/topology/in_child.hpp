// SimGrid runs one simulation per process: tests that build a platform run their body in a forked child and get
// numbers back through a pipe (assertions stay in the parent).
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace twin::testing {

inline std::vector<double> in_child(const std::function<std::vector<double>()>& body) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    std::vector<double> values;
    try {
      values = body();
    } catch (...) {
      _exit(3);
    }
    const auto* bytes = reinterpret_cast<const char*>(values.data());
    std::size_t left = values.size() * sizeof(double), done = 0;
    while (left > 0) {
      const ssize_t n = write(fds[1], bytes + done, left);
      if (n <= 0) _exit(2);
      done += static_cast<std::size_t>(n);
      left -= static_cast<std::size_t>(n);
    }
    close(fds[1]);
    _exit(0);
  }
  close(fds[1]);
  std::string data;
  char buffer[4096];
  ssize_t n;
  while ((n = read(fds[0], buffer, sizeof buffer)) > 0) data.append(buffer, static_cast<std::size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) throw std::runtime_error("child failed");
  std::vector<double> values(data.size() / sizeof(double));
  std::memcpy(values.data(), data.data(), values.size() * sizeof(double));
  return values;
}

}  // namespace twin::testing
