// Causal self-attention, fused in the flash-attention manner: the (T,T) score matrix is never
// stored. Layouts and maths are those of kernels/cpu/attention.h: qkv (B,T,NH+2·KVH,HS) (query
// head h reads key/value head h / (NH/KVH)), out (B,T,NH,HS), lse (B,NH,T); scores use q̂ = q/√HS.
//
// Work split. A block owns one (b, head) and one tile of kTile = 32 rows (queries in the forward
// and the dq pass, keys in the dk/dv pass) and walks the tiles of the other side, staging them in
// shared memory. Its kWarps = 8 warps own 4 of the tile's rows each. For one row, lane j handles
// column j of the other tile (a score, a probability); the row's HS-long accumulators live in
// registers spread over the lanes (dimension d = lane + 32·k, k < 4), hence HS <= 128. (With 4
// warps of 8 rows, the dk/dv kernel's 64 accumulators per lane spilled 13 KB to local memory.)
//
// Shared tiles are (32, stride) with stride = HS rounded up to an odd number: lane j reading
// element d of row j then hits bank (j·stride + d) mod 32, a different bank for every lane.
//
// Backward (FlashAttention-2's split, with no atomics): one kernel parallel over key tiles
// accumulates dk and dv (a block walks every query head that reads its key/value head), another
// parallel over query tiles accumulates dq; both recompute the probabilities from the saved
// log-sum-exp, and D_i = do_i·o_i, as the CPU twin does.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launchers.h"

namespace shardline::kernels::cuda {
namespace {

using detail::kFullMask;
using detail::kWarpSize;

constexpr int kTile = 32;
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kRowsPerWarp = kTile / kWarps;
constexpr int kChunks = launch::kAttentionMaxHeadSize / kWarpSize;  // d = lane + 32·k

static_assert(kTile == kWarpSize, "lane j must map to column j of a tile");

struct Geometry {
  int T, NH, KVH, HS, stride;
  float scale;

  // Offset of query head h's query (part 0), or of the key (1) or value (2) vector it reads, of
  // token t of batch b in qkv.
  __device__ int64_t Qkv(int b, int t, int part, int h) const {
    const int head = part == 0 ? h : NH + (part - 1) * KVH + h / (NH / KVH);
    return (int64_t{b} * T + t) * (NH + 2 * KVH) * int64_t{HS} + int64_t{head} * HS;
  }
  __device__ int64_t Out(int b, int t, int h) const {
    return (int64_t{b} * T + t) * int64_t{NH} * HS + int64_t{h} * HS;
  }
};

int OddStride(int HS) { return HS % 2 == 0 ? HS + 1 : HS; }

// Copies rows t0..t0+kTile of one head's `part` (scaled by `scale`) into tile (kTile, stride);
// rows past T are zero so that they add nothing. All threads of the block take part.
__device__ void LoadQkvTile(float* tile, const float* qkv, const Geometry& g, int b, int h, int t0,
                            int part, float scale) {
  for (int idx = threadIdx.x; idx < kTile * g.HS; idx += kThreads) {
    const int r = idx / g.HS;
    const int d = idx % g.HS;
    const int t = t0 + r;
    tile[r * g.stride + d] = t < g.T ? qkv[g.Qkv(b, t, part, h) + d] * scale : 0.0f;
  }
}

// The same for rows of a (B,T,NH,HS) array (out or dout).
__device__ void LoadRowsTile(float* tile, const float* rows, const Geometry& g, int b, int h,
                             int t0) {
  for (int idx = threadIdx.x; idx < kTile * g.HS; idx += kThreads) {
    const int r = idx / g.HS;
    const int d = idx % g.HS;
    const int t = t0 + r;
    tile[r * g.stride + d] = t < g.T ? rows[g.Out(b, t, h) + d] : 0.0f;
  }
}

// D_t = do_t·o_t and lse_t for the tile's rows t0..t0+kTile, one warp per row; 0 past T.
__device__ void LoadRowStats(float* delta, float* lse_tile, const float* dout, const float* out,
                             const float* lse, const Geometry& g, int b, int h, int t0) {
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  for (int r = warp; r < kTile; r += kWarps) {
    const int t = t0 + r;
    float dot = 0.0f;
    if (t < g.T) {
      const int64_t base = g.Out(b, t, h);
      for (int d = lane; d < g.HS; d += kWarpSize) dot += dout[base + d] * out[base + d];
    }
    dot = detail::WarpSum(dot);
    if (lane == 0) {
      delta[r] = dot;
      lse_tile[r] = t < g.T ? lse[(int64_t{b} * g.NH + h) * g.T + t] : 0.0f;
    }
  }
}

// x_row · y_lane over HS, rows of two shared tiles.
__device__ __forceinline__ float Dot(const float* x_row, const float* y_row, int HS) {
  float s = 0.0f;
  for (int d = 0; d < HS; ++d) s += x_row[d] * y_row[d];
  return s;
}

// grid (ceil(T/kTile), B·NH); dynamic shared memory: Q, K, V tiles.
__global__ void __launch_bounds__(kThreads)
    ForwardKernel(float* out, float* lse, const float* qkv, Geometry g) {
  extern __shared__ float shared[];
  float* q_tile = shared;                     // (kTile, stride), pre-scaled by 1/√HS
  float* k_tile = q_tile + kTile * g.stride;  // (kTile, stride)
  float* v_tile = k_tile + kTile * g.stride;  // (kTile, stride)
  const int b = blockIdx.y / g.NH;
  const int h = blockIdx.y % g.NH;
  const int i0 = blockIdx.x * kTile;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;

  LoadQkvTile(q_tile, qkv, g, b, h, i0, 0, g.scale);

  float acc[kRowsPerWarp][kChunks];
  float row_max[kRowsPerWarp];
  float row_sum[kRowsPerWarp];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    row_max[rr] = -INFINITY;
    row_sum[rr] = 0.0f;
#pragma unroll
    for (int k = 0; k < kChunks; ++k) acc[rr][k] = 0.0f;
  }

