#include "worker/comm/gloo_communicator.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>
#include <sodium.h>
#include <spdlog/spdlog.h>

#include "common/status_macros.h"

namespace shardline::comm {
namespace {

using ReduceFn = void (*)(void*, const void*, const void*, size_t);
using Clock = std::chrono::steady_clock;

// Slot prefixes for the operations we drive ourselves. Gloo's own collectives use 0x01..0x08
// (gloo/types.h); staying clear of them keeps our messages from ever matching theirs.
constexpr uint8_t kPointToPointSlotPrefix = 0x40;
constexpr uint8_t kReduceScatterSlotPrefix = 0x41;
constexpr uint8_t kMembershipSlotPrefix = 0x42;

// Reduce-scatter segment size: small enough that reducing one segment overlaps the transfer of
// the next, large enough that per-message overhead stays negligible (Gloo's ring uses <= 1 MiB).
constexpr size_t kReduceScatterSegmentBytes = 512 * 1024;

// gloo::sum<T> and friends are overloaded (an in-place two-pointer form exists too), so the
// three-pointer form has to be picked with an explicit function-pointer type.
template <typename T>
ReduceFn PickReduce(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:  // sum, then divide by the world size
      return static_cast<ReduceFn>(&gloo::sum<T>);
    case ReduceOp::kMax:
      return static_cast<ReduceFn>(&gloo::max<T>);
    case ReduceOp::kMin:
      return static_cast<ReduceFn>(&gloo::min<T>);
  }
  return nullptr;
}

template <typename T>
void DivideBy(void* data, size_t count, int divisor) {
  T* values = static_cast<T*>(data);
  const T d = static_cast<T>(divisor);
  for (size_t i = 0; i < count; ++i) values[i] /= d;
}

// Calls body(T*) with T the C++ type of `dtype`; InvalidArgument for dtypes Gloo cannot reduce.
template <typename Body>
absl::Status DispatchDType(DType dtype, std::string_view op, Body&& body) {
  switch (dtype) {
    case DType::kFloat32: return body(static_cast<float*>(nullptr));
    case DType::kFloat64: return body(static_cast<double*>(nullptr));
    case DType::kInt32: return body(static_cast<int32_t*>(nullptr));
    case DType::kInt64: return body(static_cast<int64_t*>(nullptr));
    case DType::kBFloat16:
    case DType::kFloat16:
      break;
  }
  return absl::InvalidArgumentError("gloo " + std::string(op) + " does not support dtype " +
                                    std::string(DTypeName(dtype)) +
                                    " (supported: f32, f64, i32, i64)");
}

bool IsTimeout(const std::string& message) {
  // Gloo reports every timeout as an IoException whose text says so ("Timed out waiting 1000ms
  // for recv operation to complete", "Read timeout ...", "Connect timeout ...").
  return message.find("imed out") != std::string::npos ||
         message.find("timeout") != std::string::npos;
}

// Presents a comm::Store to Gloo's rendezvous. Gloo expects a failing store to throw, so errors
// become gloo::IoException; the Status is kept so that bootstrap can report it with its code.
class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(comm::Store& store, std::chrono::milliseconds timeout)
      : store_(store), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Check(store_.Set(key, std::string(data.begin(), data.end())), key);
  }

  std::vector<char> get(const std::string& key) override {
    absl::StatusOr<std::string> value = store_.Get(key, timeout_);
    Check(value.status(), key);
    return std::vector<char>(value->begin(), value->end());
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    const auto deadline = Clock::now() + timeout;
    for (const std::string& key : keys) {
      // Rounded up, so that a single key is waited for the full timeout, as the caller set it.
      const auto left = std::max(std::chrono::milliseconds(0),
                                 std::chrono::ceil<std::chrono::milliseconds>(
                                     deadline - Clock::now()));
      // A zero timeout still sees a key that is already there.
      Check(store_.Get(key, left).status(), key);
    }
  }

  const absl::Status& error() const { return error_; }

 private:
  void Check(const absl::Status& status, const std::string& key) {
    if (status.ok()) return;
    // Gloo's full-mesh rendezvous publishes each rank's addresses under the key "<rank>".
    const bool is_rank = !key.empty() && std::all_of(key.begin(), key.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
    error_ = is_rank ? Annotate(status, "waiting for rank " + key + " to publish its address")
                     : status;
    throw gloo::IoException(ToString(error_.message()));
  }

  comm::Store& store_;
  const std::chrono::milliseconds timeout_;
  absl::Status error_;
};

