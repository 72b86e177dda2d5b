// The train job whose predicted step time tests/integration/cluster_step_time_test.cc checks (the
// prediction is made and shown) and bench/step_time_prediction_bench.cc measures (how close it
// comes): one definition, so that what ctest checks is what the benchmark measures. The model is
// wide enough (d_model 256) that compute, which calibration measures at this width, dominates the
// step.
#pragma once

#include <string>

namespace shardline::testing {

inline std::string StepTimeJob(const std::string& name, const std::string& parallel) {
  return "name: " + name +
         "\n"
         "kind: train\n"
         "devices: cpu\n"
         "model:\n"
         "  layers: 4\n"
         "  heads: 8\n"
         "  d_model: 256\n"
         "  max_seq_len: 128\n"
         "data:\n"
         "  synthetic: {seed: 3, bytes: 256KiB}\n"
         "optimizer:\n"
         "  lr: 1.0e-3\n"
         "steps: 8\n"
         "batch: 8\n"
         "micro_batch: 2\n"
         "seq_len: 128\n"
         "log_interval: 4\n"
         "parallel: " +
         parallel + "\n";
}

}  // namespace shardline::testing
