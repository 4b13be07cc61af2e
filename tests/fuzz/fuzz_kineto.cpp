// The PyTorch profiler (Kineto) trace reader, measured/kineto.cpp, on a trace file (plain or gzipped JSON), with twin's
// own traces. Refusal: measured::MeasuredError.
#include <cstddef>
#include <cstdint>

#include "fuzz_util.hpp"
#include "measured/kineto.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = twin::fuzz::write_input("rank-0.trace.json", data, size);
  twin::fuzz::expect_refusal_only<twin::measured::MeasuredError>([&] {
    twin::measured::KinetoTrace trace = twin::measured::read_kineto_trace(path);
    twin::measured::keep_fastest_step(trace);
  });
  return 0;
}
