// Token and position embeddings (conventions: see matmul.h).
//
// The token table may be a vocabulary shard: rows [v0, v1) of the full (V,C) table, as a
// vocab-parallel embedding holds. A token outside the shard embeds to zeros on that rank, so an
// all-reduce (sum) over the tensor-parallel group gives the full embedding. A single device passes
// v0 = 0, v1 = V.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

namespace shardline::kernels::cpu {

// OK when every token is in [0, vocab); otherwise InvalidArgument naming the first bad position
// and value. The kernels below trust their tokens, so callers run this on data from outside.
absl::Status ValidateTokens(const int32_t* tokens, int64_t n, int vocab);

// tokens is (N), wte is (v1-v0, C), out is (N,C): out[n] = wte[tokens[n]-v0], or zeros when the
// token is outside [v0, v1). Overwrites out.
void TokenEmbeddingForward(float* out, const int32_t* tokens, const float* wte, int N, int C, int v0,
                           int v1);
// Scatter-add: dwte[tokens[n]-v0] += dout[n] for tokens in [v0, v1). Threads split the columns, so
// repeated tokens never race and the sum order is fixed.
void TokenEmbeddingBackward(float* dwte, const float* dout, const int32_t* tokens, int N, int C,
                            int v0, int v1);

// out is (B,T,C), wpe is (maxT,C) with maxT >= T: out[b,t] += wpe[t], in place.
void PositionEmbeddingForward(float* out, const float* wpe, int B, int T, int C);
// dwpe[t] += Σ_b dout[b,t].
void PositionEmbeddingBackward(float* dwpe, const float* dout, int B, int T, int C);

// The single-device encoder (llm.c's encoder_forward): out (B,T,C) = wte[tokens] + wpe[t], with
// wte (V,C) the whole table.
void EncoderForward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                    int T, int C, int V);
void EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                     int T, int C, int V);

}  // namespace shardline::kernels::cpu
