// Written by hand: no library gives this. Gloo has no shared-memory transport, OpenMPI's is not
// a library one embeds beside Gloo, and DeepSpeed's and vLLM's (csrc/cpu/comm/shm.cpp,
// csrc/cpu/shm.cpp) are PyTorch extensions that spin forever on a dead peer. The shape follows
// them and MPICH's release/gather: per-rank control lines with release/acquire counters, one-shot
// for small messages, and for large ones whichever is fastest here, timed on the live traffic
// (all_reduce_tuner.h), of a chunked one-shot, a chunked reduce-scatter + all-gather (each also
// with streamed stores into the segment), and OpenMPI's single-copy idea (each rank reads its
// peers' buffers through process_vm_readv).
#include "worker/comm/shm_communicator.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <utility>

#include <spdlog/spdlog.h>

#include "common/process.h"
#include "common/status_macros.h"
#include "kernels/half.h"
#include "worker/comm/shared_host_memory.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace shardline::comm {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kMagic = 0x324d4853'4e4c4853ull;  // "SHLNSHM2"
// Two lines: Intel's adjacent-line prefetcher pulls pairs, so one line alone still false-shares.
constexpr size_t kLine = 128;
constexpr size_t kPage = 4096;
constexpr size_t kDefaultSlotBytes = 1 << 20;
constexpr size_t kMailboxBytes = 256 << 10;
// Reduction block: the partial sums of one block stay in L1 while the ranks' inputs stream in.
constexpr size_t kReduceBlock = 2048;

// Waiting: spin while a peer is likely to answer within microseconds, then give the core away
// (ranks may outnumber cores), then sleep on the futex in slices that bound how late an abort,
// a dead peer or the deadline is seen.
// The spin is short: when ranks share a core (more ranks than cores, or a busy machine), every
// microsecond spun is one the peer we wait for cannot run.
constexpr auto kSpinFor = std::chrono::microseconds(5);
constexpr auto kYieldFor = std::chrono::microseconds(2000);
constexpr auto kSleepSlice = std::chrono::milliseconds(2);
constexpr auto kLivenessEvery = std::chrono::milliseconds(1);
// The single copy reads its peers' parts in blocks that stay in L2 while they are reduced;
// 256 KiB beat 16 and 64 KiB on a 2-core Xeon. The one-shot above one_shot_bytes runs in chunks
// of kOneShotChunk: on a 2-vCPU EPYC (512 KiB L2), 64 and 128 KiB chunks beat whole 1 MiB slots
// at 1-16 MiB.
constexpr size_t kSingleCopyBlock = size_t{256} << 10;
constexpr size_t kOneShotChunk = size_t{128} << 10;
// Peer shared blocks kept mapped per peer (shared_host_memory.h): a model's gradients are one.
constexpr size_t kPeerBlocksKept = 8;

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// A copy into lines a peer reads, around this core's caches (non-temporal stores), for the
// streamed algorithms (all_reduce_tuner.h). A normal store to a line a peer has read must first
// take the line back from the peer's cache (a read-for-ownership), one line at a time: on the
// 2-vCPU EPYC, 64 KiB written over lines the other vCPU had just read took 27.7 us with normal
// stores and 2.0 us streamed in one of the host's moods (7.2 and 2.1 in another), and the peer
// then read the streamed bytes at 27-28 GB/s (22-59 GB/s from the writer's cache). Which wins
// depends on the moment: the tuner times both.
void StreamCopy(void* to, const void* from, size_t bytes) {
#if defined(__x86_64__)
  char* dst = static_cast<char*>(to);
  const char* src = static_cast<const char*>(from);
  // Up to the first 16-byte boundary the normal way, then whole 16-byte stores (SSE2: every
  // x86-64 has them, and the write-combining buffers join them into lines), then the tail.
  const size_t head = std::min(bytes, (16 - reinterpret_cast<uintptr_t>(dst) % 16) % 16);
  std::memcpy(dst, src, head);
  size_t i = head;
  for (; i + 16 <= bytes; i += 16) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
  }
  std::memcpy(dst + i, src + i, bytes - i);
  // Streamed stores are weakly ordered: they must be visible before the release that publishes
  // them.
  _mm_sfence();
#else
  std::memcpy(to, from, bytes);
#endif
}

void PlainCopy(void* to, const void* from, size_t bytes) { std::memcpy(to, from, bytes); }
using CopyFn = void (*)(void*, const void*, size_t);

inline void CpuRelax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

struct alignas(kLine) SegmentHeader {
  uint64_t magic;
  uint64_t nonce;
  uint32_t ranks;
  uint32_t reserved;
  uint64_t slot_bytes;
  uint64_t mailbox_bytes;
  uint64_t total_bytes;
  alignas(kLine) std::atomic<uint32_t> attached;
  alignas(kLine) std::atomic<uint32_t> aborted_by;  // rank + 1 of the first Abort(), 0 if none
  alignas(kLine) std::atomic<uint32_t> wake;        // the futex word
  std::atomic<uint32_t> sleepers;                   // waiters inside futex_wait
  // Rank 0's choice of all-reduce algorithm per size bucket (AllReduceTuner), for tuned
  // all-reduce number m in plan[m % 2]. Rank 0 writes plan[(m + 1) % 2] when it starts number m,
  // before its first publish in it; the others read plan[m % 2] when they start number m, before
  // theirs. A reader of plan[m % 2] has seen rank 0's publishes in number m - 1 (written before
  // them), and rank 0 cannot be writing that half again (at number m + 1) before every rank has
  // published in number m, i.e. after reading.
  alignas(kLine) std::atomic<uint8_t> plan[2][AllReduceTuner::kBuckets];
};

// One rank's phase counter, and what its single-copy all-reduce publishes with a phase (the
// address of its buffer; whether it can read its peers' memory): written only by its rank, read
// by the others after they have seen the phase (its release store orders both).
struct alignas(kLine) ControlLine {
  std::atomic<uint64_t> phase;
  std::atomic<uint64_t> address;
  std::atomic<uint32_t> reads_peers;  // 1: process_vm_readv from every peer worked
  // The buffer's shared block (shared_host_memory.h), if it lies in one: fd -1 if not.
  std::atomic<int32_t> shared_fd;
  std::atomic<uint64_t> shared_id;
  std::atomic<uint64_t> shared_block_bytes;
  std::atomic<uint64_t> shared_offset;
};

// One direction of one pair: chunks sent by the source, chunks taken by the destination.
struct MailboxControl {
  alignas(kLine) std::atomic<uint64_t> sent;
  alignas(kLine) std::atomic<uint64_t> taken;
};

static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

