#include "worker/model/gradient_compression.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "common/status_macros.h"
#include "worker/model/counter_rng.h"

namespace shardline::model {
namespace {

constexpr int64_t kFloatBytes = static_cast<int64_t>(sizeof(float));

std::string Range(int64_t begin, int64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

std::string DescribeMatrix(const BucketMatrix& m) {
  return "matrix at bucket offset " + std::to_string(m.offset) + " (" + std::to_string(m.rows) +
         " x " + std::to_string(m.cols) + ")";
}

// ---- PowerSGD's linear algebra on row-major matrices; r (the rank) is small. ----

// p (rows x r) = m (rows x cols) · q (cols x r)
void MultiplyMQ(const float* m, int64_t rows, int64_t cols, const float* q, int64_t r, float* p) {
  std::fill(p, p + rows * r, 0.0f);
  for (int64_t i = 0; i < rows; ++i) {
    float* out = p + i * r;
    const float* row = m + i * cols;
    for (int64_t j = 0; j < cols; ++j) {
      const float v = row[j];
      const float* qj = q + j * r;
      for (int64_t k = 0; k < r; ++k) out[k] += v * qj[k];
    }
  }
}

// q (cols x r) = m^T · p (rows x r)
void MultiplyMtP(const float* m, int64_t rows, int64_t cols, const float* p, int64_t r, float* q) {
  std::fill(q, q + cols * r, 0.0f);
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = m + i * cols;
    const float* pi = p + i * r;
    for (int64_t j = 0; j < cols; ++j) {
      const float v = row[j];
      float* qj = q + j * r;
      for (int64_t k = 0; k < r; ++k) qj[k] += v * pi[k];
    }
  }
}

// The hook's _orthogonalize_gram_schmidt on the r columns of a (rows x r): each column in turn is
// normalised (by its norm + epsilon) and removed from the columns after it. Returns false when a
// column had no direction left (zero or non-finite norm); such a column is set to zeros (the
// hook's intent for epsilon = 0, where torch would produce NaN).
bool Orthogonalize(float* a, int64_t rows, int64_t r, float epsilon) {
  bool all_had_norm = true;
  for (int64_t i = 0; i < r; ++i) {
    double sq = 0.0;
    for (int64_t row = 0; row < rows; ++row) {
      const double v = a[row * r + i];
      sq += v * v;
    }
    const float norm = static_cast<float>(std::sqrt(sq));
    if (!(norm > 0.0f) || !std::isfinite(norm)) {
      all_had_norm = false;
      for (int64_t row = 0; row < rows; ++row) a[row * r + i] = 0.0f;
      continue;
    }
    const float divisor = norm + epsilon;
    for (int64_t row = 0; row < rows; ++row) a[row * r + i] /= divisor;
    for (int64_t j = i + 1; j < r; ++j) {
      float dot = 0.0f;
      for (int64_t row = 0; row < rows; ++row) dot += a[row * r + i] * a[row * r + j];
      for (int64_t row = 0; row < rows; ++row) a[row * r + j] -= dot * a[row * r + i];
    }
  }
  return all_had_norm;
}

void DrawInitialQ(uint64_t seed, int64_t offset, std::vector<float>& q) {
  const uint64_t stream = kInitialQStream + static_cast<uint64_t>(offset);
  for (size_t i = 0; i < q.size(); ++i) {
    q[i] = static_cast<float>(NormalAt(seed, stream, static_cast<uint64_t>(i)));
  }
}

// ---- int8 ----

// One chunk: scale = max|x| / 127 and code = round-half-even(x · 127 / max|x|), in double so that
// no finite float overflows; codes stay in [-127, 127] (symmetric: -x gets -code). A chunk
// holding inf or NaN gets a NaN scale: it decodes to NaN, as an exact sum would be non-finite.
void QuantiseChunk(const float* x, int64_t n, int8_t* codes, float* scale) {
  float max_abs = 0.0f;
  bool finite = true;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) finite = false;
    max_abs = std::max(max_abs, std::fabs(x[i]));
  }
  if (!finite || max_abs == 0.0f) {
    std::fill(codes, codes + n, int8_t{0});
    *scale = finite ? 0.0f : std::nanf("");
    return;
  }
  const double inverse = 127.0 / static_cast<double>(max_abs);
  for (int64_t i = 0; i < n; ++i) {
    const long code = std::lrint(static_cast<double>(x[i]) * inverse);
    codes[i] = static_cast<int8_t>(std::clamp(code, -127L, 127L));
  }
  *scale = static_cast<float>(static_cast<double>(max_abs) / 127.0);
}

