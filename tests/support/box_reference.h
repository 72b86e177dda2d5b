// The box [offsets, offsets + shape) of a row-major tensor of shape `global`, element by element:
// the reference the checkpoint tests compare readers against, deliberately nothing like the
// readers' own copies (worker/checkpoint/sharded_reader.h).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace shardline::testing {

inline std::vector<float> ReferenceBox(std::span<const float> full,
                                       const std::vector<int64_t>& global,
                                       const std::vector<int64_t>& offsets,
                                       const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  std::vector<float> out;
  for (int64_t i = 0; i < count; ++i) {
    int64_t rest = i, flat = 0, stride = 1;
    std::vector<int64_t> index(shape.size());
    for (size_t d = shape.size(); d-- > 0;) {
      index[d] = rest % shape[d];
      rest /= shape[d];
    }
    for (size_t d = global.size(); d-- > 0;) {
      flat += (offsets[d] + index[d]) * stride;
      stride *= global[d];
    }
    out.push_back(full[flat]);
  }
  return out;
}

}  // namespace shardline::testing