// Where each part of the segment starts; the same arithmetic on every rank.
struct Layout {
  Layout(int n, size_t slot, size_t mailbox) : ranks(n), slot_bytes(slot), mailbox_bytes(mailbox) {
    size_t at = RoundUp(sizeof(SegmentHeader), kLine);
    controls = at;
    at += static_cast<size_t>(n) * sizeof(ControlLine);
    mailbox_controls = at;
    at += static_cast<size_t>(n) * n * sizeof(MailboxControl);
    at = RoundUp(at, kPage);
    inputs = at;
    at += static_cast<size_t>(n) * 2 * slot;
    results = at;
    at += 2 * slot;
    mailboxes = at;
    at += static_cast<size_t>(n) * n * 2 * mailbox;
    total = RoundUp(at, kPage);
  }
  int ranks;
  size_t slot_bytes, mailbox_bytes;
  size_t controls, mailbox_controls, inputs, results, mailboxes, total;
};

long Futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

int PidfdOpen(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

// The state letter of /proc/<pid>/stat ('R', 'S', 'T' stopped, 'Z' zombie...), or '?'.
char ProcessState(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return '?';
  const size_t paren = line.rfind(')');  // the command name may hold spaces and parentheses
  if (paren == std::string::npos || paren + 2 >= line.size()) return '?';
  return line[paren + 2];
}

std::string DescribeState(char state) {
  switch (state) {
    case 'T': return "stopped";
    case 't': return "stopped by a debugger";
    case 'Z': return "exited";
    case 'D': return "in uninterruptible sleep";
    case '?': return "gone";
    default: return "running";
  }
}

std::string ReadFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string NamespaceId(const char* name) {
  struct stat st{};
  if (stat((std::string("/proc/self/ns/") + name).c_str(), &st) != 0) return "?";
  return std::to_string(st.st_ino);
}

// ---------------------------------------------------------------- reductions, in rank order

template <typename T>
struct Wide {
  using type = T;
  static T Load(T v) { return v; }
  static T Store(T v) { return v; }
};
template <>
struct Wide<kernels::BFloat16> {
  using type = float;
  static float Load(kernels::BFloat16 v) { return kernels::BFloat16ToFloat(v); }
  static kernels::BFloat16 Store(float v) { return kernels::FloatToBFloat16(v); }
};
template <>
struct Wide<kernels::Float16> {
  using type = float;
  static float Load(kernels::Float16 v) { return kernels::Float16ToFloat(v); }
  static kernels::Float16 Store(float v) { return kernels::FloatToFloat16(v); }
};

template <typename A>
A Combine(ReduceOp op, A a, A b) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return static_cast<A>(a + b);
    case ReduceOp::kMax: return std::max(a, b);
    case ReduceOp::kMin: return std::min(a, b);
  }
  return a;
}

// The op is a template parameter so that each inner loop is one plain, vectorisable expression.
// `out` may be one of the inputs (in place); `copy`, when not null, gets the same result (the
// segment's result slot, written block by block from `out` while it is in L1, by `copy_fn`).
// The partial sums live in `acc`, a block in L1, so the vectoriser needs no alias checks against
// `out`.
template <typename T, ReduceOp kOp>
void ReduceTyped(const void* const* inputs, int n, void* out_bytes, void* copy_bytes,
                 CopyFn copy_fn, size_t count) {
  using W = Wide<T>;
  using A = typename W::type;
  T* out = static_cast<T*>(out_bytes);
  T* copy = static_cast<T*>(copy_bytes);
  A acc[kReduceBlock];
  for (size_t begin = 0; begin < count; begin += kReduceBlock) {
    const size_t len = std::min(kReduceBlock, count - begin);
    const T* first = static_cast<const T*>(inputs[0]) + begin;
    if (n == 1) {
      for (size_t i = 0; i < len; ++i) acc[i] = W::Load(first[i]);
    } else {
      const T* second = static_cast<const T*>(inputs[1]) + begin;
      for (size_t i = 0; i < len; ++i) {
        acc[i] = Combine<A>(kOp, W::Load(first[i]), W::Load(second[i]));
      }
    }
    for (int r = 2; r < n; ++r) {
      const T* in = static_cast<const T*>(inputs[r]) + begin;
      for (size_t i = 0; i < len; ++i) acc[i] = Combine<A>(kOp, acc[i], W::Load(in[i]));
    }
    if constexpr (kOp == ReduceOp::kAvg) {
      const A divisor = static_cast<A>(n);
      for (size_t i = 0; i < len; ++i) acc[i] = static_cast<A>(acc[i] / divisor);
    }
    for (size_t i = 0; i < len; ++i) out[begin + i] = W::Store(acc[i]);
    if (copy != nullptr) copy_fn(copy + begin, out + begin, len * sizeof(T));
  }
}

using ReduceFn = void (*)(const void* const*, int, void*, void*, CopyFn, size_t);

template <typename T>
ReduceFn PickForOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return &ReduceTyped<T, ReduceOp::kSum>;
    case ReduceOp::kAvg: return &ReduceTyped<T, ReduceOp::kAvg>;
    case ReduceOp::kMax: return &ReduceTyped<T, ReduceOp::kMax>;
    case ReduceOp::kMin: return &ReduceTyped<T, ReduceOp::kMin>;
  }
  return nullptr;
}

ReduceFn PickReduce(DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::kFloat32: return PickForOp<float>(op);
    case DType::kFloat64: return PickForOp<double>(op);
    case DType::kInt32: return PickForOp<int32_t>(op);
    case DType::kInt64: return PickForOp<int64_t>(op);
    case DType::kBFloat16: return PickForOp<kernels::BFloat16>(op);
    case DType::kFloat16: return PickForOp<kernels::Float16>(op);
  }
  return nullptr;
}

// ---------------------------------------------------------------- the mapping and its peers

// One mapping of a segment. Ranks that are threads of one process (tests, the ThreadSanitizer
// run) share rank 0's mapping through a registry keyed by the segment's nonce instead of mapping it
// again: TSan then sees every rank's accesses at the same addresses, and checks them against each
// other. The last holder unmaps it.
class Region {
 public:
  Region(void* base, size_t bytes) : base_(static_cast<char*>(base)), bytes_(bytes) {}
  ~Region() { munmap(base_, bytes_); }
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;
  char* base() const { return base_; }

 private:
  char* base_;
  size_t bytes_;
};

std::mutex& RegistryMutex() {
  static std::mutex mu;
  return mu;
}
std::map<uint64_t, std::weak_ptr<Region>>& Registry() {
  static auto* registry = new std::map<uint64_t, std::weak_ptr<Region>>();
  return *registry;
}

void Register(uint64_t nonce, const std::shared_ptr<Region>& region) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  auto& registry = Registry();
  for (auto it = registry.begin(); it != registry.end();) {  // drop the dead ones
    it = it->second.expired() ? registry.erase(it) : std::next(it);
  }
  registry[nonce] = region;
}

