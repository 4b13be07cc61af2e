// A count as a double: the formulas of model/ multiply integer counts (layers, widths, tokens) into FLOPs and bytes.
#pragma once

#include <cstdint>

namespace twin::model {

inline double d(std::int64_t value) {
  return static_cast<double>(value);
}

}  // namespace twin::model