float Decode(int8_t code, float scale) { return static_cast<float>(code) * scale; }

// Error feedback keeps what is finite: a non-finite chunk's residual would poison every later
// step, while the chunk itself already came out non-finite this step.
float Residual(float value, float decoded) {
  const float residual = value - decoded;
  return std::isfinite(residual) ? residual : 0.0f;
}

// Which elements and chunks of a bucket site j owns: whole chunks, split as evenly as they go.
struct Part {
  int64_t first_chunk = 0, chunks = 0;
  int64_t begin = 0, end = 0;  // elements
};

Part PartOf(int site, int sites, int64_t n, int64_t chunk) {
  const int64_t total_chunks = (n + chunk - 1) / chunk;
  Part part;
  part.first_chunk = total_chunks * site / sites;
  const int64_t last = total_chunks * (site + 1) / sites;
  part.chunks = last - part.first_chunk;
  part.begin = std::min(n, part.first_chunk * chunk);
  part.end = std::min(n, last * chunk);
  return part;
}

// A part on the wire: its scales (fp32), then its codes (one byte each), padded to whole 32-bit
// words because DType has no 8-bit type; at most 3 bytes of padding per message.
int64_t WordsOf(const Part& part) {
  const int64_t bytes = part.chunks * kFloatBytes + (part.end - part.begin);
  return (bytes + 3) / 4;
}

void Pack(const Part& part, const std::vector<float>& scales, const std::vector<int8_t>& codes,
          std::vector<int32_t>& words) {
  words.assign(static_cast<size_t>(WordsOf(part)), 0);
  char* out = reinterpret_cast<char*>(words.data());
  std::memcpy(out, scales.data() + part.first_chunk, part.chunks * kFloatBytes);
  std::memcpy(out + part.chunks * kFloatBytes, codes.data() + part.begin, part.end - part.begin);
}

void Unpack(const Part& part, const std::vector<int32_t>& words, std::vector<float>& scales,
            std::vector<int8_t>& codes) {
  const char* in = reinterpret_cast<const char*>(words.data());
  std::memcpy(scales.data() + part.first_chunk, in, part.chunks * kFloatBytes);
  std::memcpy(codes.data() + part.begin, in + part.chunks * kFloatBytes, part.end - part.begin);
}

}  // namespace

absl::StatusOr<std::vector<float>> SpreadCarriedError(
    std::span<const std::span<const float>> old_state, int new_sites) {
  const std::string what = "spreading the carried error of " + std::to_string(old_state.size()) +
                           " old site states over " + std::to_string(new_sites) + " new sites";
  if (new_sites < 1) return absl::InvalidArgumentError(what + ": no new site");
  std::vector<double> sum;
  for (size_t i = 0; i < old_state.size(); ++i) {
    const std::span<const float> state = old_state[i];
    if (state.empty()) continue;
    if (sum.empty()) sum.assign(state.size(), 0.0);
    if (state.size() != sum.size()) {
      return absl::InvalidArgumentError(what + ": state " + std::to_string(i) + " has " +
                                        std::to_string(state.size()) + " floats, the first " +
                                        std::to_string(sum.size()));
    }
    for (size_t k = 0; k < state.size(); ++k) sum[k] += state[k];
  }
  std::vector<float> spread(sum.size());
  for (size_t k = 0; k < sum.size(); ++k) spread[k] = static_cast<float>(sum[k] / new_sites);
  return spread;
}