// Proof of membership on every pair (DESIGN.md, "Hostile input"). Gloo's TCP pair listens on an
// address published in the store and takes the first connection that reaches it, from anyone:
// its wire format has no identity. So before the communicator is used, every rank sends each peer
// HMAC(key, "from FROM to TO of SIZE") over their pair and checks the one it receives, the key
// being 32 random bytes rank 0 puts in the group's store. The store is the coordinator's, which
// gives a job's keys only to that job's actors (CURVE and actor tokens), so a process outside the
// group cannot make a proof; a proof names both ends, so one seen on another pair of the group
// proves nothing here. An outsider who wins the race to a listening pair makes the bootstrap fail
// (and its peer's connect with it), but nothing it sends reaches a caller's buffer.
// libsodium's crypto_auth (HMAC-SHA-512-256) and its constant-time check: the library CurveZMQ
// already uses.
constexpr char kMembershipKey[] = "membership_key";
using MembershipKey = std::array<unsigned char, crypto_auth_KEYBYTES>;
using MembershipProof = std::array<unsigned char, crypto_auth_BYTES>;

std::string MembershipMessage(int from, int to, int size) {
  return "shardline gloo pair v1: from " + std::to_string(from) + " to " + std::to_string(to) +
         " of " + std::to_string(size);
}

MembershipProof ProofOfMembership(const MembershipKey& key, int from, int to, int size) {
  const std::string message = MembershipMessage(from, to, size);
  MembershipProof proof;
  crypto_auth(proof.data(), reinterpret_cast<const unsigned char*>(message.data()),
              message.size(), key.data());
  return proof;
}

bool ProofIsValid(const MembershipProof& proof, const MembershipKey& key, int from, int to,
                  int size) {
  const std::string message = MembershipMessage(from, to, size);
  return crypto_auth_verify(proof.data(), reinterpret_cast<const unsigned char*>(message.data()),
                            message.size(), key.data()) == 0;
}

// Rank 0 draws the group's key and publishes it before its pairs' addresses (so that every peer
// that sees those finds the key); the others read it.
absl::StatusOr<MembershipKey> GroupMembershipKey(Store& store, int rank,
                                                 std::chrono::milliseconds timeout) {
  if (sodium_init() < 0) return absl::InternalError("libsodium failed to initialise");
  MembershipKey key;
  std::string hex(2 * key.size() + 1, '\0');
  if (rank == 0) {
    crypto_auth_keygen(key.data());
    sodium_bin2hex(hex.data(), hex.size(), key.data(), key.size());
    hex.pop_back();
    RETURN_IF_ERROR(store.Set(kMembershipKey, hex));
    return key;
  }
  auto value = store.Get(kMembershipKey, timeout);
  if (!value.ok()) return Annotate(value.status(), "waiting for rank 0's membership key");
  size_t decoded = 0;
  if (value->size() != 2 * key.size() ||
      sodium_hex2bin(key.data(), key.size(), value->data(), value->size(), nullptr, &decoded,
                     nullptr) != 0 ||
      decoded != key.size()) {
    return absl::InvalidArgumentError("the store's '" + std::string(kMembershipKey) +
                                      "' is not " + std::to_string(2 * key.size()) +
                                      " hex digits");
  }
  return key;
}