std::shared_ptr<Region> Registered(uint64_t nonce) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  auto found = Registry().find(nonce);
  return found == Registry().end() ? nullptr : found->second.lock();
}

// What an operation is, for its error messages; the text is built only when an error needs it,
// not on every operation of a few microseconds.
struct OpText {
  std::string_view op;
  size_t count;
  DType dtype;
  int rank, size;
  std::string str() const { return DescribeOperation(op, count, dtype, rank, size); }
};
std::string operator+(const OpText& what, std::string_view more) {
  return what.str() + std::string(more);
}

struct Peer {
  pid_t pid = 0;
  int pidfd = -1;  // -1: this process (threads as ranks) or pidfds unavailable
};

// Closes a descriptor on every path out (the bootstrap, mapping a peer's block).
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

class ShmCommunicator final : public Communicator {
 public:
  ShmCommunicator(int rank, int size, const Layout& layout, std::shared_ptr<Region> mapping,
                  std::vector<Peer> peers, const ShmOptions& options)
      : rank_(rank),
        size_(size),
        layout_(layout),
        mapping_(std::move(mapping)),
        peers_(std::move(peers)),
        timeout_(options.timeout),
        one_shot_bytes_(options.one_shot_bytes),
        forced_(options.all_reduce),
        every_rank_has_a_core_(UsableCpus() >= size),
        spin_for_(every_rank_has_a_core_ ? kSpinFor : Clock::duration::zero()),
        inputs_(size),
        peer_blocks_(size),
        one_process_(std::all_of(peers_.begin(), peers_.end(),
                                 [](const Peer& peer) { return peer.pid == getpid(); })) {
    header_ = reinterpret_cast<SegmentHeader*>(mapping_->base());
    phase_ = Control(rank_).phase.load(std::memory_order_relaxed);
  }