absl::StatusOr<std::unique_ptr<GradientCompressor>> GradientCompressor::Create(
    const CompressionOptions& options, const comm::HostSplit& split, int64_t total) {
  const std::string what =
      "gradient compression (" + std::string(CompressionKindName(options.kind)) + ")";
  auto bad = [&](const std::string& why) { return absl::InvalidArgumentError(what + ": " + why); };
  if (total < 0) return bad("total gradient size " + std::to_string(total) + " is negative");
  if (options.kind == CompressionKind::kPowerSgd) {
    if (options.rank < 1) return bad("rank " + std::to_string(options.rank) + " must be >= 1");
    if (!(options.min_compression_rate > 0.0)) {
      return bad("min_compression_rate " + std::to_string(options.min_compression_rate) +
                 " must be > 0");
    }
    if (!(options.orthogonalization_epsilon >= 0.0f)) {
      return bad("orthogonalization_epsilon must be >= 0");
    }
  }
  if (options.kind == CompressionKind::kInt8 &&
      (options.int8_chunk < kMinInt8Chunk || options.int8_chunk > kMaxInt8Chunk)) {
    return bad("int8_chunk " + std::to_string(options.int8_chunk) + " must be in [" +
               std::to_string(kMinInt8Chunk) + ", " + std::to_string(kMaxInt8Chunk) + "]");
  }
  if (split.hosts < 1 || split.host < 0 || split.host >= split.hosts || split.local_size < 1 ||
      split.local_rank < 0 || split.local_rank >= split.local_size) {
    return bad("inconsistent host split: host " + std::to_string(split.host) + " of " +
               std::to_string(split.hosts) + ", local rank " + std::to_string(split.local_rank) +
               " of " + std::to_string(split.local_size));
  }
  if (split.local_size > 1 && split.local == nullptr) {
    return bad("a host of " + std::to_string(split.local_size) + " ranks has no local group");
  }
  if (split.hosts > 1 && (split.cross == nullptr || split.cross->size() != split.hosts)) {
    return bad("the group spans " + std::to_string(split.hosts) +
               " hosts but has no cross-host group of that size");
  }
  for (const comm::Communicator* c : {split.local, split.cross}) {
    if (c != nullptr && c->device_buffers()) {
      return absl::UnimplementedError(
          what + ": works on host memory, and the " + std::string(c->backend()) +
          " communicator carries device buffers (compress on a CPU data-parallel group)");
    }
  }
  return std::unique_ptr<GradientCompressor>(new GradientCompressor(options, split, total));
}

GradientCompressor::GradientCompressor(const CompressionOptions& options,
                                       const comm::HostSplit& split, int64_t total)
    : options_(options), split_(split), total_(total) {
  if (options.kind != CompressionKind::kNone && split.local_rank == 0) {
    error_.assign(static_cast<size_t>(total), 0.0f);
    if (options.kind == CompressionKind::kInt8)
      server_error_.assign(static_cast<size_t>(total), 0.0f);
  }
}

