#include "exec/core/tensor.hpp"

#include <stdexcept>
#include <string>

namespace twin::exec {

std::size_t dtype_bytes(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return 4;
    case DType::BF16:
      return 2;
    case DType::F64:
      return 8;
    case DType::I32:
      return 4;
  }
  return 0;
}

std::string_view to_string(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return "f32";
    case DType::BF16:
      return "bf16";
    case DType::F64:
      return "f64";
    case DType::I32:
      return "i32";
  }
  return "?";
}

Tensor Tensor::slice(std::size_t offset, std::size_t count) const {
  if (offset + count > numel) {
    throw std::logic_error("Tensor::slice: [" + std::to_string(offset) + ", " + std::to_string(offset + count) +
                           ") is outside a tensor of " + std::to_string(numel) + " elements");
  }
  Tensor view = *this;
  view.data = static_cast<char*>(data) + offset * dtype_bytes(dtype);
  view.numel = count;
  return view;
}

namespace {
template <typename T>
T* host_pointer(const Tensor& t, DType expected) {
  if (t.empty()) return nullptr;
  if (t.dtype != expected || t.device != Device::Host) {
    throw std::logic_error(std::string("Tensor: expected a host ") + std::string(to_string(expected)) +
                           " tensor, got " + std::string(to_string(t.dtype)) +
                           (t.device == Device::Host ? " on the host" : " on a device"));
  }
  return static_cast<T*>(t.data);
}
}  // namespace

float* Tensor::f32() const {
  return host_pointer<float>(*this, DType::F32);
}
int* Tensor::i32() const {
  return host_pointer<int>(*this, DType::I32);
}
double* Tensor::f64() const {
  return host_pointer<double>(*this, DType::F64);
}

}  // namespace twin::exec