// Every pair carries one proof each way; all are posted before any is waited on.
absl::Status ProveMembership(gloo::Context& context, const MembershipKey& key, int rank, int size,
                             std::chrono::milliseconds timeout) {
  const auto slot = gloo::Slot::build(kMembershipSlotPrefix, 0);
  std::vector<MembershipProof> sent(size), received(size);
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> sends(size), recvs(size);
  try {
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank) continue;
      sent[peer] = ProofOfMembership(key, rank, peer, size);
      recvs[peer] = context.createUnboundBuffer(received[peer].data(), received[peer].size());
      recvs[peer]->recv(peer, slot);
      sends[peer] = context.createUnboundBuffer(sent[peer].data(), sent[peer].size());
      sends[peer]->send(peer, slot);
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(std::string("sending the proofs of membership: ") + e.what());
  }
  const auto deadline = Clock::now() + timeout;
  const auto left = [&] {
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()));
  };
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    const std::string whose = "the connection to rank " + std::to_string(peer);
    try {
      recvs[peer]->waitRecv(left());
    } catch (const std::exception& e) {
      const std::string message = e.what();
      if (IsTimeout(message)) {
        return absl::DeadlineExceededError(
            whose + " sent no proof of membership within " + std::to_string(timeout.count()) +
            " ms (a process that is not rank " + std::to_string(peer) +
            " may hold it): " + message);
      }
      return absl::UnavailableError(whose + " closed before its proof of membership: " +
                                    message);
    }
    if (!ProofIsValid(received[peer], key, peer, rank, size)) {
      return absl::PermissionDeniedError(
          whose + " failed its proof of membership: the process at its other end does not hold "
                  "this group's key, so it is not rank " +
          std::to_string(peer) + " of this group; refused");
    }
  }
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    try {
      sends[peer]->waitSend(left());
    } catch (const std::exception& e) {
      return absl::UnavailableError("sending rank " + std::to_string(peer) +
                                    " this rank's proof of membership: " + e.what());
    }
  }
  return absl::OkStatus();
}

}  // namespace

// Registers a buffer an operation waits on, so that Abort() can wake the wait; unregisters it
// before the buffer dies. Declare it after whatever owns the buffer.
class GlooCommunicator::PendingBuffer {
 public:
  PendingBuffer(GlooCommunicator& comm, gloo::transport::UnboundBuffer* buffer)
      : comm_(comm), buffer_(buffer) {
    std::lock_guard<std::mutex> lock(comm_.pending_mu_);
    comm_.pending_.push_back(buffer_);
    // Abort() sets the flag before it takes the lock: either it sees this buffer, or we see it.
    if (comm_.aborted_.load()) {
      buffer_->abortWaitRecv();
      buffer_->abortWaitSend();
    }
  }
  ~PendingBuffer() {
    std::lock_guard<std::mutex> lock(comm_.pending_mu_);
    comm_.pending_.erase(std::find(comm_.pending_.begin(), comm_.pending_.end(), buffer_));
  }
  PendingBuffer(const PendingBuffer&) = delete;
  PendingBuffer& operator=(const PendingBuffer&) = delete;

 private:
  GlooCommunicator& comm_;
  gloo::transport::UnboundBuffer* buffer_;
};

WireBytes GlooWireBytes::AllReduce(size_t bytes, size_t element_size, int size, int rank) {
  if (size <= 1 || bytes == 0 || element_size == 0) return {};
  // The segment arithmetic of Gloo's ring (gloo/allreduce.cc), with its default 1 MiB limit.
  const size_t n = static_cast<size_t>(size);
  const size_t max_segment =
      element_size *
      std::max<size_t>(1, gloo::detail::AllreduceOptionsImpl::kMaxSegmentSize / element_size);
  const auto round_up = [](size_t value, size_t multiple) {
    return (value + multiple - 1) / multiple * multiple;
  };
  const size_t segments = round_up(std::max((bytes + max_segment - 1) / max_segment, 2 * n), n);
  const size_t segment_bytes = round_up((bytes + segments - 1) / segments, element_size);
  const size_t chunk_span = segments / n * segment_bytes;
  // Chunk c covers [c * chunk_span, (c + 1) * chunk_span) clipped to the buffer: the last ones
  // may be short or empty.
  const auto chunk = [&](int c) -> uint64_t {
    const size_t begin = static_cast<size_t>((c % size + size) % size) * chunk_span;
    return begin >= bytes ? 0 : std::min(chunk_span, bytes - begin);
  };
  const uint64_t twice = 2 * static_cast<uint64_t>(bytes);
  return {twice - chunk(rank) - chunk(rank - 1), twice - chunk(rank + 1) - chunk(rank)};
}

WireBytes GlooWireBytes::AllGather(size_t block_bytes, int size) {
  if (size <= 1) return {};
  const uint64_t moved = static_cast<uint64_t>(size - 1) * block_bytes;
  return {moved, moved};
}

WireBytes GlooWireBytes::ReduceScatter(size_t block_bytes, int size) {
  return AllGather(block_bytes, size);  // the same ring, the other way round
}

