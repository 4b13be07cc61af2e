// Tensor: a typed view (pointer, element count) on memory that a Backend allocated, host or device. Shapes are not
// stored: like llm.c, every field and argument that holds a tensor says its shape in a comment, e.g. // (B*T, 3*C/tp).
// Views share their allocation (shared_ptr), so a slice keeps its parent's memory alive.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

namespace twin::exec {

enum class DType : std::uint8_t { F32, BF16, F64, I32 };
enum class Device : std::uint8_t { Host, Cuda };

std::size_t dtype_bytes(DType dtype);
std::string_view to_string(DType dtype);

// Elements of a (rows, cols) tensor, in the size type allocations take.
inline std::size_t numel(int rows, int cols) {
  return static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
}

struct Tensor {
  std::shared_ptr<void> storage;  // the allocation (null for an empty tensor)
  void* data = nullptr;
  std::size_t numel = 0;
  DType dtype = DType::F32;
  Device device = Device::Host;

  bool empty() const { return data == nullptr; }
  std::size_t bytes() const { return numel * dtype_bytes(dtype); }
  // elements [offset, offset + count) of this tensor, sharing its storage
  Tensor slice(std::size_t offset, std::size_t count) const;
  // The host fp32 / int32 pointer; throws std::logic_error naming the mismatch otherwise (CPU backend only).
  float* f32() const;
  int* i32() const;
  double* f64() const;
};

}  // namespace twin::exec
