// The FP8 kernel tests' format parameter: printed by name, and the CPU twin's format of a device format.
#pragma once

#include <ostream>

#include "kernels/cpu/fp8.hpp"
#include "kernels/cuda/fp8_math.hpp"

namespace twin::kernels::cuda::fp8 {
inline void PrintTo(Fp8Format format, std::ostream* out) {  // the test's parameter, by name
  *out << (format == Fp8Format::E4M3 ? "E4M3" : "E5M2");
}
}  // namespace twin::kernels::cuda::fp8

namespace twin::kernels::cuda::testing {
inline cpu::Fp8Format cpu_format(fp8::Fp8Format format) {
  return format == fp8::Fp8Format::E4M3 ? cpu::Fp8Format::E4M3 : cpu::Fp8Format::E5M2;
}
}  // namespace twin::kernels::cuda::testing