absl::Status GradientCompressor::AllReduceSum(int64_t begin, float* data, int64_t n,
                                              std::span<const BucketMatrix> matrices) {
  const std::string what = std::string(CompressionKindName(options_.kind)) +
                           " gradient sum of bucket " + Range(begin, begin + n) + " on site " +
                           std::to_string(split_.host) + " of " + std::to_string(split_.hosts);
  if (begin < 0 || n < 0 || begin + n > total_) {
    return absl::InvalidArgumentError(what + ": outside the gradient buffer of " +
                                      std::to_string(total_) + " floats");
  }
  if (n > 0 && data == nullptr) return absl::InvalidArgumentError(what + ": null data");
  std::vector<BucketMatrix> sorted(matrices.begin(), matrices.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const BucketMatrix& a, const BucketMatrix& b) { return a.offset < b.offset; });
  int64_t covered_to = 0;
  for (const BucketMatrix& m : sorted) {
    if (m.offset < 0 || m.rows < 1 || m.cols < 1 || m.rows > n || m.cols > n ||
        m.offset + m.rows * m.cols > n) {
      return absl::InvalidArgumentError(what + ": " + DescribeMatrix(m) +
                                        " is empty or does not fit in the bucket's " +
                                        std::to_string(n) + " floats");
    }
    if (m.offset < covered_to) {
      return absl::InvalidArgumentError(what + ": " + DescribeMatrix(m) +
                                        " overlaps the matrix before it");
    }
    covered_to = m.offset + m.rows * m.cols;
  }
  last_cross_bytes_ = 0;
  if (n == 0) return absl::OkStatus();  // every rank returns here alike
  if (split_.local != nullptr) {
    RETURN_IF_ERROR(Annotate(split_.local->AllReduce(data, static_cast<size_t>(n), DType::kFloat32,
                                                     comm::ReduceOp::kSum),
                             what + ": exact sum inside the host"));
  }
  if (split_.local_rank == 0) {
    if (split_.hosts == 1 || options_.kind == CompressionKind::kNone) {
      RETURN_IF_ERROR(ExactSites(begin, data, n, what));
    } else if (options_.kind == CompressionKind::kPowerSgd) {
      RETURN_IF_ERROR(PowerSgdSites(begin, data, n, sorted, what));
    } else {
      RETURN_IF_ERROR(Int8Sites(begin, data, n, what));
    }
  }
  if (split_.local != nullptr) {
    RETURN_IF_ERROR(
        Annotate(split_.local->Broadcast(data, static_cast<size_t>(n), DType::kFloat32, /*root=*/0),
                 what + ": broadcast of the host leader's result"));
  }
  return absl::OkStatus();
}

absl::Status GradientCompressor::CrossAllReduce(float* data, int64_t n, const std::string& what) {
  if (n == 0 || split_.hosts == 1) return absl::OkStatus();
  const int64_t h = split_.hosts;
  last_cross_bytes_ += 2 * (h - 1) * n * kFloatBytes / h;
  return Annotate(
      split_.cross->AllReduce(data, static_cast<size_t>(n), DType::kFloat32, comm::ReduceOp::kSum),
      what);
}

absl::Status GradientCompressor::ExactSites(int64_t begin, float* data, int64_t n,
                                            const std::string& what) {
  // What a compressing plan carried (a resume from one) is handed on once, and nothing is left.
  if (holds_state()) {
    float* error = error_.data() + begin;
    for (int64_t i = 0; i < n; ++i) data[i] += error[i];
    std::fill(error, error + n, 0.0f);
    if (!server_error_.empty()) {
      float* server = server_error_.data() + begin;
      for (int64_t i = 0; i < n; ++i) data[i] += server[i];
      std::fill(server, server + n, 0.0f);
    }
  }
  return CrossAllReduce(data, n, what + ": exact all-reduce between hosts");
}