  ~ShmCommunicator() override {
    for (const Peer& peer : peers_) {
      if (peer.pidfd >= 0) close(peer.pidfd);
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "shm"; }
  HostSplit host_split() override {
    return HostSplit{.local = this,
                     .cross = nullptr,
                     .host = 0,
                     .hosts = 1,
                     .local_rank = rank_,
                     .local_size = size_};
  }

  absl::Status AllReduce(void* data, size_t count, DType dtype, ReduceOp op) override {
    const size_t bytes = count * DTypeSize(dtype);
    return Run("all_reduce", count, dtype, bytes, [&](const OpText& what) -> absl::Status {
      if (count > 0 && data == nullptr) return absl::InvalidArgumentError(what + ": null buffer");
      const ReduceFn reduce = PickReduce(dtype, op);
      if (bytes == 0 || size_ == 1) return absl::OkStatus();  // alone, every op is the identity
      char* bytes_out = static_cast<char*>(data);
      const size_t esize = DTypeSize(dtype);
      if (bytes <= one_shot_bytes_) return OneShot(bytes_out, count, esize, reduce, what);
      const int bucket = AllReduceTuner::Bucket(bytes);
      ShmAlgorithm algorithm;
      if (forced_.has_value()) {
        algorithm = *forced_;
      } else {
        const uint64_t op = tuned_all_reduces_++;
        if (rank_ == 0) {
          for (int b = 0; b < AllReduceTuner::kBuckets; ++b) {
            // A size never run keeps the zeroed table's kOneShot, which is what Next says of it.
            if (tuner_.runs(b) == 0) continue;
            header_->plan[(op + 1) % 2][b].store(static_cast<uint8_t>(tuner_.Next(b)),
                                                 std::memory_order_relaxed);
          }
        }
        const uint8_t planned = header_->plan[op % 2][bucket].load(std::memory_order_relaxed);
        // Only rank 0 writes it; a value out of range (never written so) runs the safe default.
        algorithm = planned < kShmAlgorithms ? static_cast<ShmAlgorithm>(planned)
                                             : ShmAlgorithm::kChunked;
      }
      const auto start = Clock::now();
      switch (algorithm) {
        case ShmAlgorithm::kOneShot:
          RETURN_IF_ERROR(OneShot(bytes_out, count, esize, reduce, what));
          break;
        case ShmAlgorithm::kSingleCopy: {
          ASSIGN_OR_RETURN(const bool done,
                           SingleCopyAllReduce(bytes_out, count, esize, reduce, what));
          if (done) break;
          algorithm = ShmAlgorithm::kChunked;  // every rank found the same: no single copy here
        }
          [[fallthrough]];
        case ShmAlgorithm::kChunked:
          RETURN_IF_ERROR(Chunked(bytes_out, count, esize, reduce, what));
          break;
        case ShmAlgorithm::kOneShotStreamed:
          RETURN_IF_ERROR(OneShot(bytes_out, count, esize, reduce, what, StreamCopy));
          break;
        case ShmAlgorithm::kChunkedStreamed:
          RETURN_IF_ERROR(Chunked(bytes_out, count, esize, reduce, what, StreamCopy));
          break;
      }
      if (!forced_.has_value() && rank_ == 0) {
        if (peer_reads_ == PeerReads::kNo) tuner_.Disallow(ShmAlgorithm::kSingleCopy);
        const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
        if (tuner_.Record(bucket, algorithm, seconds)) {
          spdlog::debug("shm communicator: all-reduces of {}-{} bytes now run {} ({:.1f} us)",
                        size_t{1} << bucket, (size_t{2} << bucket) - 1,
                        ShmAlgorithmName(tuner_.Best(bucket)),
                        tuner_.estimate(bucket, tuner_.Best(bucket)) * 1e6);
        }
      }
      return absl::OkStatus();
    });
  }

  absl::Status AllGather(const void* send, void* recv, size_t count, DType dtype) override {
    const size_t esize = DTypeSize(dtype);
    return Run("all_gather", count, dtype, count * esize,
               [&](const OpText& what) -> absl::Status {
      if (count > 0 && (send == nullptr || recv == nullptr)) {
        return absl::InvalidArgumentError(what + ": null buffer");
      }
      const char* in = static_cast<const char*>(send);
      char* out = static_cast<char*>(recv);
      if (size_ == 1) {
        if (count > 0) std::memmove(out, in, count * esize);
        return absl::OkStatus();
      }
      const size_t chunk = layout_.slot_bytes / esize;
      for (size_t offset = 0; offset < count; offset += chunk) {
        const size_t len = std::min(chunk, count - offset);
        const uint64_t phase = NextPhase();
        std::memcpy(Input(rank_, phase), in + offset * esize, len * esize);
        RETURN_IF_ERROR(PublishAndWait(phase, what));
        for (int r = 0; r < size_; ++r) {
          const char* from = r == rank_ ? in + offset * esize : Input(r, phase);
          std::memmove(out + (r * count + offset) * esize, from, len * esize);
        }
      }
      return absl::OkStatus();
    });
  }

  absl::Status ReduceScatter(const void* send, void* recv, size_t count, DType dtype,
                             ReduceOp op) override {
    const size_t esize = DTypeSize(dtype);
    return Run("reduce_scatter", count, dtype, size_ * count * esize,
               [&](const OpText& what) -> absl::Status {
      if (count > 0 && (send == nullptr || recv == nullptr)) {
        return absl::InvalidArgumentError(what + ": null buffer");
      }
      const ReduceFn reduce = PickReduce(dtype, op);
      const char* in = static_cast<const char*>(send);
      char* out = static_cast<char*>(recv);
      if (size_ == 1) {
        if (count > 0) std::memmove(out, in, count * esize);
        return absl::OkStatus();
      }
      const size_t chunk = std::max<size_t>(1, layout_.slot_bytes / (esize * size_));
            for (size_t offset = 0; offset < count; offset += chunk) {
        const size_t len = std::min(chunk, count - offset);
        const uint64_t phase = NextPhase();
        char* slot = Input(rank_, phase);
        for (int block = 0; block < size_; ++block) {
          std::memcpy(slot + block * len * esize, in + (block * count + offset) * esize,
                      len * esize);
        }
        RETURN_IF_ERROR(PublishAndWait(phase, what));
        for (int r = 0; r < size_; ++r) inputs_[r] = Input(r, phase) + rank_ * len * esize;
        reduce(inputs_.data(), size_, out + offset * esize, nullptr, PlainCopy, len);
      }
      return absl::OkStatus();
    });
  }

  absl::Status Broadcast(void* data, size_t count, DType dtype, int root) override {
    const size_t esize = DTypeSize(dtype);
    return Run("broadcast", count, dtype, count * esize,
               [&](const OpText& what) -> absl::Status {
      if (root < 0 || root >= size_) {
        return absl::InvalidArgumentError(what + ": root " + std::to_string(root) +
                                          " is not a rank of " + std::to_string(size_));
      }
      if (count > 0 && data == nullptr) return absl::InvalidArgumentError(what + ": null buffer");
      if (size_ == 1) return absl::OkStatus();
      char* bytes = static_cast<char*>(data);
      const size_t chunk = layout_.slot_bytes / esize;
      for (size_t offset = 0; offset < count; offset += chunk) {
        const size_t len = std::min(chunk, count - offset);
        const uint64_t phase = NextPhase();
        if (rank_ == root) std::memcpy(Input(root, phase), bytes + offset * esize, len * esize);
        RETURN_IF_ERROR(PublishAndWait(phase, what));
        if (rank_ != root) std::memcpy(bytes + offset * esize, Input(root, phase), len * esize);
      }
      return absl::OkStatus();
    });
  }

  absl::Status Send(const void* data, size_t count, DType dtype, int peer) override {
    return SendRecvImpl("send", data, count, peer, nullptr, 0, -1, dtype);
  }
  absl::Status Recv(void* data, size_t count, DType dtype, int peer) override {
    return SendRecvImpl("recv", nullptr, 0, -1, data, count, peer, dtype);
  }
  absl::Status SendRecv(const void* send, size_t send_count, int send_peer, void* recv,
                        size_t recv_count, int recv_peer, DType dtype) override {
    return SendRecvImpl("send_recv", send, send_count, send_peer, recv, recv_count, recv_peer,
                        dtype);
  }

  absl::Status Barrier() override {
    return Run("barrier", 0, DType::kFloat32, 0, [&](const OpText& what) -> absl::Status {
      if (size_ == 1) return absl::OkStatus();
      return PublishAndWait(NextPhase(), what);
    });
  }

  void Abort() override {
    aborted_.store(true);
    uint32_t none = 0;
    header_->aborted_by.compare_exchange_strong(none, static_cast<uint32_t>(rank_ + 1));
    Wake(/*always=*/true);
  }

 private:
  enum class PeerReads { kUntried, kYes, kNo };

  // Every rank copies its input into its slot (by `into_segment`), and reduces everyone's: one
  // phase per chunk. The chunks alternate between the two slots by phase parity, so a rank writes
  // the next while a slow peer still reads the last.
  absl::Status OneShot(char* data, size_t count, size_t esize, ReduceFn reduce, const OpText& what,
                       CopyFn into_segment = PlainCopy) {
    const size_t chunk = std::min(kOneShotChunk, layout_.slot_bytes) / esize;
    for (size_t offset = 0; offset < count; offset += chunk) {
      const size_t len = std::min(chunk, count - offset);
      char* mine = data + offset * esize;
      const uint64_t phase = NextPhase();
      into_segment(Input(rank_, phase), mine, len * esize);
      RETURN_IF_ERROR(PublishAndWait(phase, what));
      for (int r = 0; r < size_; ++r) inputs_[r] = r == rank_ ? mine : Input(r, phase);
      // In place is safe: a block's inputs are all read before its outputs are written.
      reduce(inputs_.data(), size_, mine, nullptr, PlainCopy, len);
    }
    return absl::OkStatus();
  }

  // Reduce-scatter + all-gather through the segment, a slot's worth per round; what goes into
  // the segment by `into_segment`.
  absl::Status Chunked(char* data, size_t count, size_t esize, ReduceFn reduce, const OpText& what,
                       CopyFn into_segment = PlainCopy) {
    const size_t chunk = layout_.slot_bytes / esize;
    for (size_t offset = 0; offset < count; offset += chunk) {
      const size_t len = std::min(chunk, count - offset);
      char* mine = data + offset * esize;
      // Slice r of the chunk is reduced by rank r (uneven slices when len % size != 0). Only
      // the slices the others reduce go into the segment, and only theirs come back out: the
      // fewest bytes moved, which is what a memory-bound collective is timed by.
      const size_t lo = len * rank_ / size_, hi = len * (rank_ + 1) / size_;
      const auto others = [&](char* to, const char* from, CopyFn copy) {
        copy(to, from, lo * esize);
        copy(to + hi * esize, from + hi * esize, (len - hi) * esize);
      };
      const uint64_t scatter = NextPhase();
      others(Input(rank_, scatter), mine, into_segment);
      RETURN_IF_ERROR(PublishAndWait(scatter, what));
      const uint64_t gather = NextPhase();
      for (int r = 0; r < size_; ++r) {
        inputs_[r] = (r == rank_ ? mine : Input(r, scatter)) + lo * esize;
      }
      reduce(inputs_.data(), size_, mine + lo * esize, Result(gather) + lo * esize, into_segment,
             hi - lo);
      RETURN_IF_ERROR(PublishAndWait(gather, what));
      others(mine, Result(gather), PlainCopy);
    }
    return absl::OkStatus();
  }

  // The all-reduce of large messages in one copy per byte moved: every rank publishes its
  // buffer's address; rank r reduces slice r of everyone's buffer into its own, reading the
  // peers' parts straight from their memory; then every rank reads the others' reduced slices
  // from their buffers into its own, and none returns before all have (their buffers are being
  // read). Against the segment's two copies (into the slot, out of it) this moves ~2.5n bytes per
  // rank instead of ~4n, which is what bounds an all-reduce when the cores share no cache. The
  // sums run in rank order as in the copying path: the same bits.
  //
  // A peer's buffer is read through this process's own mapping of it when there is one: the
  // same address for a rank that is a thread of this process, or the peer's shared block
  // (shared_host_memory.h, mapped here on first use). Otherwise the kernel copies it
  // (process_vm_readv, as OpenMPI's CMA path), a block at a time into L2. Whether every rank
  // may do that (ptrace rules: same user, and Yama's scope) is found out collectively on the
  // first call that needs it; false (and the copying path from then on) if not.
  absl::StatusOr<bool> SingleCopyAllReduce(char* data, size_t count, size_t esize,
                                           ReduceFn reduce, const OpText& what) {
    ControlLine& own = Control(rank_);
    own.address.store(reinterpret_cast<uintptr_t>(data), std::memory_order_relaxed);
    const std::optional<SharedBlockRef> block = FindSharedBlock(data, count * esize);
    own.shared_fd.store(block ? block->fd : -1, std::memory_order_relaxed);
    if (block) {
      own.shared_id.store(block->id, std::memory_order_relaxed);
      own.shared_block_bytes.store(block->block_bytes, std::memory_order_relaxed);
      own.shared_offset.store(block->offset, std::memory_order_relaxed);
    }
    RETURN_IF_ERROR(PublishAndWait(NextPhase(), what));
    // From what every rank published (and the pids, which every rank knows alike), so that
    // every rank comes to the same answer: whether each can read every buffer without the kernel.
    bool all_shared = true;
    for (int r = 0; r < size_; ++r) {
      all_shared = all_shared && Control(r).shared_fd.load(std::memory_order_relaxed) >= 0;
    }
    all_shared = all_shared || one_process_;
    if (!all_shared && peer_reads_ == PeerReads::kNo) return false;
    if (!all_shared && peer_reads_ == PeerReads::kUntried) {
      // One element of every peer's buffer, then every rank's verdict.
      bool can = true;
      std::vector<char> probe(esize);
      for (int r = 0; r < size_ && can; ++r) {
        if (r != rank_) can = ReadPeer(r, probe.data(), PeerAddress(r), esize).ok();
      }
      own.reads_peers.store(can ? 1 : 0, std::memory_order_relaxed);
      RETURN_IF_ERROR(PublishAndWait(NextPhase(), what));
      bool all = true;
      for (int r = 0; r < size_; ++r) {
        all = all && Control(r).reads_peers.load(std::memory_order_relaxed) == 1;
      }
      peer_reads_ = all ? PeerReads::kYes : PeerReads::kNo;
      if (!all) {
        spdlog::debug("shm communicator: not every rank may read its peers' memory; "
                      "all-reduces of other buffers than shared blocks copy through the segment");
        return false;
      }
    }
    direct_.assign(size_, nullptr);
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) direct_[r] = DirectPeerBuffer(r, count * esize);
    }
    // Reduce-scatter: this rank's slice, block by block, the parts of the peers that are not
    // mapped here fetched into L2.
    const size_t lo = count * rank_ / size_, hi = count * (rank_ + 1) / size_;
    const size_t block_len = kSingleCopyBlock / esize;
    fetched_.resize(static_cast<size_t>(size_) * kSingleCopyBlock);
    for (size_t begin = lo; begin < hi; begin += block_len) {
      const size_t len = std::min(block_len, hi - begin);
      for (int r = 0; r < size_; ++r) {
        if (r == rank_) {
          inputs_[r] = data + begin * esize;
        } else if (direct_[r] != nullptr) {
          inputs_[r] = direct_[r] + begin * esize;
        } else {
          char* into = fetched_.data() + static_cast<size_t>(r) * kSingleCopyBlock;
          RETURN_IF_ERROR(ReadPeer(r, into, PeerAddress(r) + begin * esize, len * esize, &what));
          inputs_[r] = into;
        }
      }
      // In place: a block's inputs are all read before its outputs are written.
      reduce(inputs_.data(), size_, data + begin * esize, nullptr, PlainCopy, len);
    }
    RETURN_IF_ERROR(PublishAndWait(NextPhase(), what));
    // All-gather: the others' reduced slices, from their buffers into this one.
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      const size_t from = count * r / size_, to = count * (r + 1) / size_;
      if (direct_[r] != nullptr) {
        std::memcpy(data + from * esize, direct_[r] + from * esize, (to - from) * esize);
      } else {
        RETURN_IF_ERROR(ReadPeer(r, data + from * esize, PeerAddress(r) + from * esize,
                                 (to - from) * esize, &what));
      }
    }
    // No rank may return, and let its caller reuse the buffer, while another still reads it.
    RETURN_IF_ERROR(PublishAndWait(NextPhase(), what));
    return true;
  }

  // Rank `rank`'s buffer of this single copy (`bytes` long) where this process can read it
  // itself, or nullptr (then the kernel copies it). A peer's shared block is mapped on first use
  // and kept, a few per peer, for the next all-reduce over it. A block that cannot be mapped here
  // (or a report that does not add up) is read the other way: correct, only slower (or, where
  // the kernel may not copy either, an Unavailable naming the rank).
  const char* DirectPeerBuffer(int rank, size_t bytes) {
    if (peers_[rank].pid == getpid()) return reinterpret_cast<const char*>(PeerAddress(rank));
    const ControlLine& line = Control(rank);
    const int fd = line.shared_fd.load(std::memory_order_relaxed);
    if (fd < 0) return nullptr;
    const uint64_t id = line.shared_id.load(std::memory_order_relaxed);
    const size_t block_bytes = line.shared_block_bytes.load(std::memory_order_relaxed);
    const size_t offset = line.shared_offset.load(std::memory_order_relaxed);
    if (offset > block_bytes || bytes > block_bytes - offset) return nullptr;
    auto& mapped = peer_blocks_[rank];
    auto found = mapped.find(id);
    if (found == mapped.end()) {
      // A peer that allocates block after block (activations) would otherwise have every one
      // mapped here until the communicator goes.
      if (mapped.size() >= kPeerBlocksKept) mapped.clear();
      const std::string path =
          "/proc/" + std::to_string(peers_[rank].pid) + "/fd/" + std::to_string(fd);
      const int opened = open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (opened < 0) return nullptr;
      FdCloser closer(opened);
      struct stat st{};
      if (fstat(opened, &st) != 0 || static_cast<size_t>(st.st_size) < block_bytes) {
        return nullptr;
      }
      void* base = mmap(nullptr, block_bytes, PROT_READ, MAP_SHARED, opened, 0);
      if (base == MAP_FAILED) return nullptr;
      found = mapped.emplace(id, std::make_shared<Region>(base, block_bytes)).first;
    }
    return found->second->base() + offset;
  }

  uintptr_t PeerAddress(int rank) const {
    return static_cast<uintptr_t>(Control(rank).address.load(std::memory_order_relaxed));
  }

  // `bytes` of rank `rank`'s memory at `address` into `into`: the kernel copies (it may take
  // them in several goes), or, for a rank that is a thread of this process, memcpy. An error says
  // which rank and why; the probe passes no `what`.
  absl::Status ReadPeer(int rank, char* into, uintptr_t address, size_t bytes,
                        const OpText* what = nullptr) const {
    if (peers_[rank].pid == getpid()) {
      std::memcpy(into, reinterpret_cast<const void*>(address), bytes);
      return absl::OkStatus();
    }
    while (bytes > 0) {
      iovec local{into, bytes};
      iovec remote{reinterpret_cast<void*>(address), bytes};
      const ssize_t got = process_vm_readv(peers_[rank].pid, &local, 1, &remote, 1, 0);
      if (got <= 0) {
        const int error = got < 0 ? errno : EIO;
        if (what == nullptr) return absl::UnavailableError("probe");
        if (error == ESRCH) {  // worded as a wait that sees the pidfd says it
          return absl::UnavailableError(*what + ": rank " + std::to_string(rank) + " (pid " +
                                        std::to_string(peers_[rank].pid) + ") exited");
        }
        return absl::UnavailableError(*what + ": reading rank " + std::to_string(rank) +
                                      "'s buffer (pid " + std::to_string(peers_[rank].pid) +
                                      "): " + std::strerror(error));
      }
      into += got;
      address += static_cast<uintptr_t>(got);
      bytes -= static_cast<size_t>(got);
    }
    return absl::OkStatus();
  }

  ControlLine& Control(int rank) const {
    return reinterpret_cast<ControlLine*>(mapping_->base() + layout_.controls)[rank];
  }
  MailboxControl& Box(int from, int to) const {
    return reinterpret_cast<MailboxControl*>(mapping_->base() +
                                             layout_.mailbox_controls)[from * size_ + to];
  }
  // The two slots alternate by phase parity (the header comment says why that is safe).
  char* Input(int rank, uint64_t phase) const {
    return mapping_->base() + layout_.inputs + (static_cast<size_t>(rank) * 2 + phase % 2) *
                                                  layout_.slot_bytes;
  }
  char* Result(uint64_t phase) const {
    return mapping_->base() + layout_.results + (phase % 2) * layout_.slot_bytes;
  }
  char* BoxSlot(int from, int to, uint64_t chunk) const {
    return mapping_->base() + layout_.mailboxes +
           ((static_cast<size_t>(from) * size_ + to) * 2 + chunk % 2) * layout_.mailbox_bytes;
  }

  uint64_t NextPhase() { return ++phase_; }

  template <typename Body>
  absl::Status Run(std::string_view op, size_t count, DType dtype, size_t bytes, Body&& body) {
    const auto start = Clock::now();
    const OpText what{op, count, dtype, rank_, size_};
    absl::Status status;
    if (aborted_.load()) {
      status = absl::AbortedError(what + ": communicator was aborted");
    } else if (!broken_.ok()) {
      status = absl::Status(broken_.code(),
                            what + ": the communicator failed earlier: " +
                                ToString(broken_.message()));
    } else {
      status = body(what);
      // A failure inside a phase leaves the ranks' phase counters apart: nothing after it can
      // line up again. A rejected argument fails before any phase and breaks nothing.
      if (!status.ok() && status.code() != absl::StatusCode::kInvalidArgument) broken_ = status;
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (observer_ != nullptr) observer_->OnOperation(op, bytes, seconds, status.ok());
    return status;
  }

  void Wake(bool always = false) {
    // Dekker with the waiter (Wait): it raises `sleepers` before its last look at the counters,
    // we look at `sleepers` after publishing; the fences order the two sides.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (always || header_->sleepers.load(std::memory_order_seq_cst) > 0) {
      header_->wake.fetch_add(1, std::memory_order_seq_cst);
      Futex(&header_->wake, FUTEX_WAKE, INT_MAX, nullptr);
    }
  }

  absl::Status PublishAndWait(uint64_t phase, const OpText& what) {
    Control(rank_).phase.store(phase, std::memory_order_release);
    Wake();
    return Wait(
        [&] {
          for (int r = 0; r < size_; ++r) {
            if (Control(r).phase.load(std::memory_order_acquire) < phase) return false;
          }
          return true;
        },
        what, [&] {
          std::vector<int> late;
          for (int r = 0; r < size_; ++r) {
            if (Control(r).phase.load(std::memory_order_acquire) < phase) late.push_back(r);
          }
          return late;
        });
  }

  // Checked while waiting: an Abort() anywhere (two loads, every turn), or a peer that has exited
  // (a poll per peer, every kLivenessEvery).
  absl::Status Aborted(const OpText& what) const {
    if (aborted_.load(std::memory_order_relaxed)) {
      return absl::AbortedError(what + ": communicator was aborted");
    }
    const uint32_t by = header_->aborted_by.load(std::memory_order_acquire);
    if (by != 0) {
      return absl::AbortedError(what + ": communicator was aborted by rank " +
                                std::to_string(by - 1));
    }
    return absl::OkStatus();
  }

  absl::Status PeerExited(const OpText& what) const {
    for (int r = 0; r < size_; ++r) {
      const Peer& peer = peers_[r];
      if (peer.pidfd < 0) continue;
      pollfd fd{peer.pidfd, POLLIN, 0};
      if (poll(&fd, 1, 0) > 0) {
        return absl::UnavailableError(what + ": rank " + std::to_string(r) + " (pid " +
                                      std::to_string(peer.pid) + ") exited");
      }
    }
    return absl::OkStatus();
  }

  template <typename Ready, typename Late>
  absl::Status Wait(Ready&& ready, const OpText& what, Late&& late) {
    if (ready()) return absl::OkStatus();
    const auto start = Clock::now();
    const auto deadline = start + timeout_;
    // Polling the peers' pidfds costs a system call each: not on every turn of a short wait.
    auto next_check = start + kLivenessEvery;
    for (;;) {
      if (ready()) return absl::OkStatus();
      const auto now = Clock::now();
      RETURN_IF_ERROR(Aborted(what));
      if (now >= next_check) {
        if (absl::Status exited = PeerExited(what); !exited.ok()) {
          // A peer may publish its last phase and exit (its job done) between the look at the
          // counters above and this poll: what this rank waits for is then there. (Seen once in
          // ShardedEquivalenceTest, 8 ranks on 2 cores: rank 0's last all-reduce failed with
          // "rank 3 exited" while rank 3 had finished it.)
          if (ready()) return absl::OkStatus();
          return exited;
        }
        next_check = now + kLivenessEvery;
      }
      if (now >= deadline) return TimedOut(what, late());
      if (now - start < spin_for_) {
        for (int i = 0; i < 16; ++i) CpuRelax();
      } else if (now - start < kYieldFor) {
        sched_yield();
      } else {
        header_->sleepers.fetch_add(1, std::memory_order_seq_cst);
        const uint32_t seen = header_->wake.load(std::memory_order_seq_cst);
        if (!ready()) {
          const auto slice = std::min<Clock::duration>(kSleepSlice, deadline - now);
          const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(slice).count();
          timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
          Futex(&header_->wake, FUTEX_WAIT, seen, &ts);
        }
        header_->sleepers.fetch_sub(1, std::memory_order_seq_cst);
      }
    }
  }

  absl::Status TimedOut(const OpText& what, const std::vector<int>& late) const {
    std::string who;
    for (int r : late) {
      if (!who.empty()) who += ", ";
      who += "rank " + std::to_string(r);
      const Peer& peer = peers_[r];
      if (peer.pid != 0 && peer.pid != getpid()) {
        who += " (pid " + std::to_string(peer.pid) + ", " +
               DescribeState(ProcessState(peer.pid)) + ")";
      }
    }
    return absl::DeadlineExceededError(what + ": timed out (limit " +
                                       std::to_string(timeout_.count()) + " ms) waiting for " +
                                       (who.empty() ? std::string("the peers") : who));
  }

  // Streams a message through the pair's two mailbox slots; both halves progress in one loop so
  // that a ring of SendRecvs never waits on itself.
  absl::Status SendRecvImpl(std::string_view op, const void* send, size_t send_count,
                            int send_peer, void* recv, size_t recv_count, int recv_peer,
                            DType dtype) {
    const size_t esize = DTypeSize(dtype);
    // As Gloo's: the observer counts the bytes this rank moves, both halves of a send_recv.
    const size_t count = op == "recv" ? recv_count : send_count;
    return Run(op, count, dtype, (send_count + recv_count) * esize,
               [&](const OpText& what) -> absl::Status {
      auto bad_peer = [&](int peer) { return peer < 0 || peer >= size_ || peer == rank_; };
      if (send_count > 0 && bad_peer(send_peer)) {
        return absl::InvalidArgumentError(what + ": peer " + std::to_string(send_peer) +
                                          " is not another rank of " + std::to_string(size_));
      }
      if (recv_count > 0 && bad_peer(recv_peer)) {
        return absl::InvalidArgumentError(what + ": peer " + std::to_string(recv_peer) +
                                          " is not another rank of " + std::to_string(size_));
      }
      if ((send_count > 0 && send == nullptr) || (recv_count > 0 && recv == nullptr)) {
        return absl::InvalidArgumentError(what + ": null buffer");
      }
      const size_t chunk = layout_.mailbox_bytes;
      const char* out = static_cast<const char*>(send);
      char* in = static_cast<char*>(recv);
      size_t sent = 0, received = 0;
      const size_t send_bytes = send_count * esize, recv_bytes = recv_count * esize;
      auto can_send = [&] {
        if (sent >= send_bytes) return false;
        MailboxControl& box = Box(rank_, send_peer);
        return box.sent.load(std::memory_order_relaxed) -
                   box.taken.load(std::memory_order_acquire) < 2;
      };
      auto can_receive = [&] {
        if (received >= recv_bytes) return false;
        MailboxControl& box = Box(recv_peer, rank_);
        return box.sent.load(std::memory_order_acquire) >
               box.taken.load(std::memory_order_relaxed);
      };
      while (sent < send_bytes || received < recv_bytes) {
        bool progressed = false;
        if (can_send()) {
          MailboxControl& box = Box(rank_, send_peer);
          const uint64_t n = box.sent.load(std::memory_order_relaxed);
          const size_t len = std::min(chunk, send_bytes - sent);
          std::memcpy(BoxSlot(rank_, send_peer, n), out + sent, len);
          box.sent.store(n + 1, std::memory_order_release);
          Wake();
          sent += len;
          progressed = true;
        }
        if (can_receive()) {
          MailboxControl& box = Box(recv_peer, rank_);
          const uint64_t n = box.taken.load(std::memory_order_relaxed);
          const size_t len = std::min(chunk, recv_bytes - received);
          std::memcpy(in + received, BoxSlot(recv_peer, rank_, n), len);
          box.taken.store(n + 1, std::memory_order_release);
          Wake();
          received += len;
          progressed = true;
        }
        if (progressed) continue;
        RETURN_IF_ERROR(Wait([&] { return can_send() || can_receive(); }, what, [&] {
          std::vector<int> late;
          if (sent < send_bytes) late.push_back(send_peer);
          if (received < recv_bytes && recv_peer != send_peer) late.push_back(recv_peer);
          return late;
        }));
      }
      return absl::OkStatus();
    });
  }

  const int rank_;
  const int size_;
  const Layout layout_;
  std::shared_ptr<Region> mapping_;
  std::vector<Peer> peers_;
  const std::chrono::milliseconds timeout_;
  const size_t one_shot_bytes_;
  const std::optional<ShmAlgorithm> forced_;  // nullopt: tuned
  // No spinning when the ranks outnumber the CPUs this process may run on: the peer we would
  // spin for is likely waiting for this very core.
  const bool every_rank_has_a_core_;
  const Clock::duration spin_for_;
  std::vector<const void*> inputs_;  // the reduction's input pointers, one per rank
  PeerReads peer_reads_ = PeerReads::kUntried;
  AllReduceTuner tuner_;             // rank 0's timings; the others only follow its plan
  uint64_t tuned_all_reduces_ = 0;  // all-reduces that read the plan, the same count on every rank
  std::vector<char> fetched_;  // the single-copy reduction's blocks read from the peers
  std::vector<const char*> direct_;  // the single copy's peer buffers mapped here, or nullptr
  // The peers' shared blocks mapped here, by rank and block id.
  std::vector<std::map<uint64_t, std::shared_ptr<Region>>> peer_blocks_;
  const bool one_process_;  // every rank is a thread of this process (tests, TSan)
  SegmentHeader* header_ = nullptr;
  uint64_t phase_ = 0;  // the last phase this rank published; only the issuing thread
  absl::Status broken_;
  std::atomic<bool> aborted_{false};
};

