// An int count or width as a size: kernels take their shapes as ints, tensors count their elements in std::size_t.
#pragma once

#include <cstddef>

namespace twin::exec {

inline std::size_t sz(int value) {
  return static_cast<std::size_t>(value);
}

}  // namespace twin::exec