absl::Status GradientCompressor::PowerSgdSites(int64_t begin, float* data, int64_t n,
                                               std::span<const BucketMatrix> matrices,
                                               const std::string& what) {
  const int64_t sites = split_.hosts;
  float* error = error_.data() + begin;
  for (int64_t i = 0; i < n; ++i) data[i] += error[i];

  // The hook's choice: a matrix is compressed when its factors are smaller by
  // min_compression_rate; everything else is summed exactly in one batch.
  struct Compressed {
    BucketMatrix m;
    int64_t r, p_at, q_at;
  };
  std::vector<Compressed> compressed;
  int64_t p_size = 0, q_size = 0;
  for (const BucketMatrix& m : matrices) {
    const int64_t r = std::min<int64_t>({options_.rank, m.rows, m.cols});
    if (static_cast<double>((m.rows + m.cols) * r) * options_.min_compression_rate <
        static_cast<double>(m.rows * m.cols)) {
      compressed.push_back({m, r, p_size, q_size});
      p_size += m.rows * r;
      q_size += m.cols * r;
    }
  }
  // The exact elements: the gaps between compressed matrices, in bucket order.
  std::vector<std::pair<int64_t, int64_t>> gaps;
  int64_t at = 0;
  for (const Compressed& c : compressed) {
    if (c.m.offset > at) gaps.emplace_back(at, c.m.offset);
    at = c.m.offset + c.m.rows * c.m.cols;
  }
  if (at < n) gaps.emplace_back(at, n);
  exact_.clear();
  for (auto [from, to] : gaps) exact_.insert(exact_.end(), data + from, data + to);

  p_.assign(static_cast<size_t>(p_size), 0.0f);
  q_.assign(static_cast<size_t>(q_size), 0.0f);
  for (const Compressed& c : compressed) {
    const int64_t offset = begin + c.m.offset;
    WarmStartFactor& factor = factors_[offset];
    float* q = q_.data() + c.q_at;
    const bool warm = factor.rows == c.m.rows && factor.cols == c.m.cols && factor.rank == c.r &&
                      factor.q.size() == static_cast<size_t>(c.m.cols * c.r);
    if (warm) std::copy(factor.q.begin(), factor.q.end(), q);
    // A warm Q that lost a direction (a step whose gradient was zero or non-finite) would stay
    // degenerate forever, since each step's Q is M^T P: it restarts from the seed instead.
    if (!warm || !Orthogonalize(q, c.m.cols, c.r, options_.orthogonalization_epsilon)) {
      factor = WarmStartFactor{offset, c.m.rows, c.m.cols, c.r, std::vector<float>(c.m.cols * c.r)};
      DrawInitialQ(options_.seed, offset, factor.q);
      std::copy(factor.q.begin(), factor.q.end(), q);
      Orthogonalize(q, c.m.cols, c.r, options_.orthogonalization_epsilon);
    }
    MultiplyMQ(data + c.m.offset, c.m.rows, c.m.cols, q, c.r, p_.data() + c.p_at);
  }
  RETURN_IF_ERROR(CrossAllReduce(exact_.data(), static_cast<int64_t>(exact_.size()),
                                 what + ": exact all-reduce of " + std::to_string(exact_.size()) +
                                     " uncompressed floats between hosts"));
  RETURN_IF_ERROR(CrossAllReduce(p_.data(), p_size,
                                 what + ": all-reduce of the P factors (" + std::to_string(p_size) +
                                     " floats) between hosts"));
  for (const Compressed& c : compressed) {
    float* p = p_.data() + c.p_at;
    Orthogonalize(p, c.m.rows, c.r, options_.orthogonalization_epsilon);
    MultiplyMtP(data + c.m.offset, c.m.rows, c.m.cols, p, c.r, q_.data() + c.q_at);
  }
  RETURN_IF_ERROR(CrossAllReduce(q_.data(), q_size,
                                 what + ": all-reduce of the Q factors (" + std::to_string(q_size) +
                                     " floats) between hosts"));

  // The hook decompresses with the average Q; the site's error is its input minus that, so the
  // errors of all sites add up to exactly what the sum lost.
  for (float& v : q_) v /= static_cast<float>(sites);
  std::fill(error, error + n, 0.0f);
  for (const Compressed& c : compressed) {
    const float* p = p_.data() + c.p_at;
    const float* q = q_.data() + c.q_at;
    WarmStartFactor& factor = factors_[begin + c.m.offset];
    std::copy(q, q + c.m.cols * c.r, factor.q.begin());
    float* m = data + c.m.offset;
    float* e = error + c.m.offset;
    for (int64_t i = 0; i < c.m.rows; ++i) {
      for (int64_t j = 0; j < c.m.cols; ++j) {
        float approx = 0.0f;
        for (int64_t k = 0; k < c.r; ++k) approx += p[i * c.r + k] * q[j * c.r + k];
        e[i * c.m.cols + j] = m[i * c.m.cols + j] - approx;
        m[i * c.m.cols + j] = approx * static_cast<float>(sites);
      }
    }
  }
  int64_t from_exact = 0;
  for (auto [from, to] : gaps) {
    std::copy(exact_.begin() + from_exact, exact_.begin() + from_exact + (to - from), data + from);
    from_exact += to - from;
  }
  return absl::OkStatus();
}

