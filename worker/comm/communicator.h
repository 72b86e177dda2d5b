// The collective-communication interface every shard computes through. Backends: Gloo (CPU, TCP)
// and NCCL (GPU). A communicator knows nothing of ZeroMQ or the coordinator: it is bootstrapped
// through a comm::Store.
//
// Threading: one thread issues operations; Abort() may be called from any thread.
// Buffers: host memory for Gloo, device memory for NCCL. Every call is synchronous: when it returns
// OK the result is in place. Errors and timeouts come back as a Status (DeadlineExceeded for a
// timeout, Aborted after Abort(), Unavailable when a peer is gone).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/dtype.h"
#include "worker/comm/store.h"

namespace shardline::comm {

enum class ReduceOp { kSum, kAvg, kMax, kMin };
std::string_view ReduceOpName(ReduceOp op);  // "sum", "avg", "max", "min"

// "all_reduce of 100 f32 on rank 0 of 2": the words every backend's errors start with.
std::string DescribeOperation(std::string_view op, size_t count, DType dtype, int rank, int size);

// Told about every completed operation: lets the actor export metrics without the communicator
// knowing about Prometheus. Called on the thread that issued the operation, also when it failed.
// `bytes` is the size of this rank's input: count * dtype size (reduce_scatter: size() * count *
// dtype size; barrier: 0). Op names: all_reduce, all_gather, reduce_scatter, broadcast, send,
// recv, send_recv, barrier.
class CommObserver {
 public:
  virtual ~CommObserver() = default;
  virtual void OnOperation(std::string_view op, size_t bytes, double seconds, bool ok) = 0;
  // The payload bytes one successful operation made this rank send and receive over the network
  // (TCP), as the backend's algorithm moves them (GlooWireBytes in gloo_communicator.h holds every
  // formula); called before that operation's OnOperation. Shared memory and NCCL report none. A
  // hierarchical communicator's inner Gloo groups report to its observer, so an operation issued on
  // one of them directly is counted once, under the outer group.
  virtual void OnNetworkBytes(uint64_t sent, uint64_t received) {
    (void)sent;
    (void)received;
  }
};

class Communicator;

// How the group's ranks sit on hosts, for reductions that treat the host link differently from the
// inside of a host (model/gradient_compression.h: exact inside a host, compressed between hosts).
// The communicators are the group's own (not owned; they live as long as it does); what is issued
// on them directly is reported to their observers, not to the group's.
struct HostSplit {
  Communicator* local = nullptr;  // this rank's host's ranks (null: alone on its host)
  // The ranks of the same local index, one per host, in host order: for local rank 0 that is the
  // hosts' leaders (null: the group is on one host).
  Communicator* cross = nullptr;
  int host = 0, hosts = 1;  // this rank's host index and the number of hosts
  int local_rank = 0, local_size = 1;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string_view backend() const = 0;  // "gloo", "shm", "shm+gloo" or "nccl"
  // Whether the buffers are a device's memory (NCCL's, or a staged host communicator's) rather
  // than the host's.
  virtual bool device_buffers() const { return false; }
  // Backends that know nothing of hosts (Gloo, NCCL) call every rank its own host.
  virtual HostSplit host_split();

  // In place over `count` elements on every rank.
  virtual absl::Status AllReduce(void* data, size_t count, DType dtype, ReduceOp op) = 0;
  // `send` holds `count` elements; `recv` receives size()*count, rank r's block at r*count.
  virtual absl::Status AllGather(const void* send, void* recv, size_t count, DType dtype) = 0;
  // `send` holds size()*count elements; rank r receives into `recv` (count elements) the
  // reduction over ranks of block r.
  virtual absl::Status ReduceScatter(const void* send, void* recv, size_t count, DType dtype,
                                     ReduceOp op) = 0;
  // In place: every rank ends with `root`'s `count` elements.
  virtual absl::Status Broadcast(void* data, size_t count, DType dtype, int root) = 0;
  // Point to point; a Send must be matched by a Recv of the same count on `peer`.
  virtual absl::Status Send(const void* data, size_t count, DType dtype, int peer) = 0;
  virtual absl::Status Recv(void* data, size_t count, DType dtype, int peer) = 0;
  // A send to `send_peer` and a receive from `recv_peer` in flight together; returns when both are
  // done. Pipeline schedules need it: with blocking Send/Recv, a stage sending activations forward
  // while its neighbour sends gradients back would wait on each other forever (Megatron-LM's
  // send_forward_recv_backward, PyTorch's batch_isend_irecv). Either count may be 0 (that half is
  // skipped). Matching is as for Send/Recv.
  virtual absl::Status SendRecv(const void* send, size_t send_count, int send_peer, void* recv,
                                size_t recv_count, int recv_peer, DType dtype) = 0;
  virtual absl::Status Barrier() = 0;
  // Makes pending and later operations fail with Aborted; callable from any thread.
  virtual void Abort() = 0;

  // Optional; not owned; must outlive the communicator.
  void set_observer(CommObserver* observer) { observer_ = observer; }

 protected:
  CommObserver* observer_ = nullptr;
};

struct GlooOptions {
  // The address this rank's Gloo pairs bind and advertise: the local address that reaches the
  // coordinator, so that it works across hosts. Ignored when `iface` is set.
  std::string hostname = "127.0.0.1";
  std::string iface;
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};  // per operation and bootstrap
};

// Connects `size` ranks over TCP through `store` (all ranks must call it with the same store
// prefix).
absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(Store& store, int rank,
                                                                     int size,
                                                                     const GlooOptions& options);

// True when this build has NCCL (built with CUDA).
bool NcclBuilt();

// The NCCL unique-id exchange: rank 0 calls ncclGetUniqueId and publishes it under "nccl_id";
// the others wait for it. Needs no GPU. Returns the id's 128 bytes.
absl::StatusOr<std::string> ExchangeNcclUniqueId(Store& store, int rank,
                                                 std::chrono::milliseconds timeout);

struct NcclOptions {
  int device = 0;  // CUDA device index
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

// Exchanges the unique id, then ncclCommInitRank on `options.device`. Without a usable GPU this
// returns FailedPrecondition saying so (it never crashes); without CUDA in the build,
// Unimplemented.
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(Store& store, int rank,
                                                                     int size,
                                                                     const NcclOptions& options);

}  // namespace shardline::comm
