// The measured-run reader on a training log (Megatron-LM, NeMo, torchtitan; plain or gzipped): measured/
// training_log.cpp through read_measured, as `twin compare` reads a log. Refusal: measured::MeasuredError.
#include <cstddef>
#include <cstdint>

#include "fuzz_util.hpp"
#include "measured/kineto.hpp"
#include "measured/measured_run.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = twin::fuzz::write_input("train.log", data, size);
  twin::fuzz::expect_refusal_only<twin::measured::MeasuredError>([&] { twin::measured::read_training_log(path); });
  return 0;
}