absl::Status GradientCompressor::Int8Sites(int64_t begin, float* data, int64_t n,
                                           const std::string& what) {
  const int sites = split_.hosts;
  const int me = split_.host;
  const int64_t chunk = options_.int8_chunk;
  const int64_t chunks = (n + chunk - 1) / chunk;
  float* worker_error = error_.data() + begin;
  float* server_error = server_error_.data() + begin;

  // Worker side: add the carried error, quantise every chunk, keep what the codes lost.
  codes_.resize(static_cast<size_t>(n));
  scales_.resize(static_cast<size_t>(chunks));
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t from = c * chunk, to = std::min(n, from + chunk);
    for (int64_t i = from; i < to; ++i) data[i] += worker_error[i];
    QuantiseChunk(data + from, to - from, codes_.data() + from, &scales_[c]);
    for (int64_t i = from; i < to; ++i) {
      worker_error[i] = Residual(data[i], Decode(codes_[i], scales_[c]));
    }
  }

  // Compressed reduce-scatter: in round s this site sends its codes of part (me + s) to that
  // part's owner and receives its own part from site (me - s); the sum runs in that fixed order.
  const Part mine = PartOf(me, sites, n, chunk);
  exact_.assign(static_cast<size_t>(mine.end - mine.begin), 0.0f);
  // `scales` and `codes` start at chunk `scale_base` and element `code_base` of the bucket.
  auto accumulate = [&](const std::vector<float>& scales, const std::vector<int8_t>& codes,
                        int64_t scale_base, int64_t code_base) {
    for (int64_t c = mine.first_chunk; c < mine.first_chunk + mine.chunks; ++c) {
      const float scale = scales[c - mine.first_chunk + scale_base];
      const int64_t from = c * chunk, to = std::min(n, from + chunk);
      for (int64_t i = from; i < to; ++i) {
        exact_[i - mine.begin] += Decode(codes[i - code_base], scale);
      }
    }
  };
  accumulate(scales_, codes_, mine.first_chunk, 0);
  std::vector<float> their_scales(static_cast<size_t>(mine.chunks));
  std::vector<int8_t> their_codes(static_cast<size_t>(mine.end - mine.begin));
  for (int s = 1; s < sites; ++s) {
    const int to = (me + s) % sites, from = (me - s + sites) % sites;
    const Part theirs = PartOf(to, sites, n, chunk);
    Pack(theirs, scales_, codes_, send_words_);
    recv_words_.assign(static_cast<size_t>(WordsOf(mine)), 0);
    last_cross_bytes_ += static_cast<int64_t>(send_words_.size()) * 4;
    RETURN_IF_ERROR(Annotate(
        split_.cross->SendRecv(send_words_.data(), send_words_.size(), to, recv_words_.data(),
                               recv_words_.size(), from, DType::kInt32),
        what + ": compressed reduce-scatter, round " + std::to_string(s) + " (part " +
            Range(theirs.begin, theirs.end) + " to site " + std::to_string(to) + ")"));
    const char* in = reinterpret_cast<const char*>(recv_words_.data());
    std::memcpy(their_scales.data(), in, mine.chunks * kFloatBytes);
    std::memcpy(their_codes.data(), in + mine.chunks * kFloatBytes, mine.end - mine.begin);
    accumulate(their_scales, their_codes, 0, mine.begin);
  }

  // Server side: the owner adds its carried error to the sum and re-quantises its part.
  for (int64_t c = mine.first_chunk; c < mine.first_chunk + mine.chunks; ++c) {
    const int64_t from = c * chunk, to = std::min(n, from + chunk);
    float* sum = exact_.data() + (from - mine.begin);
    for (int64_t i = from; i < to; ++i) sum[i - from] += server_error[i];
    QuantiseChunk(sum, to - from, codes_.data() + from, &scales_[c]);
    for (int64_t i = from; i < to; ++i) {
      server_error[i] = Residual(sum[i - from], Decode(codes_[i], scales_[c]));
    }
  }

  // Compressed all-gather: round s sends this site's part to site (me + s) and receives site
  // (me - s)'s.
  Pack(mine, scales_, codes_, send_words_);
  for (int s = 1; s < sites; ++s) {
    const int to = (me + s) % sites, from = (me - s + sites) % sites;
    const Part theirs = PartOf(from, sites, n, chunk);
    recv_words_.assign(static_cast<size_t>(WordsOf(theirs)), 0);
    last_cross_bytes_ += static_cast<int64_t>(send_words_.size()) * 4;
    RETURN_IF_ERROR(Annotate(
        split_.cross->SendRecv(send_words_.data(), send_words_.size(), to, recv_words_.data(),
                               recv_words_.size(), from, DType::kInt32),
        what + ": compressed all-gather, round " + std::to_string(s) + " (part " +
            Range(theirs.begin, theirs.end) + " from site " + std::to_string(from) + ")"));
    Unpack(theirs, recv_words_, scales_, codes_);
  }
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t from = c * chunk, to = std::min(n, from + chunk);
    for (int64_t i = from; i < to; ++i) data[i] = Decode(codes_[i], scales_[c]);
  }
  return absl::OkStatus();
}

