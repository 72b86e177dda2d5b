// The model's random draws on top of common/counter_hash.h: normal values at (seed, stream, index)
// with stream = a tensor's name and index = the global element, so a shard of a tensor-parallel or
// pipeline plan draws exactly the elements the unsharded model would.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/counter_hash.h"
#include "model/tensor_table.h"

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

// The initialisation of a tensor (its table row's InitKind) in a model of `layers` layers —
// GPT-2's: matrices and embeddings ~ N(0, 0.02), the residual projections scaled by 1/√(2·layers);
// norm gains 1, every bias 0. The stream is the tensor's name, and element i of the (global,
// unsharded) tensor is Value(seed, i), so every shard of every plan draws what the single-device
// model draws.
struct TensorInit {
  bool random = false;
  float constant = 0.0f;  // when not random
  double stddev = 0.0;    // when random
  uint64_t stream = 0;

  static TensorInit Of(const std::string& name, InitKind kind, int64_t layers) {
    // In float, as it always was: the values are part of every test's reference.
    constexpr float kStd = 0.02f;
    TensorInit init;
    switch (kind) {
      case InitKind::kOnes:
        init.constant = 1.0f;
        return init;
      case InitKind::kZeros:
        return init;
      case InitKind::kNormal:
        init.stddev = kStd;
        break;
      case InitKind::kResidualNormal:
        init.stddev = kStd / std::sqrt(2.0f * static_cast<float>(layers));
        break;
    }
    init.random = true;
    init.stream = NameHash(name);
    return init;
  }
  float Value(uint64_t seed, uint64_t index) const {
    return random ? static_cast<float>(stddev * NormalAt(seed, stream, index)) : constant;
  }
};

}  // namespace shardline::model
