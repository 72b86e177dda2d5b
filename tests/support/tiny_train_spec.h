// A tiny train spec (2 layers, d_model 32, the synthetic corpus, 200 steps) that trains in a few
// seconds on one CPU core: training_test.cc holds its CPU loss to a stated bound and
// model_cuda_gpt_test.cc holds the same spec, with `device: cuda`, to the same bound.
#pragma once

namespace shardline::testing {

inline constexpr const char* kTinyTrainSpec = R"(name: tiny
model:
  layers: 2
  heads: 4
  d_model: 32
  max_seq_len: 32
data:
  synthetic:
    seed: 7
    bytes: 256KiB
optimizer:
  lr: 1.0e-2
  warmup_steps: 5
steps: 200
batch: 4
seq_len: 32
seed: 3
log_interval: 20
)";

}  // namespace shardline::testing
