// The GPU profile reader (topology/gpu_profile.cpp: `twin sim --profile`, cluster.gpu_profile) and what the simulator
// derives from a profile (its link measurements). Refusal: std::invalid_argument naming the file and field.
#include <cstddef>
#include <cstdint>
#include <stdexcept>

#include "fuzz_util.hpp"
#include "topology/gpu_profile.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = twin::fuzz::write_input("profile.toml", data, size);
  twin::fuzz::expect_refusal_only<std::invalid_argument>([&] {
    const twin::topology::GpuProfile profile = twin::topology::read_gpu_profile(path);
    twin::topology::link_measurement(profile, false);
    twin::topology::link_measurement(profile, true);
  });
  return 0;
}