WireBytes GlooWireBytes::Broadcast(size_t bytes, int size, int rank, int root) {
  if (size <= 1) return {};
  // Gloo's tree (gloo/broadcast.cc): ranks renumbered so that the root is 0; in round i a rank
  // whose low i bits are clear sends to the rank with bit i set, or receives from it.
  const size_t vsize = static_cast<size_t>(size);
  const size_t vrank = static_cast<size_t>((rank - root + size) % size);
  size_t dim = 0;
  while ((size_t{1} << dim) < vsize) ++dim;
  WireBytes wire;
  size_t mask = (size_t{1} << dim) - 1;
  for (size_t i = 0; i < dim; ++i) {
    mask ^= size_t{1} << i;
    if ((vrank & mask) != 0) continue;
    const size_t vpeer = vrank ^ (size_t{1} << i);
    if (vpeer >= vsize) continue;
    if ((vrank & (size_t{1} << i)) == 0) {
      wire.sent += bytes;
    } else {
      wire.received += bytes;
    }
  }
  return wire;
}

GlooCommunicator::GlooCommunicator(std::shared_ptr<gloo::transport::Device> device,
                                   std::shared_ptr<gloo::Context> context,
                                   std::chrono::milliseconds timeout)
    : rank_(context->rank),
      size_(context->size),
      timeout_(timeout),
      device_(std::move(device)),
      context_(std::move(context)) {}

GlooCommunicator::~GlooCommunicator() = default;

std::string GlooCommunicator::Describe(std::string_view op, size_t count, DType dtype) const {
  return DescribeOperation(op, count, dtype, rank_, size_);
}

absl::Status GlooCommunicator::FromException(const std::string& what, const std::exception& e,
                                             bool io) const {
  const std::string message = e.what();
  if (aborted_.load()) {
    return absl::AbortedError(what + ": communicator was aborted (" + message + ")");
  }
  if (io && IsTimeout(message)) {
    return absl::DeadlineExceededError(what + ": timed out (limit " +
                                       std::to_string(timeout_.count()) + " ms): " + message);
  }
  // Any other I/O error means a peer closed its connection or the network failed.
  if (io) return absl::UnavailableError(what + ": " + message);
  return absl::InternalError(what + ": " + message);
}

