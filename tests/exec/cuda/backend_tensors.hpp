// Helpers of the CUDA executor tests: a tensor on a backend made from host floats, and its values read back.
#pragma once

#include <vector>

#include "exec/core/backend.hpp"

namespace twin::exec::cuda::test_tensors {

inline Tensor make(Backend& backend, const std::vector<float>& values, DType dtype) {
  Tensor t = backend.allocate(values.size(), dtype);
  backend.upload_f32(t, values.data());
  return t;
}

inline std::vector<float> read(Backend& backend, const Tensor& t) {
  std::vector<float> values(t.numel);
  backend.download_f32(values.data(), t);
  return values;
}

}  // namespace twin::exec::cuda::test_tensors
