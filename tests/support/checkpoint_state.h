// The whole state a checkpoint holds, read back by tensor, and the check that two runs ended in
// the same state — the multi-process tests' equivalence of a resumed, resharded or restarted run
// with one that ran straight through.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "worker/training/model_checkpoint.h"

namespace shardline::testing {

// Every parameter and moment of the step a checkpoint path names (a run's dir, a step folder or
// its manifest), by tensor.
inline std::map<std::string, std::vector<float>> CheckpointStateOf(const std::string& path) {
  std::map<std::string, std::vector<float>> state;
  absl::StatusOr<training::CheckpointSource> source = training::CheckpointSource::Open(path);
  EXPECT_TRUE(source.ok()) << source.status();
  if (!source.ok()) return state;
  for (const auto& [name, tensor] : source->manifest()->tensors) {
    const std::vector<int64_t> zeros(tensor.global_shape.size(), 0);
    auto values = training::ReadCheckpointBox(*source, name, zeros, tensor.global_shape);
    EXPECT_TRUE(values.ok()) << values.status();
    if (values.ok()) state[name] = *values;
  }
  return state;
}

struct SameStateOptions {
  // Leave out the key third of every qkv bias ([q | k | v]). It has no gradient but rounding: a
  // key bias adds the same q·b to every score of a query, which the softmax cancels, and Adam
  // divides that noise by its own size, moving the bias by ~lr per step in directions no output
  // sees. Runs of many steps whose plans sum in other orders drift apart there and only there.
  bool skip_key_bias = false;
};

// The tolerances of tests/unit/checkpoint_resume_test.cc: parameters absolute 1e-5, moments 1e-4
// of their tensor's largest value (fp32 sums in another order).
inline void ExpectSameState(const std::string& got_path, const std::string& want_path,
                            SameStateOptions options = {}) {
  const auto got = CheckpointStateOf(got_path);
  const auto want = CheckpointStateOf(want_path);
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, values] : want) {
    ASSERT_TRUE(got.contains(name)) << name;
    const bool key_bias = options.skip_key_bias && name.ends_with("qkv.b");
    const size_t third = values.size() / 3;
    double largest = 0, diff = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      if (key_bias && i >= third && i < 2 * third) continue;
      largest = std::max(largest, std::abs(static_cast<double>(values[i])));
      diff = std::max(diff, std::abs(static_cast<double>(got.at(name)[i]) - values[i]));
    }
    const bool moment = name.starts_with("optim.");
    EXPECT_LE(moment ? diff / std::max(largest, 1e-30) : diff, moment ? 1e-4 : 1e-5) << name;
  }
}

}  // namespace shardline::testing