template <typename Body>
absl::Status GlooCommunicator::Run(std::string_view op, const std::string& what, size_t bytes,
                                   WireBytes wire, Body&& body) {
  const auto start = Clock::now();
  absl::Status status;
  if (aborted_.load()) {
    status = absl::AbortedError(what + ": communicator was aborted");
  } else {
    try {
      status = body();
    } catch (const gloo::IoException& e) {
      status = FromException(what, e, /*io=*/true);
    } catch (const gloo::EnforceNotMet& e) {
      status = FromException(what, e, /*io=*/false);
    } catch (const std::exception& e) {
      status = FromException(what, e, /*io=*/false);
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (observer_ != nullptr) {
    if (status.ok() && (wire.sent > 0 || wire.received > 0)) {
      observer_->OnNetworkBytes(wire.sent, wire.received);
    }
    observer_->OnOperation(op, bytes, seconds, status.ok());
  }
  return status;
}

template <typename T>
absl::Status GlooCommunicator::AllReduceTyped(void* data, size_t count, ReduceOp op) {
  gloo::AllreduceOptions opts(context_);
  auto out = context_->createUnboundBuffer(data, count * sizeof(T));
  PendingBuffer pending(*this, out.get());
  opts.setOutput<T>(std::move(out));
  // Ring is Gloo's bandwidth-optimal algorithm and what the benchmark compares against.
  opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
  opts.setReduceFunction(PickReduce<T>(op));
  opts.setTag(NextTag());
  opts.setTimeout(timeout_);
  gloo::allreduce(opts);
  if (op == ReduceOp::kAvg) DivideBy<T>(data, count, size_);
  return absl::OkStatus();
}

absl::Status GlooCommunicator::AllReduce(void* data, size_t count, DType dtype, ReduceOp op) {
  const std::string what = Describe("all_reduce", count, dtype);
  const size_t bytes = count * DTypeSize(dtype);
  return Run("all_reduce", what, bytes,
             GlooWireBytes::AllReduce(bytes, DTypeSize(dtype), size_, rank_),
             [&]() -> absl::Status {
               if (count == 0) return absl::OkStatus();
               if (data == nullptr) return absl::InvalidArgumentError(what + ": null buffer");
               return DispatchDType(dtype, "all_reduce", [&](auto* type) {
                 using T = std::remove_pointer_t<decltype(type)>;
                 return AllReduceTyped<T>(data, count, op);
               });
             });
}

template <typename T>
absl::Status GlooCommunicator::AllGatherTyped(const void* send, void* recv, size_t count) {
  gloo::AllgatherOptions opts(context_);
  // Gloo only reads the input; its API takes a non-const pointer.
  auto in = context_->createUnboundBuffer(const_cast<void*>(send), count * sizeof(T));
  auto out = context_->createUnboundBuffer(recv, count * sizeof(T) * size_);
  PendingBuffer pending_in(*this, in.get());
  PendingBuffer pending_out(*this, out.get());
  opts.setInput<T>(std::move(in));
  opts.setOutput<T>(std::move(out));
  opts.setTag(NextTag());
  opts.setTimeout(timeout_);
  gloo::allgather(opts);
  return absl::OkStatus();
}

absl::Status GlooCommunicator::AllGather(const void* send, void* recv, size_t count,
                                         DType dtype) {
  const std::string what = Describe("all_gather", count, dtype);
  const size_t bytes = count * DTypeSize(dtype);
  return Run("all_gather", what, bytes, GlooWireBytes::AllGather(bytes, size_),
             [&]() -> absl::Status {
               if (count == 0) return absl::OkStatus();
               if (send == nullptr || recv == nullptr)
                 return absl::InvalidArgumentError(what + ": null buffer");
               return DispatchDType(dtype, "all_gather", [&](auto* type) {
                 using T = std::remove_pointer_t<decltype(type)>;
                 return AllGatherTyped<T>(send, recv, count);
               });
             });
}

// Written by hand: this Gloo (0.5, 2022) has no reduce-scatter in the options/unbound-buffer API.
// Its ReduceScatterHalvingDoubling is the old per-pair Algorithm class: in place over a full
// size()*count input (so it would need a copy of the caller's const input), with buffers and
// handshakes set up anew on every construction. An all-reduce followed by slicing would move
// twice the data a ring reduce-scatter needs.
//
// Ring: in n-1 steps every rank passes a partial sum one hop to the right. At step s rank r sends
// its partial of block (r-s-1) mod n and receives its left neighbour's partial of block
// (r-s-2) mod n, which it adds its own input block to; after step n-2 it holds block r complete.
// Blocks travel in segments so that reducing one segment overlaps receiving the next, and the
// partial of a segment is forwarded as soon as it is reduced.
template <typename T>
absl::Status GlooCommunicator::ReduceScatterTyped(const void* send, void* recv, size_t count,
                                                  ReduceOp op) {
  const int n = size_;
  const size_t block_bytes = count * sizeof(T);
  const T* input = static_cast<const T*>(send);
  if (n == 1) {
    std::memcpy(recv, send, block_bytes);
    return absl::OkStatus();
  }
  const ReduceFn reduce = PickReduce<T>(op);
  const auto mod = [n](int x) { return ((x % n) + n) % n; };
  const int right = mod(rank_ + 1);
  const int left = mod(rank_ - 1);
  const uint64_t slot = gloo::Slot::build(kReduceScatterSlotPrefix, NextTag());

  const size_t segment_elems = std::max<size_t>(1, kReduceScatterSegmentBytes / sizeof(T));
  const size_t segments = (count + segment_elems - 1) / segment_elems;
  const auto segment_offset = [&](size_t k) { return k * segment_elems * sizeof(T); };
  const auto segment_bytes = [&](size_t k) {
    return (std::min(count, (k + 1) * segment_elems) - k * segment_elems) * sizeof(T);
  };

  // Intermediate partials need staging (the caller's input is const); two buffers alternate so
  // one can be received into while the other is still being sent from.
  const size_t stages = static_cast<size_t>(std::min(n - 2, 2));
  if (scratch_.size() < stages * block_bytes) scratch_.resize(stages * block_bytes);

  auto input_buffer =
      context_->createUnboundBuffer(const_cast<void*>(send), block_bytes * static_cast<size_t>(n));
  auto recv_buffer = context_->createUnboundBuffer(recv, block_bytes);
  std::unique_ptr<gloo::transport::UnboundBuffer> stage_buffers[2];
  for (size_t i = 0; i < stages; ++i) {
    stage_buffers[i] = context_->createUnboundBuffer(scratch_.data() + i * block_bytes, block_bytes);
  }
  PendingBuffer pending_input(*this, input_buffer.get());
  PendingBuffer pending_recv(*this, recv_buffer.get());
  std::unique_ptr<PendingBuffer> pending_stages[2];
  for (size_t i = 0; i < stages; ++i) {
    pending_stages[i] = std::make_unique<PendingBuffer>(*this, stage_buffers[i].get());
  }
  const auto aborted = [&] { return absl::AbortedError("communicator was aborted"); };

  // Step 0 sends this rank's own input of block r-1: nothing to add to it yet.
  gloo::transport::UnboundBuffer* source = input_buffer.get();
  size_t source_base = static_cast<size_t>(mod(rank_ - 1)) * block_bytes;
  for (size_t k = 0; k < segments; ++k) {
    source->send(right, slot, source_base + segment_offset(k), segment_bytes(k));
  }
  for (int step = 0; step <= n - 2; ++step) {
    const bool last = step == n - 2;
    gloo::transport::UnboundBuffer* target =
        last ? recv_buffer.get() : stage_buffers[step % 2].get();
    for (size_t k = 0; k < segments; ++k) {
      target->recv(left, slot, segment_offset(k), segment_bytes(k));
    }
    const T* own = input + static_cast<size_t>(mod(rank_ - step - 2)) * count;
    for (size_t k = 0; k < segments; ++k) {
      // Segments from one peer on one slot complete in order, so the k-th completion is segment k.
      if (!target->waitRecv(timeout_)) return aborted();
      char* partial = static_cast<char*>(target->ptr) + segment_offset(k);
      reduce(partial, partial, own + k * segment_elems, segment_bytes(k) / sizeof(T));
      if (!last) target->send(right, slot, segment_offset(k), segment_bytes(k));
    }
    // The source's sends fed the right neighbour's step `step`; they must be done before the
    // source becomes a receive target again (two steps on).
    for (size_t k = 0; k < segments; ++k) {
      if (!source->waitSend(timeout_)) return aborted();
    }
    source = target;
    source_base = 0;
  }
  if (op == ReduceOp::kAvg) DivideBy<T>(recv, count, n);
  return absl::OkStatus();
}

absl::Status GlooCommunicator::ReduceScatter(const void* send, void* recv, size_t count,
                                             DType dtype, ReduceOp op) {
  const std::string what = Describe("reduce_scatter", count, dtype);
  return Run("reduce_scatter", what, count * DTypeSize(dtype) * static_cast<size_t>(size_),
             GlooWireBytes::ReduceScatter(count * DTypeSize(dtype), size_), [&]() -> absl::Status {
               if (count == 0) return absl::OkStatus();
               if (send == nullptr || recv == nullptr) {
                 return absl::InvalidArgumentError(what + ": null buffer");
               }
               return DispatchDType(dtype, "reduce_scatter", [&](auto* type) {
                 using T = std::remove_pointer_t<decltype(type)>;
                 return Annotate(ReduceScatterTyped<T>(send, recv, count, op), what);
               });
             });
}

template <typename T>
absl::Status GlooCommunicator::BroadcastTyped(void* data, size_t count, int root) {
  gloo::BroadcastOptions opts(context_);
  auto buffer = context_->createUnboundBuffer(data, count * sizeof(T));
  PendingBuffer pending(*this, buffer.get());
  opts.setOutput<T>(std::move(buffer));  // in place: the root's output is its input
  opts.setRoot(root);
  opts.setTag(NextTag());
  opts.setTimeout(timeout_);
  gloo::broadcast(opts);
  return absl::OkStatus();
}

absl::Status GlooCommunicator::Broadcast(void* data, size_t count, DType dtype, int root) {
  const std::string what = Describe("broadcast", count, dtype) + " from root " +
                           std::to_string(root);
  const size_t bytes = count * DTypeSize(dtype);
  // An out-of-range root is refused inside; it moves nothing.
  const WireBytes wire =
      root >= 0 && root < size_ ? GlooWireBytes::Broadcast(bytes, size_, rank_, root) : WireBytes{};
  return Run("broadcast", what, bytes, wire, [&]() -> absl::Status {
    if (root < 0 || root >= size_) {
      return absl::InvalidArgumentError(what + ": root out of range [0, " +
                                        std::to_string(size_) + ")");
    }
    if (count == 0) return absl::OkStatus();
    if (data == nullptr) return absl::InvalidArgumentError(what + ": null buffer");
    // Broadcast only copies bytes, but the dtype check keeps the contract uniform across ops.
    return DispatchDType(dtype, "broadcast", [&](auto* type) {
      using T = std::remove_pointer_t<decltype(type)>;
      return BroadcastTyped<T>(data, count, root);
    });
  });
}

absl::Status GlooCommunicator::Send(const void* data, size_t count, DType dtype, int peer) {
  const std::string what = Describe("send", count, dtype) + " to rank " + std::to_string(peer);
  const size_t bytes = count * DTypeSize(dtype);
  return Run("send", what, bytes, WireBytes{bytes, 0}, [&]() -> absl::Status {
    if (peer < 0 || peer >= size_ || peer == rank_) {
      return absl::InvalidArgumentError(what + ": peer must be another rank in [0, " +
                                        std::to_string(size_) + ")");
    }
    if (count == 0) return absl::OkStatus();
    if (data == nullptr) return absl::InvalidArgumentError(what + ": null buffer");
    auto buffer = context_->createUnboundBuffer(const_cast<void*>(data), bytes);
    PendingBuffer pending(*this, buffer.get());
    // One fixed slot: a pair delivers messages of one slot in order, which is exactly the
    // matching rule of Send/Recv (k-th send to a peer meets that peer's k-th recv).
    buffer->send(peer, gloo::Slot::build(kPointToPointSlotPrefix, 0));
    if (!buffer->waitSend(timeout_)) {
      return absl::AbortedError(what + ": communicator was aborted");
    }
    return absl::OkStatus();
  });
}

absl::Status GlooCommunicator::Recv(void* data, size_t count, DType dtype, int peer) {
  const std::string what = Describe("recv", count, dtype) + " from rank " + std::to_string(peer);
  const size_t bytes = count * DTypeSize(dtype);
  return Run("recv", what, bytes, WireBytes{0, bytes}, [&]() -> absl::Status {
    if (peer < 0 || peer >= size_ || peer == rank_) {
      return absl::InvalidArgumentError(what + ": peer must be another rank in [0, " +
                                        std::to_string(size_) + ")");
    }
    if (count == 0) return absl::OkStatus();
    if (data == nullptr) return absl::InvalidArgumentError(what + ": null buffer");
    auto buffer = context_->createUnboundBuffer(data, bytes);
    PendingBuffer pending(*this, buffer.get());
    buffer->recv(peer, gloo::Slot::build(kPointToPointSlotPrefix, 0));
    if (!buffer->waitRecv(timeout_)) {
      return absl::AbortedError(what + ": communicator was aborted");
    }
    return absl::OkStatus();
  });
}

absl::Status GlooCommunicator::SendRecv(const void* send, size_t send_count, int send_peer,
                                        void* recv, size_t recv_count, int recv_peer,
                                        DType dtype) {
  const std::string what = Describe("send_recv", send_count, dtype) + " to rank " +
                           std::to_string(send_peer) + " and " + std::to_string(recv_count) +
                           " from rank " + std::to_string(recv_peer);
  const size_t send_bytes = send_count * DTypeSize(dtype);
  const size_t recv_bytes = recv_count * DTypeSize(dtype);
  return Run("send_recv", what, send_bytes + recv_bytes, WireBytes{send_bytes, recv_bytes},
             [&]() -> absl::Status {
               const auto bad_peer = [&](int peer, size_t count) {
                 return count > 0 && (peer < 0 || peer >= size_ || peer == rank_);
               };
               if (bad_peer(send_peer, send_count) || bad_peer(recv_peer, recv_count)) {
                 return absl::InvalidArgumentError(what + ": peers must be other ranks in [0, " +
                                                   std::to_string(size_) + ")");
               }
               if ((send_count > 0 && send == nullptr) || (recv_count > 0 && recv == nullptr)) {
                 return absl::InvalidArgumentError(what + ": null buffer");
               }
               std::unique_ptr<gloo::transport::UnboundBuffer> out, in;
               std::optional<PendingBuffer> out_pending, in_pending;
               // Both are posted before either is waited on: that is the whole point.
               if (recv_count > 0) {
                 in = context_->createUnboundBuffer(recv, recv_bytes);
                 in_pending.emplace(*this, in.get());
                 in->recv(recv_peer, gloo::Slot::build(kPointToPointSlotPrefix, 0));
               }
               if (send_count > 0) {
                 out = context_->createUnboundBuffer(const_cast<void*>(send), send_bytes);
                 out_pending.emplace(*this, out.get());
                 out->send(send_peer, gloo::Slot::build(kPointToPointSlotPrefix, 0));
               }
               if (out && !out->waitSend(timeout_))
                 return absl::AbortedError(what + ": communicator was aborted");
               if (in && !in->waitRecv(timeout_))
                 return absl::AbortedError(what + ": communicator was aborted");
               return absl::OkStatus();
             });
}

absl::Status GlooCommunicator::Barrier() {
  const std::string what = "barrier on rank " + std::to_string(rank_) + " of " +
                           std::to_string(size_);
  return Run("barrier", what, 0, WireBytes{}, [&]() -> absl::Status {
    gloo::BarrierOptions opts(context_);
    opts.setTag(NextTag());
    opts.setTimeout(timeout_);
    gloo::barrier(opts);
    return absl::OkStatus();
  });
}

// What this Gloo (2022) lets us break, and what it does not:
// - waits on buffers we created (send/recv, reduce-scatter, and the caller buffers handed to
//   Gloo's collectives) are woken by UnboundBuffer::abortWait{Send,Recv}; our own loops then
//   return Aborted at once;
// - closing every pair makes each later send or recv on this rank throw at once ("socket
//   closed"), and makes the peers' pending operations fail at once ("connection closed by peer"),
//   so a failed rank does not leave the others waiting for their timeout;
// - there is no context-wide abort: a wait inside a Gloo collective on a scratch buffer Gloo
//   allocated itself (all-reduce's receive segment, the barrier) cannot be reached, and ends
//   only when its timeout passes. Every operation still reports Aborted once aborted_ is set.
void GlooCommunicator::Abort() {
  if (aborted_.exchange(true)) return;
  spdlog::warn("gloo communicator rank {} of {}: aborting", rank_, size_);
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    for (gloo::transport::UnboundBuffer* buffer : pending_) {
      buffer->abortWaitRecv();
      buffer->abortWaitSend();
    }
  }
  try {
    context_->closeConnections();
  } catch (const std::exception& e) {
    spdlog::warn("gloo communicator rank {}: closing connections during abort: {}", rank_,
                 e.what());
  }
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(Store& store, int rank,
                                                                     int size,
                                                                     const GlooOptions& options) {
  const std::string what =
      "gloo bootstrap of rank " + std::to_string(rank) + " of " + std::to_string(size);
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(what + ": rank must be in [0, size) and size >= 1");
  }
  if (options.timeout.count() <= 0) {
    return absl::InvalidArgumentError(what + ": timeout must be positive");
  }

  gloo::transport::tcp::attr attr;
  std::string where;
  if (!options.iface.empty()) {
    attr.iface = options.iface;
    where = "interface '" + options.iface + "'";
  } else {
    attr.hostname = options.hostname;
    where = "hostname '" + options.hostname + "'";
  }
  std::shared_ptr<gloo::transport::Device> device;
  try {
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(what + ": creating the TCP device on " + where + ": " +
                                      e.what());
  }

  // Our keys live under "gloo/" so that other backends can share the caller's prefix.
  PrefixStore gloo_store("gloo", store);
  GlooStoreAdapter adapter(gloo_store, options.timeout);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->setTimeout(options.timeout);
  absl::StatusOr<MembershipKey> key = GroupMembershipKey(gloo_store, rank, options.timeout);
  if (!key.ok()) return Annotate(key.status(), what);
  try {
    context->connectFullMesh(adapter, device);
  } catch (const std::exception& e) {
    if (!adapter.error().ok()) return Annotate(adapter.error(), what);
    const std::string message = e.what();
    if (IsTimeout(message)) {
      return absl::DeadlineExceededError(what + ": connecting to the peers on " + where + ": " +
                                         message);
    }
    return absl::UnavailableError(what + ": connecting to the peers on " + where + ": " + message);
  }
  RETURN_IF_ERROR(Annotate(ProveMembership(*context, *key, rank, size, options.timeout), what));
  spdlog::debug("gloo communicator rank {} of {} connected on {}", rank, size, where);
  return std::unique_ptr<Communicator>(
      std::make_unique<GlooCommunicator>(std::move(device), std::move(context), options.timeout));
}

}  // namespace shardline::comm
