// Compressed gradient sums for data parallelism across slow links (issue 35): a bucket of fp32
// gradients is summed EXACTLY inside each host (shared memory) and COMPRESSED, with error feedback,
// on the link between hosts, where bandwidth is scarce. Each host is one "site": after the exact
// sum inside it, its leader (local rank 0) alone talks across hosts and holds the error-feedback
// state, then broadcasts the result to the host's other ranks. With one host the sum is exact (and
// adds, once, whatever a state loaded from a compressing plan carries).
//
// The schemes:
//  - PowerSGD (Vogels et al. 2019) as PyTorch's ddp_comm_hooks powerSGD_hook does it, per matrix M
//    of the bucket: M += e; P = M Q (Q warm-started from the last step, orthogonalised); all-reduce
//    P; orthogonalise P (the hook's Gram-Schmidt); Q = M^T P; all-reduce Q; the site's
//    decompressed part is P (Q / sites)^T and e = M - P (Q / sites)^T. Elements not in a compressed
//    matrix (vectors, and matrices where (rows + cols) · rank · min_compression_rate >= rows ·
//    cols, the hook's rule) are all-reduced exactly, in one batch, and carry no error (the hook's
//    error there, input - average, sums to zero over sites: it only moves rounding around).
//    Two deliberate differences: the hook orthogonalises by QR above rank 2 (the same span, so
//    the same P P^T M, but columns may differ in sign), we always by Gram-Schmidt; and a warm Q
//    that lost a column (a step whose gradient was zero or non-finite) restarts from the seed,
//    where the hook's would stay zero or NaN, since each next Q is M^T P.
//  - int8 with error feedback on both sides, as DeepSpeed's compressed_allreduce (1-bit Adam) but
//    in 8 bits: each site adds its worker error and quantises the bucket to int8 with one scale per
//    chunk of `int8_chunk` elements; the chunks are split into `sites` contiguous parts and part j
//    goes to site j (sites - 1 rounds of SendRecv: a compressed reduce-scatter); the owner decodes
//    and sums the parts, adds its server error, re-quantises, and sends its part to every site (a
//    compressed all-gather); every site decodes the whole. A scale per chunk bounds the damage of
//    an outlier to its chunk: with one scale per bucket, one value 10^4 times the rest would round
//    all the others to zero; 1024 elements per scale cost 0.4% more bytes (4 per 1024 codes), and
//    error feedback carries what the outlier's chunk lost into the next steps.
//
// Results are sums over the group's ranks, not averages: the caller divides. Buffers are host
// memory: a group whose communicators carry device buffers (NCCL) gets Unimplemented.
//
// Error-feedback state is shaped like the rank's whole gradient buffer (`total` floats; buckets
// are [begin, begin + n) ranges of it), so that a checkpoint can store it per tensor:
//  - carried_error(): what this site adds to its next reductions' input (PowerSGD's e, int8's
//    worker error);
//  - server_error(): int8 only: the error of the re-quantised sums of the chunks this site owns
//    (zero elsewhere). It is kept apart from carried_error() because folding it in would change
//    what the next step quantises: a resume would still carry everything, but not bit-identically.
// Resume on the same plan: LoadState(carried, server) on every site, LoadWarmStart(factors) on
// every site (PowerSGD), and the run continues bit-identically. Resume on another plan (another
// number of sites; buckets may differ too): every new site loads SpreadCarriedError(every old
// site's carried and server errors, new sites) as its carried error and no server error, so the
// sites together carry what the old ones did. PowerSGD's Q is the same on every site (an
// all-reduced value), so any site's factors restore any plan with the same matrices at the same
// offsets; without them Q restarts from the seed.
//
// Threading: one thread (the data-parallel strategy's communication thread) calls everything.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "placement/data_parallel_spec.h"
#include "worker/comm/communicator.h"