  const int last_query = min(i0 + kTile, g.T) - 1;  // causal: no key after it is needed
  for (int j0 = 0; j0 <= last_query; j0 += kTile) {
    __syncthreads();  // every warp is done with the previous K/V tile
    LoadQkvTile(k_tile, qkv, g, b, h, j0, 1, 1.0f);
    LoadQkvTile(v_tile, qkv, g, b, h, j0, 2, 1.0f);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp * kRowsPerWarp + rr;
      const int i = i0 + r;
      // Both conditions are the same for every lane of the warp, so the shuffles stay full.
      if (i >= g.T || j0 > i) continue;
      const int j = j0 + lane;
      const bool visible = j <= i;
      const float s =
          visible ? Dot(q_tile + r * g.stride, k_tile + lane * g.stride, g.HS) : -INFINITY;
      const float new_max =
          fmaxf(row_max[rr], detail::WarpMax(s));  // finite: key j0 <= i is visible
      // Online softmax: what was accumulated under the old max is rescaled (exp(−inf) = 0 at
      // first).
      const float correction = expf(row_max[rr] - new_max);
      const float p = visible ? expf(s - new_max) : 0.0f;
      row_sum[rr] = row_sum[rr] * correction + detail::WarpSum(p);
      row_max[rr] = new_max;
#pragma unroll
      for (int k = 0; k < kChunks; ++k) acc[rr][k] *= correction;
      for (int jj = 0; jj < kTile; ++jj) {
        const float pj = __shfl_sync(kFullMask, p, jj);
        const float* vj = v_tile + jj * g.stride;
#pragma unroll
        for (int k = 0; k < kChunks; ++k) {
          const int d = lane + k * kWarpSize;
          if (d < g.HS) acc[rr][k] += pj * vj[d];
        }
      }
    }
  }

#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int i = i0 + warp * kRowsPerWarp + rr;
    if (i >= g.T) continue;
    const float inv = 1.0f / row_sum[rr];
    float* o = out + g.Out(b, i, h);
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      const int d = lane + k * kWarpSize;
      if (d < g.HS) o[d] = acc[rr][k] * inv;
    }
    if (lane == 0) lse[(int64_t{b} * g.NH + h) * g.T + i] = row_max[rr] + logf(row_sum[rr]);
  }
}