absl::Status Errno(absl::StatusCode code, const std::string& what) {
  return absl::Status(code, what + ": " + std::strerror(errno));
}

}  // namespace

std::string LocalHostIdentity() {
  return ReadFirstLine("/proc/sys/kernel/random/boot_id") + "/pid:" + NamespaceId("pid") +
         "/ipc:" + NamespaceId("ipc") + "/net:" + NamespaceId("net");
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateShmCommunicator(Store& store, int rank,
                                                                    int size,
                                                                    const ShmOptions& options) {
  const std::string what = "shm bootstrap of rank " + std::to_string(rank) + " of " +
                           std::to_string(size);
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(what + ": rank must be in [0, size)");
  }
  if (options.timeout <= std::chrono::milliseconds(0)) {
    return absl::InvalidArgumentError(what + ": timeout must be positive");
  }
  const size_t slot = RoundUp(options.slot_bytes == 0 ? kDefaultSlotBytes : options.slot_bytes,
                              kPage);
  const Layout layout(size, slot, kMailboxBytes);
  PrefixStore shm_store("shm", store);
  const pid_t self = getpid();
  RETURN_IF_ERROR(Annotate(shm_store.Set("pid/" + std::to_string(rank), std::to_string(self)),
                           what));

  int fd = -1;
  uint64_t nonce = 0;
  if (rank == 0) {
    fd = memfd_create("shardline-comm", MFD_CLOEXEC);
    if (fd < 0) return Errno(absl::StatusCode::kResourceExhausted, what + ": memfd_create");
  }
  FdCloser creator_fd(fd);
  std::shared_ptr<Region> region;
  if (rank == 0) {
    if (ftruncate(fd, static_cast<off_t>(layout.total)) != 0) {
      return Errno(absl::StatusCode::kResourceExhausted,
                   what + ": sizing the segment to " + std::to_string(layout.total) + " bytes");
    }
    void* base = mmap(nullptr, layout.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) return Errno(absl::StatusCode::kResourceExhausted, what + ": mmap");
    region = std::make_shared<Region>(base, layout.total);
    std::random_device random;
    nonce = (static_cast<uint64_t>(random()) << 32) ^ random();
    auto* header = new (base) SegmentHeader();
    header->nonce = nonce;
    header->ranks = static_cast<uint32_t>(size);
    header->slot_bytes = layout.slot_bytes;
    header->mailbox_bytes = layout.mailbox_bytes;
    header->total_bytes = layout.total;
    header->magic = kMagic;
    Register(nonce, region);
    RETURN_IF_ERROR(Annotate(
        shm_store.Set("segment", std::to_string(self) + " " + std::to_string(fd) + " " +
                                     std::to_string(layout.total) + " " + std::to_string(nonce)),
        what));
  } else {
    auto segment = shm_store.Get("segment", options.timeout);
    if (!segment.ok()) return Annotate(segment.status(), what + ": waiting for rank 0's segment");
    std::istringstream fields(*segment);
    pid_t owner = 0;
    int owner_fd = -1;
    size_t total = 0;
    if (!(fields >> owner >> owner_fd >> total >> nonce) || total != layout.total) {
      return absl::InvalidArgumentError(what + ": rank 0 published a segment of another shape ('" +
                                        *segment + "', expected " +
                                        std::to_string(layout.total) + " bytes)");
    }
    if (owner == self) region = Registered(nonce);  // ranks as threads: rank 0's own mapping
    if (region == nullptr) {
      const std::string path =
          "/proc/" + std::to_string(owner) + "/fd/" + std::to_string(owner_fd);
      const int opened = open(path.c_str(), O_RDWR | O_CLOEXEC);
      if (opened < 0) {
        return Errno(absl::StatusCode::kUnavailable,
                     what + ": opening rank 0's segment " + path +
                         " (rank 0 exited, or runs in another pid namespace)");
      }
      FdCloser opened_fd(opened);
      void* base = mmap(nullptr, layout.total, PROT_READ | PROT_WRITE, MAP_SHARED, opened, 0);
      if (base == MAP_FAILED) return Errno(absl::StatusCode::kResourceExhausted, what + ": mmap");
      region = std::make_shared<Region>(base, layout.total);
    }
  }
  char* base = region->base();
  auto* header = reinterpret_cast<SegmentHeader*>(base);
  if (header->magic != kMagic || header->nonce != nonce ||
      header->ranks != static_cast<uint32_t>(size)) {
    return absl::FailedPreconditionError(what + ": the segment is not this group's");
  }

  std::vector<Peer> peers(size);
  auto close_peers = [&] {
    for (Peer& peer : peers) {
      if (peer.pidfd >= 0) close(peer.pidfd);
      peer.pidfd = -1;
    }
  };
  for (int r = 0; r < size; ++r) {
    auto pid = shm_store.Get("pid/" + std::to_string(r), options.timeout);
    if (!pid.ok()) {
      close_peers();
      return Annotate(pid.status(), what + ": waiting for rank " + std::to_string(r));
    }
    peers[r].pid = static_cast<pid_t>(std::stol(*pid));
    if (peers[r].pid != self) peers[r].pidfd = PidfdOpen(peers[r].pid);
  }

  // Rank 0 keeps its descriptor until every rank has mapped the segment; the attach count, not
  // the store, says when, since the store may be slower than the ranks.
  header->attached.fetch_add(1, std::memory_order_acq_rel);
  const auto deadline = Clock::now() + options.timeout;
  while (header->attached.load(std::memory_order_acquire) < static_cast<uint32_t>(size)) {
    if (Clock::now() >= deadline) {
      close_peers();
      return absl::DeadlineExceededError(
          what + ": " + std::to_string(header->attached.load()) + " of " + std::to_string(size) +
          " ranks mapped the segment within " + std::to_string(options.timeout.count()) + " ms");
    }
    for (int r = 0; r < size; ++r) {
      pollfd fd_poll{peers[r].pidfd, POLLIN, 0};
      if (peers[r].pidfd >= 0 && poll(&fd_poll, 1, 0) > 0) {
        close_peers();
        return absl::UnavailableError(what + ": rank " + std::to_string(r) + " (pid " +
                                      std::to_string(peers[r].pid) + ") exited during bootstrap");
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  spdlog::debug("shm communicator rank {} of {}: {} bytes mapped", rank, size, layout.total);
  return std::unique_ptr<Communicator>(std::make_unique<ShmCommunicator>(
      rank, size, layout, std::move(region), std::move(peers), options));
}

}  // namespace shardline::comm
