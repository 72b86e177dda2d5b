// Counter-based randomness: a value is a pure function of its coordinates (seed, stream, index),
// never of how many values were drawn before or by which thread. That is what lets any rank, in
// any plan, compute any sample of any step, and initialise any shard of any tensor, exactly as the
// unsharded run would.
#pragma once

#include <cstdint>

namespace shardline {

// SplitMix64's finaliser (Steele, Lea, Flood 2014): a bijection on 64 bits with full avalanche.
constexpr uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A 64-bit hash of (a, b, c). Chaining the bijection keeps distinct inputs apart except for
// 2^-64-rare collisions.
constexpr uint64_t Hash3(uint64_t a, uint64_t b, uint64_t c) {
  return Mix64(Mix64(Mix64(a) ^ b) ^ c);
}

// Maps a uniform 64-bit value onto [0, n) without division (Lemire); the bias is below n / 2^64.
constexpr uint64_t UniformBelow(uint64_t x, uint64_t n) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(x) * n) >> 64);
}

}  // namespace shardline
