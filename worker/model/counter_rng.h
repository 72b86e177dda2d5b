// The model's random draws on top of common/counter_hash.h: normal values at (seed, stream, index)
// with stream = a tensor's name and index = the global element, so a shard of a tensor-parallel or
// pipeline plan draws exactly the elements the unsharded model would.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

#include "common/counter_hash.h"

namespace shardline::model {

// FNV-1a of a name: a stream id that stays put when tensors are added or reordered.
constexpr uint64_t NameHash(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (char ch : name) {
    h ^= static_cast<unsigned char>(ch);
    h *= 0x100000001b3ULL;
  }
  return h;
}

// Uniform in the open interval (0, 1) from the top 53 bits.
inline double UniformOpen(uint64_t bits) {
  return (static_cast<double>(bits >> 11) + 0.5) * 0x1.0p-53;
}

// A standard normal value at (seed, stream, index), by Box-Muller on two independent uniforms.
inline double NormalAt(uint64_t seed, uint64_t stream, uint64_t index) {
  const double u1 = UniformOpen(Hash3(seed, stream, 2 * index));
  const double u2 = UniformOpen(Hash3(seed, stream, 2 * index + 1));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * 3.14159265358979323846 * u2);
}

}  // namespace shardline::model
