// Counter-based randomness: every value is a pure function of (seed, stream, index), never of how
// many values were drawn before or by which thread. That makes initialisation identical whatever
// the thread count, and lets a shard of a tensor-parallel or pipeline plan draw exactly the
// elements the unsharded model would (stream = the tensor's name, index = the global element).
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

namespace shardline::model {

// SplitMix64's finaliser (Steele, Lea, Flood 2014): a bijection on 64 bits with full avalanche.
constexpr uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

constexpr uint64_t Hash3(uint64_t a, uint64_t b, uint64_t c) {
  return Mix64(Mix64(Mix64(a) ^ b) ^ c);
}

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