namespace shardline::model {

// The spec's kinds (data_parallel.compression): kNone, kPowerSgd, kInt8.
using CompressionKind = placement::GradientCompression;
// "none", "powersgd", "int8": the YAML spellings.
inline std::string_view CompressionKindName(CompressionKind kind) {
  return placement::GradientCompressionName(kind);
}

struct CompressionOptions {
  CompressionKind kind = CompressionKind::kNone;  // kNone: exact inside and between hosts
  int rank = 1;                       // PowerSGD: a matrix's rank is min(rank, rows, cols)
  uint64_t seed = 1;                  // PowerSGD: the initial Q, the same on every site
  double min_compression_rate = 2.0;  // PowerSGD: the hook's default
  // PowerSGD: added to a column's norm in Gram-Schmidt (the hook's orthogonalization_epsilon; with
  // 0, a column of zeros stays zeros instead of becoming NaN, as the hook means to do).
  float orthogonalization_epsilon = 0.0f;
  int64_t int8_chunk = 1024;  // int8: elements per scale, in [kMinInt8Chunk, kMaxInt8Chunk]
};
inline constexpr int64_t kMinInt8Chunk = 16;
inline constexpr int64_t kMaxInt8Chunk = int64_t{1} << 20;

// A matrix inside a bucket: `rows` x `cols` floats, row-major, from `offset` (relative to the
// bucket's first element). Matrices of one bucket must not overlap.
struct BucketMatrix {
  int64_t offset = 0;
  int64_t rows = 0;
  int64_t cols = 0;
};

// PowerSGD's warm-start factor of one compressed matrix: Q, `cols` x `rank` row-major (the hook's
// layout), the average over sites of M^T P after the last step (orthogonalised again before use).
struct WarmStartFactor {
  int64_t offset = 0;  // the matrix's first element in the whole gradient buffer
  int64_t rows = 0, cols = 0, rank = 0;
  std::vector<float> q;
};

// Value i of the initial Q of the matrix at `offset` in the gradient buffer (before
// orthogonalisation): model::NormalAt(seed, kInitialQStream + offset, i) (counter_rng.h), the same
// on every site whatever the plan.
inline constexpr uint64_t kInitialQStream = 0x51a7d11e'0000'0000ULL;

// (sum of `old_state`) / new_sites: what each site of a new plan carries. `old_state` holds every
// old site's carried_error() and server_error() (empty ones are skipped), `total` floats each.
absl::StatusOr<std::vector<float>> SpreadCarriedError(
    std::span<const std::span<const float>> old_state, int new_sites);

class GradientCompressor {
 public:
  // `split` is the data-parallel group's host_split(); its communicators must outlive this.
  // `total`: floats in the rank's gradient buffer.
  static absl::StatusOr<std::unique_ptr<GradientCompressor>> Create(
      const CompressionOptions& options, const comm::HostSplit& split, int64_t total);

  // Sums data[0, n) (the gradient buffer's [begin, begin + n)) over the group, in place, on every
  // rank. Every rank calls it with the same buckets in the same order. `matrices` says which parts
  // PowerSGD may compress (the rest is summed exactly); the other kinds ignore it.
  absl::Status AllReduceSum(int64_t begin, float* data, int64_t n,
                            std::span<const BucketMatrix> matrices);

  bool holds_state() const { return !error_.empty(); }  // a site's leader, compressing
  int site() const { return split_.host; }
  int sites() const { return split_.hosts; }
  std::span<const float> carried_error() const { return error_; }        // `total` floats, or empty
  std::span<const float> server_error() const { return server_error_; }  // int8's, or empty
  // On a site's leader: sets the state back (server: int8 only; empty means zeros).
  absl::Status LoadState(std::span<const float> carried, std::span<const float> server);

  // PowerSGD's factors by offset (empty on other ranks and kinds); LoadWarmStart replaces them.
  std::vector<WarmStartFactor> warm_start() const;
  absl::Status LoadWarmStart(const std::vector<WarmStartFactor>& factors);

  // Bytes this rank sent to other hosts in the last AllReduceSum: exact for int8's messages; for
  // the all-reduces of PowerSGD and of exact parts, what a ring all-reduce (Gloo's) sends,
  // 2 · (sites - 1) / sites of the payload.
  int64_t last_cross_bytes() const { return last_cross_bytes_; }
  const CompressionOptions& options() const { return options_; }

 private:
  GradientCompressor(const CompressionOptions& options, const comm::HostSplit& split,
                     int64_t total);

  absl::Status ExactSites(int64_t begin, float* data, int64_t n, const std::string& what);
  absl::Status PowerSgdSites(int64_t begin, float* data, int64_t n,
                             std::span<const BucketMatrix> matrices, const std::string& what);
  absl::Status Int8Sites(int64_t begin, float* data, int64_t n, const std::string& what);
  absl::Status CrossAllReduce(float* data, int64_t n, const std::string& what);

  CompressionOptions options_;
  comm::HostSplit split_;
  int64_t total_;
  std::vector<float> error_, server_error_;
  std::map<int64_t, WarmStartFactor> factors_;  // by offset in the gradient buffer
  int64_t last_cross_bytes_ = 0;
  // Scratch, kept between calls.
  std::vector<float> exact_, before_, p_, q_;
  std::vector<int8_t> codes_;
  std::vector<float> scales_;
  std::vector<int32_t> send_words_, recv_words_;
};

}  // namespace shardline::model