absl::Status GradientCompressor::LoadState(std::span<const float> carried,
                                           std::span<const float> server) {
  const std::string what = "loading the " + std::string(CompressionKindName(options_.kind)) +
                           " error-feedback state of site " + std::to_string(split_.host);
  if (!holds_state()) {
    return absl::FailedPreconditionError(
        what + ": this rank holds none (only a compressing site's leader, local rank 0, does)");
  }
  if (carried.size() != error_.size()) {
    return absl::InvalidArgumentError(what + ": carried error has " +
                                      std::to_string(carried.size()) + " floats, the gradient " +
                                      std::to_string(error_.size()));
  }
  if (!server.empty() && server.size() != server_error_.size()) {
    return absl::InvalidArgumentError(
        what + ": server error has " + std::to_string(server.size()) + " floats, expected " +
        (server_error_.empty() ? std::string("none (only int8 has one)")
                               : std::to_string(server_error_.size())));
  }
  std::copy(carried.begin(), carried.end(), error_.begin());
  if (server.empty()) {
    std::fill(server_error_.begin(), server_error_.end(), 0.0f);
  } else {
    std::copy(server.begin(), server.end(), server_error_.begin());
  }
  return absl::OkStatus();
}

std::vector<WarmStartFactor> GradientCompressor::warm_start() const {
  std::vector<WarmStartFactor> out;
  out.reserve(factors_.size());
  for (const auto& [offset, factor] : factors_) out.push_back(factor);
  return out;
}

absl::Status GradientCompressor::LoadWarmStart(const std::vector<WarmStartFactor>& factors) {
  const std::string what =
      "loading PowerSGD's warm-start factors on site " + std::to_string(split_.host);
  if (options_.kind != CompressionKind::kPowerSgd || !holds_state()) {
    return absl::FailedPreconditionError(what + ": only a PowerSGD site's leader holds them");
  }
  std::map<int64_t, WarmStartFactor> loaded;
  for (const WarmStartFactor& f : factors) {
    const std::string which = what + ": the factor of the matrix at " + std::to_string(f.offset) +
                              " (" + std::to_string(f.rows) + " x " + std::to_string(f.cols) +
                              ", rank " + std::to_string(f.rank) + ")";
    if (f.offset < 0 || f.rows < 1 || f.cols < 1 || f.rows > total_ || f.cols > total_ ||
        f.offset + f.rows * f.cols > total_) {
      return absl::InvalidArgumentError(which + " does not fit in the gradient buffer of " +
                                        std::to_string(total_) + " floats");
    }
    if (f.rank != std::min<int64_t>({options_.rank, f.rows, f.cols})) {
      return absl::InvalidArgumentError(which + ": rank should be min(rank " +
                                        std::to_string(options_.rank) + ", rows, cols)");
    }
    if (f.q.size() != static_cast<size_t>(f.cols * f.rank)) {
      return absl::InvalidArgumentError(which + ": Q has " + std::to_string(f.q.size()) +
                                        " floats, expected cols x rank");
    }
    if (!loaded.emplace(f.offset, f).second) {
      return absl::InvalidArgumentError(which + ": given twice");
    }
  }
  factors_ = std::move(loaded);
  return absl::OkStatus();
}

}  // namespace shardline::model
