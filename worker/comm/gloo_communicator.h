// The Gloo backend: CPU collectives over TCP (gloo::transport::tcp), bootstrapped through a
// comm::Store. Buffers are host memory. Supported dtypes: f32, f64, i32, i64 (Gloo has no bf16,
// and its f16 is its own type); others fail with InvalidArgument.
//
// After any failed operation (timeout, peer gone, Abort) the communicator is broken for good:
// Gloo poisons every pair of the context. The caller builds a new one (a new store prefix).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "worker/comm/communicator.h"

namespace gloo {
class Context;
namespace transport {
class Device;
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo

namespace shardline::comm {

// Payload bytes one rank sends and receives over TCP for one operation of this backend, as the
// algorithm each operation runs moves them; the one place these formulas live (CommObserver::
// OnNetworkBytes reports them). Headers and Gloo's per-message framing are not counted: on a link
// they add a few percent (tests/integration/cluster_slow_link_test.cc holds the formula to a
// veth's byte counters). `bytes` is the caller's buffer (all-reduce, broadcast) or one rank's
// block (all-gather, reduce-scatter); B below.
//   all_reduce: Gloo's ring (AllreduceOptions RING). B is cut into S segments, S the multiple of
//     n at least max(2n, ceil(B / 1 MiB)), and the segments into n chunks of S/n; reduce-scatter
//     sends every chunk but this rank's own and receives every chunk but its right neighbour's,
//     the all-gather sends every chunk but its left neighbour's and receives every chunk but its
//     own: sent = 2B - chunk(r) - chunk(r-1), received = 2B - chunk(r+1) - chunk(r), which is
//     2(n-1)/n * B when n divides B into equal chunks.
//   all_gather: Gloo's ring: (n-1) * B each way.
//   reduce_scatter: ours, a ring (gloo_communicator.cc): (n-1) * B each way.
//   broadcast: Gloo's binomial tree: B received by every rank but the root, B sent per child.
//   send, recv, send_recv: the bytes asked for. barrier: 0 (its messages carry no payload).
struct WireBytes {
  uint64_t sent = 0;
  uint64_t received = 0;
};
struct GlooWireBytes {
  static WireBytes AllReduce(size_t bytes, size_t element_size, int size, int rank);
  static WireBytes AllGather(size_t block_bytes, int size);
  static WireBytes ReduceScatter(size_t block_bytes, int size);
  static WireBytes Broadcast(size_t bytes, int size, int rank, int root);
};

class GlooCommunicator final : public Communicator {
 public:
  // Use CreateGlooCommunicator; this takes a context that is already connected.
  GlooCommunicator(std::shared_ptr<gloo::transport::Device> device,
                   std::shared_ptr<gloo::Context> context, std::chrono::milliseconds timeout);
  ~GlooCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "gloo"; }

  absl::Status AllReduce(void* data, size_t count, DType dtype, ReduceOp op) override;
  absl::Status AllGather(const void* send, void* recv, size_t count, DType dtype) override;
  absl::Status ReduceScatter(const void* send, void* recv, size_t count, DType dtype,
                             ReduceOp op) override;
  absl::Status Broadcast(void* data, size_t count, DType dtype, int root) override;
  absl::Status Send(const void* data, size_t count, DType dtype, int peer) override;
  absl::Status Recv(void* data, size_t count, DType dtype, int peer) override;
  absl::Status SendRecv(const void* send, size_t send_count, int send_peer, void* recv,
                        size_t recv_count, int recv_peer, DType dtype) override;
  absl::Status Barrier() override;
  void Abort() override;

 private:
  class PendingBuffer;
  template <typename T>
  absl::Status AllReduceTyped(void* data, size_t count, ReduceOp op);
  template <typename T>
  absl::Status AllGatherTyped(const void* send, void* recv, size_t count);
  template <typename T>
  absl::Status ReduceScatterTyped(const void* send, void* recv, size_t count, ReduceOp op);
  template <typename T>
  absl::Status BroadcastTyped(void* data, size_t count, int root);

  // Runs `body` with the abort check, exception translation and observer call every op shares.
  // `wire` goes to the observer when the operation succeeds.
  template <typename Body>
  absl::Status Run(std::string_view op, const std::string& what, size_t bytes, WireBytes wire,
                   Body&& body);
  absl::Status FromException(const std::string& what, const std::exception& e, bool io) const;
  std::string Describe(std::string_view op, size_t count, DType dtype) const;
  uint32_t NextTag() { return next_tag_++; }

  const int rank_;
  const int size_;
  const std::chrono::milliseconds timeout_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  uint32_t next_tag_ = 0;  // only the issuing thread touches it
  std::vector<char> scratch_;  // reduce-scatter staging, reused across calls

  std::atomic<bool> aborted_{false};
  std::mutex pending_mu_;
  // Buffers an operation is waiting on, so that Abort() can wake those waits.
  std::vector<gloo::transport::UnboundBuffer*> pending_;  // guarded by pending_mu_
};

}  // namespace shardline::comm