// dk and dv for one key tile of one key/value head: grid (ceil(T/kTile), B·KVH), summing over the
// NH/KVH query heads that read it. For key j (a warp row) and query i (lane i of the query tile),
// with p = exp(s − lse_i), dp = do_i·v_j, ds = p·(dp − D_i):
//   dv_j += Σ_i p·do_i;  dk_j += Σ_i ds·q̂_i.
__global__ void __launch_bounds__(kThreads)
    BackwardKeyValueKernel(float* dqkv, const float* dout, const float* qkv, const float* out,
                           const float* lse, Geometry g) {
  extern __shared__ float shared[];
  float* k_tile = shared;                      // (kTile, stride): this block's keys
  float* v_tile = k_tile + kTile * g.stride;   // (kTile, stride): this block's values
  float* q_tile = v_tile + kTile * g.stride;   // (kTile, stride): queries, pre-scaled
  float* do_tile = q_tile + kTile * g.stride;  // (kTile, stride): dout rows of those queries
  float* delta = do_tile + kTile * g.stride;   // (kTile)
  float* lse_tile = delta + kTile;             // (kTile)
  const int b = blockIdx.y / g.KVH;
  const int group = g.NH / g.KVH;
  const int first_head = (blockIdx.y % g.KVH) * group;  // the first query head of this key head
  const int j0 = blockIdx.x * kTile;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;

  LoadQkvTile(k_tile, qkv, g, b, first_head, j0, 1, 1.0f);
  LoadQkvTile(v_tile, qkv, g, b, first_head, j0, 2, 1.0f);

  float dk[kRowsPerWarp][kChunks];
  float dv[kRowsPerWarp][kChunks];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
#pragma unroll
    for (int k = 0; k < kChunks; ++k) dk[rr][k] = dv[rr][k] = 0.0f;
  }

  // Causal: queries before j0 see none of these keys. Tiles are aligned, so start at j0.
  for (int h = first_head; h < first_head + group; ++h) {
    for (int i0 = j0; i0 < g.T; i0 += kTile) {
      __syncthreads();
      LoadQkvTile(q_tile, qkv, g, b, h, i0, 0, g.scale);
      LoadRowsTile(do_tile, dout, g, b, h, i0);
      LoadRowStats(delta, lse_tile, dout, out, lse, g, b, h, i0);
      __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp * kRowsPerWarp + rr;
      const int j = j0 + r;
      if (j >= g.T) continue;  // warp-uniform
      const int i = i0 + lane;
      float p = 0.0f;
      float ds = 0.0f;
      if (i < g.T && i >= j) {
        const float s = Dot(q_tile + lane * g.stride, k_tile + r * g.stride, g.HS);
        p = expf(s - lse_tile[lane]);
        const float dp = Dot(do_tile + lane * g.stride, v_tile + r * g.stride, g.HS);
        ds = p * (dp - delta[lane]);
      }
      for (int ii = 0; ii < kTile; ++ii) {
        const float pi = __shfl_sync(kFullMask, p, ii);
        const float dsi = __shfl_sync(kFullMask, ds, ii);
        const float* doi = do_tile + ii * g.stride;
        const float* qi = q_tile + ii * g.stride;
#pragma unroll
        for (int k = 0; k < kChunks; ++k) {
          const int d = lane + k * kWarpSize;
          if (d < g.HS) {
            dv[rr][k] += pi * doi[d];
            dk[rr][k] += dsi * qi[d];
          }
        }
      }
    }
  }
  }

  // Each (key, d) belongs to exactly one thread of one block: plain read-modify-write.
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int j = j0 + warp * kRowsPerWarp + rr;
    if (j >= g.T) continue;
    float* gk = dqkv + g.Qkv(b, j, 1, first_head);
    float* gv = dqkv + g.Qkv(b, j, 2, first_head);
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      const int d = lane + k * kWarpSize;
      if (d < g.HS) {
        gk[d] += dk[rr][k];
        gv[d] += dv[rr][k];
      }
    }
  }
}

// dq for one query tile: grid (ceil(T/kTile), B·NH). For query i (a warp row) and key j (lane j of
// the key tile): dq̂_i += Σ_j ds·k_j, and dq = dq̂/√HS.
__global__ void __launch_bounds__(kThreads)
    BackwardQueryKernel(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, Geometry g) {
  extern __shared__ float shared[];
  float* q_tile = shared;                      // (kTile, stride): this block's queries, scaled
  float* do_tile = q_tile + kTile * g.stride;  // (kTile, stride): their dout rows
  float* k_tile = do_tile + kTile * g.stride;  // (kTile, stride)
  float* v_tile = k_tile + kTile * g.stride;   // (kTile, stride)
  float* delta = v_tile + kTile * g.stride;    // (kTile)
  float* lse_tile = delta + kTile;             // (kTile)
  const int b = blockIdx.y / g.NH;
  const int h = blockIdx.y % g.NH;
  const int i0 = blockIdx.x * kTile;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;

  LoadQkvTile(q_tile, qkv, g, b, h, i0, 0, g.scale);
  LoadRowsTile(do_tile, dout, g, b, h, i0);
  LoadRowStats(delta, lse_tile, dout, out, lse, g, b, h, i0);

  float dq[kRowsPerWarp][kChunks];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
#pragma unroll
    for (int k = 0; k < kChunks; ++k) dq[rr][k] = 0.0f;
  }

  const int last_query = min(i0 + kTile, g.T) - 1;
  for (int j0 = 0; j0 <= last_query; j0 += kTile) {
    __syncthreads();
    LoadQkvTile(k_tile, qkv, g, b, h, j0, 1, 1.0f);
    LoadQkvTile(v_tile, qkv, g, b, h, j0, 2, 1.0f);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp * kRowsPerWarp + rr;
      const int i = i0 + r;
      if (i >= g.T || j0 > i) continue;  // warp-uniform
      const int j = j0 + lane;
      float ds = 0.0f;
      if (j <= i) {
        const float s = Dot(q_tile + r * g.stride, k_tile + lane * g.stride, g.HS);
        const float p = expf(s - lse_tile[r]);
        const float dp = Dot(do_tile + r * g.stride, v_tile + lane * g.stride, g.HS);
        ds = p * (dp - delta[r]);
      }
      for (int jj = 0; jj < kTile; ++jj) {
        const float dsj = __shfl_sync(kFullMask, ds, jj);
        const float* kj = k_tile + jj * g.stride;
#pragma unroll
        for (int k = 0; k < kChunks; ++k) {
          const int d = lane + k * kWarpSize;
          if (d < g.HS) dq[rr][k] += dsj * kj[d];
        }
      }
    }
  }

