// The units datasheets count in: rates, memory and bandwidth in powers of ten (a GB is 1e9 bytes).
#pragma once

namespace twin::topology {

inline constexpr double kTera = 1e12;
inline constexpr double kGiga = 1e9;
inline constexpr double kGB = 1e9;

}  // namespace twin::topology
