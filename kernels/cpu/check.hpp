// Precondition checks of the CPU kernels. A failed check throws std::invalid_argument naming the kernel and the
// condition, e.g. "twin::kernels::cpu::matmul_forward: precondition failed: rows > 0 (kernels/cpu/matmul.cpp:120)".
// Checks stay on in Release builds: they cost O(1) per call (O(n) for token ids), nothing next to the kernel itself.
#pragma once

#include <cstring>
#include <stdexcept>
#include <string>

namespace twin::kernels::cpu {

[[noreturn]] inline void fail_precondition(const char* kernel, const char* condition, const char* file, int line) {
  const char* in_repo = std::strstr(file, "kernels/cpu/");  // drop the build machine's absolute prefix
  if (in_repo != nullptr) file = in_repo;
  throw std::invalid_argument(std::string("twin::kernels::cpu::") + kernel + ": precondition failed: " + condition +
                              " (" + file + ":" + std::to_string(line) + ")");
}

}  // namespace twin::kernels::cpu

// TWIN_KERNEL_CHECK(cond): inside a kernel, throw if `cond` is false; the message names the kernel (__func__) and
// the condition as written.
#define TWIN_KERNEL_CHECK(cond)                                                                \
  do {                                                                                         \
    if (!(cond)) ::twin::kernels::cpu::fail_precondition(__func__, #cond, __FILE__, __LINE__); \
  } while (0)
