// Counter-based random numbers: every value is a pure function of (seed, stream, index), so any element of any
// tensor (or any sequence of any step's batch) is drawn without drawing the others. That is what makes the
// initialisation independent of the plan: a TP shard generates its own elements of the full tensor, and the same seed
// gives the same full model whatever tp and pp are.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

namespace twin::exec {

// SplitMix64's finaliser: a bijective 64-bit mix with good avalanche.
inline std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// FNV-1a of a name: the stream id of a tensor ("layers.3.mlp.up.weight").
inline std::uint64_t fnv1a64(std::string_view text) {
  std::uint64_t hash = 0xcbf29ce484222325ull;
  for (char c : text) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 0x100000001b3ull;
  }
  return hash;
}

// 64 random bits for (seed, stream, index)
inline std::uint64_t random_bits(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  return mix64(mix64(mix64(seed) ^ stream) ^ index);
}

// uniform in (0, 1), 53 bits
inline double random_uniform(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  return (static_cast<double>(random_bits(seed, stream, index) >> 11) + 0.5) * 0x1.0p-53;
}

// standard normal (Box-Muller on two uniforms of the same counter)
inline double random_normal(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  const double u1 = random_uniform(seed, stream, 2 * index);
  const double u2 = random_uniform(seed, stream, 2 * index + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace twin::exec
