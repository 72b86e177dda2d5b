// The CPU layer rate the actors calibrate (worker/actor/calibration.h), at more block shapes than
// calibration measures: each shape's measured FLOP/s against the fit r(x) = R·x/(x + h) made from
// the two calibration shapes alone — how well the planner's compute model extrapolates on this
// machine. Every shape runs as a stack of 4 blocks. Not part of ctest.
//
//   build/bench/layer_rate_bench [--threads T]
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "worker/actor/calibration.h"

int main(int argc, char** argv) {
  using shardline::actor::BlockShape;
  int threads = 1;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--threads") threads = std::atoi(argv[i + 1]);
  }
  omp_set_num_threads(threads);
  auto fit = shardline::actor::MeasureLayerRate();
  if (!fit.ok()) {
    std::fprintf(stderr, "%s\n", std::string(fit.status().message()).c_str());
    return 1;
  }
  std::printf("threads %d: fit R = %.2f GFLOP/s, h = %.0f\n\n", threads, fit->flops / 1e9,
              fit->half_dim);
  std::printf("  B    T     C  NH tp |   x | measured GFLOP/s | fit GFLOP/s | fit/measured\n");
  const std::vector<BlockShape> shapes = {{2, 64, 64, 4},   {2, 64, 128, 4},  {4, 64, 128, 4},
                                          {2, 128, 128, 4}, {4, 128, 256, 8}, {2, 128, 256, 8},
                                          {1, 128, 256, 8}, {4, 128, 128, 4}, {2, 256, 512, 8},
                                          {4, 128, 384, 6},  {4, 128, 256, 8, 2},
                                          {4, 128, 256, 8, 4}, {4, 128, 128, 4, 2},
                                          {2, 64, 64, 4, 2}};
  for (const BlockShape& s : shapes) {
    auto rate = shardline::actor::MeasureBlockRate(s, 4, 3);
    if (!rate.ok()) return 1;
    const double x = shardline::actor::ThinDim(s);
    const double predicted = fit->flops * x / (x + fit->half_dim);
    std::printf("%3d %4d %5d %3d %2d | %3.0f | %16.2f | %11.2f | %.2f\n", s.B, s.T, s.C, s.NH, s.tp, x,
                *rate / 1e9, predicted / 1e9, predicted / *rate);
  }
  return 0;
}
