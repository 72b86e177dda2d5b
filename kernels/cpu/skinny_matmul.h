// The linear layer of a decode step: out = inp·weightᵀ + bias for a few rows (1 to
// kSkinnyMaxRows), where every weight is read once from memory and used for all the rows.
//
// Why by hand: a decode step multiplies a handful of rows by each weight matrix, so its cost is
// streaming the weights from memory, and a BLAS tuned for large products does not stream them at
// full speed there. On a 2-core AMD EPYC (Zen 4) oneMKL 2026.2 takes its generic code path and
// multiplies 8 rows by GPT-2's head (768 -> 50257, 154 MB) at 6.6 GB/s of weights (23 ms), where
// the memory gives 4x that; its packed GEMM (PackedWeight) does not change that there. llama.cpp's
// server, whose own kernels stream the weights, decoded 2x faster on the same machine
// (bench/serve_compare.py). This kernel keeps four weight rows in registers for the dot products of
// up to four rows at a time (16 accumulators of 16 lanes) with AVX-512 (WideVectors()), the first
// pass over the weights taking up to eight rows by two weight rows, asking for the weights a few
// rows ahead into L2 (on a 2-core Zen 4 EPYC: a GPT-2-small decode step of 8 sequences in
// 19.6-19.9 ms, 23.7-24.2 ms with four-row passes only; skinny_matmul.cc), or two weight rows for 4
// rows at a time with AVX2 and FMA (Avx2Vectors(); 8 accumulators of 8 lanes): on a 2-core AVX2 Zen
// 3 EPYC GPT-2 small served 187.2 output tokens/s at 8 sequences with it, 80.7 with OpenBLAS 0.3.21
// multiplying the steps' rows (bench/serve_compare.py, 2026-12-04). Elsewhere it is
// MatmulForward.
//
// Each output is one dot product summed in a fixed order (16 or 8 lanes over k, then the lanes),
// so a row's result does not depend on how many other rows are in the product or on the threads:
// a request's greedy tokens do not depend on its batch.
#pragma once

#include <cstdint>

namespace shardline::kernels::cpu {

inline constexpr int kSkinnyMaxRows = 128;

// Whether SkinnyMatmulForward has its own kernel on this CPU, AVX-512 or AVX2 (else it calls
// MatmulForward).
bool SkinnyMatmulAvailable();

// Up to how many rows LinearForward runs the skinny kernel rather than the BLAS, for a weight of
// `weight_bytes`: 16 with AVX-512 or AVX2, 0 without; with AVX-512, 128 for a weight of at least
// kSkinnyStreamedBytes. The kernel wins by reading each weight once from memory: on the Zen 4 EPYC
// (2 threads, bench/skinny_matmul_bench, GPT-2 small's weights streamed) it made 1.2-1.5x
// OpenBLAS 0.3.21's sgemm at 32-64 rows and 1.16-1.18x at 128, and against oneDNN 2.6.3 1.6x at 64
// and 1.21-1.29x at 128. A weight that stays in a core's cache is another matter: one thread
// multiplying a 192 KiB weight over and over (a small model's layer, as in the default
// `shardline up` job) ran at 0.60-0.76x oneDNN from 8 to 128 rows (a 1 MiB one, at the limit,
// 0.79-1.11x: in a model that fits no cache it is streamed too); past 16 rows those stay on the
// BLAS (at up to 16 rows the kernel's batch invariance is kept for every size). The eight-lane body
// was measured against OpenBLAS's AVX-512 sgemm up to 32 rows only (and on an AVX2 CPU at 8). A
// serving step of a few decodes beside a prompt chunk, or the prefill of a few short prompts, of a
// model that does not fit a cache, takes the 128.
inline constexpr int64_t kSkinnyStreamedBytes = int64_t{1} << 20;  // the Zen 4's L2 a core
int SkinnyMatmulMaxRows(int64_t weight_bytes);

// As MatmulForward (out (N, OC) = inp (N, C) · weight (OC, C)ᵀ + bias, overwriting out), for
// 1 <= N <= kSkinnyMaxRows; other N go to MatmulForward.
void SkinnyMatmulForward(float* out, const float* inp, const float* weight, const float* bias,
                         int N, int C, int OC);

class PackedWeight;
// MatmulForward for a block's linears (training and inference) and the paged head, choosing by
// N: `packed` (null: none) for 17 to its max_rows() rows (MKL's packed GEMM, on Intel CPUs), else
// the skinny kernel up to SkinnyMatmulMaxRows(its bytes), else sgemm (MKL's matrix-vector path for
// one row, as fast as the packed one).
void LinearForward(float* out, const float* inp, const float* weight, const PackedWeight* packed,
                   const float* bias, int N, int C, int OC);

}  // namespace shardline::kernels::cpu