#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int i = i0 + warp * kRowsPerWarp + rr;
    if (i >= g.T) continue;
    float* gq = dqkv + g.Qkv(b, i, 0, h);
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      const int d = lane + k * kWarpSize;
      if (d < g.HS) gq[d] += dq[rr][k] * g.scale;
    }
  }
}

// Past 48 KiB of dynamic shared memory a kernel must opt in (at HS = 128 the backward's four tiles
// are 66 KiB; an H100/H200 SM has 227 KiB).
template <typename Kernel>
cudaError_t AllowSharedMemory(Kernel kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(bytes));
}

Geometry MakeGeometry(int T, int NH, int KVH, int HS) {
  return Geometry{T, NH, KVH, HS, OddStride(HS), 1.0f / sqrtf(static_cast<float>(HS))};
}

}  // namespace

namespace launch {

cudaError_t AttentionForward(float* out, float* lse, const float* qkv, int B, int T, int NH,
                             int KVH, int HS, cudaStream_t stream) {
  if (B == 0 || T == 0 || NH == 0) return cudaSuccess;
  if (HS <= 0 || HS > kAttentionMaxHeadSize || KVH <= 0 || NH % KVH != 0) {
    return cudaErrorInvalidValue;
  }
  const Geometry g = MakeGeometry(T, NH, KVH, HS);
  const size_t shared_bytes = sizeof(float) * 3 * kTile * g.stride;
  cudaError_t error = AllowSharedMemory(ForwardKernel, shared_bytes);
  if (error != cudaSuccess) return error;
  const dim3 grid((T + kTile - 1) / kTile, B * NH);
  ForwardKernel<<<grid, kThreads, shared_bytes, stream>>>(out, lse, qkv, g);
  return detail::LaunchResult();
}

cudaError_t AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* out,
                              const float* lse, int B, int T, int NH, int KVH, int HS,
                              cudaStream_t stream) {
  if (B == 0 || T == 0 || NH == 0) return cudaSuccess;
  if (HS <= 0 || HS > kAttentionMaxHeadSize || KVH <= 0 || NH % KVH != 0) {
    return cudaErrorInvalidValue;
  }
  const Geometry g = MakeGeometry(T, NH, KVH, HS);
  const size_t shared_bytes = sizeof(float) * (4 * kTile * g.stride + 2 * kTile);
  cudaError_t error = AllowSharedMemory(BackwardKeyValueKernel, shared_bytes);
  if (error != cudaSuccess) return error;
  error = AllowSharedMemory(BackwardQueryKernel, shared_bytes);
  if (error != cudaSuccess) return error;
  const dim3 key_grid((T + kTile - 1) / kTile, B * KVH);
  BackwardKeyValueKernel<<<key_grid, kThreads, shared_bytes, stream>>>(dqkv, dout, qkv, out, lse,
                                                                       g);
  error = detail::LaunchResult();
  if (error != cudaSuccess) return error;
  const dim3 grid((T + kTile - 1) / kTile, B * NH);
  BackwardQueryKernel<<<grid, kThreads, shared_bytes, stream>>>(dqkv, dout, qkv, out, lse, g);
  return detail::LaunchResult();
}

}  // namespace launch
}  // namespace shardline::kernels::cuda
