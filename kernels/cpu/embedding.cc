#include "kernels/cpu/embedding.h"

#include <algorithm>
#include <string>

#include "kernels/cpu/parallel.h"

namespace shardline::kernels::cpu {

absl::Status ValidateTokens(const int32_t* tokens, int64_t n, int vocab) {
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab) {
      return absl::InvalidArgumentError("token " + std::to_string(tokens[i]) + " at position " +
                                        std::to_string(i) + " is outside the vocabulary [0, " +
                                        std::to_string(vocab) + ")");
    }
  }
  return absl::OkStatus();
}

void TokenEmbeddingForward(float* out, const int32_t* tokens, const float* wte, int N, int C, int v0,
                           int v1) {
#pragma omp parallel for schedule(static) if (int64_t{N} * C >= kMinParallelWork)
  for (int n = 0; n < N; ++n) {
    float* row = out + int64_t{n} * C;
    const int32_t token = tokens[n];
    if (token >= v0 && token < v1) {
      const float* src = wte + int64_t{token - v0} * C;
      std::copy(src, src + C, row);
    } else {
      std::fill(row, row + C, 0.0f);
    }
  }
}

void TokenEmbeddingBackward(float* dwte, const float* dout, const int32_t* tokens, int N, int C,
                            int v0, int v1) {
  constexpr int kBlock = 64;  // one cache line of every gradient row per thread
  const int blocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (int64_t{N} * C >= kMinParallelWork)
  for (int blk = 0; blk < blocks; ++blk) {
    const int c0 = blk * kBlock;
    const int c1 = std::min(C, c0 + kBlock);
    for (int n = 0; n < N; ++n) {
      const int32_t token = tokens[n];
      if (token < v0 || token >= v1) continue;
      float* dst = dwte + int64_t{token - v0} * C;
      const float* src = dout + int64_t{n} * C;
      for (int c = c0; c < c1; ++c) dst[c] += src[c];
    }
  }
}

void PositionEmbeddingForward(float* out, const float* wpe, int B, int T, int C) {
#pragma omp parallel for collapse(2) schedule(static) if (int64_t{B} * T * C >= kMinParallelWork)
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      float* row = out + (int64_t{b} * T + t) * C;
      const float* pos = wpe + int64_t{t} * C;
      for (int c = 0; c < C; ++c) row[c] += pos[c];
    }
  }
}

void PositionEmbeddingBackward(float* dwpe, const float* dout, int B, int T, int C) {
  // Each thread owns whole positions; the batch is summed in order inside.
#pragma omp parallel for schedule(static) if (int64_t{B} * T * C >= kMinParallelWork)
  for (int t = 0; t < T; ++t) {
    float* dst = dwpe + int64_t{t} * C;
    for (int b = 0; b < B; ++b) {
      const float* src = dout + (int64_t{b} * T + t) * C;
      for (int c = 0; c < C; ++c) dst[c] += src[c];
    }
  }
}

void EncoderForward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                    int T, int C, int V) {
  TokenEmbeddingForward(out, tokens, wte, B * T, C, 0, V);
  PositionEmbeddingForward(out, wpe, B, T, C);
}

void EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                     int T, int C, int V) {
  if (dwte != nullptr) TokenEmbeddingBackward(dwte, dout, tokens, B * T, C, 0, V);
  if (dwpe != nullptr) PositionEmbeddingBackward(dwpe, dout, B, T, C);
}

}  // namespace shardline::kernels::cpu
