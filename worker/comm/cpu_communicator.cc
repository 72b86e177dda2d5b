#include "worker/comm/cpu_communicator.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <utility>

#include <spdlog/spdlog.h>

#include "common/status_macros.h"

namespace shardline::comm {
namespace {

using Clock = std::chrono::steady_clock;

// Ranks of one host, in group order, and where `rank` is among them.
struct HostView {
  std::vector<std::vector<int>> hosts;  // by first appearance in rank order
  int host = 0;                          // the index of `rank`'s host
  int local = 0;                         // `rank`'s index on its host
};

HostView ViewOf(const std::vector<std::string>& ids, int rank) {
  HostView view;
  std::map<std::string, int> index;
  for (int r = 0; r < static_cast<int>(ids.size()); ++r) {
    auto [it, added] = index.emplace(ids[r], static_cast<int>(view.hosts.size()));
    if (added) view.hosts.emplace_back();
    if (r == rank) {
      view.host = it->second;
      view.local = static_cast<int>(view.hosts[it->second].size());
    }
    view.hosts[it->second].push_back(r);
  }
  return view;
}

// The observer of a hierarchical communicator's cross-host Gloo group: it hands that group's
// network bytes to whatever observer the outer communicator has at the time, and drops the
// inner operation itself, which the outer one reports once with its own op and time. So every
// byte the cross-host hop moves is counted under the outer group, also for an operation issued on
// the inner group directly; shared memory inside the host moves no network bytes and reports none.
class NetworkBytesForwarder final : public CommObserver {
 public:
  // `target` is the outer communicator's observer member, read at every call.
  explicit NetworkBytesForwarder(CommObserver* const& target) : target_(target) {}
  void OnOperation(std::string_view, size_t, double, bool) override {}
  void OnNetworkBytes(uint64_t sent, uint64_t received) override {
    if (target_ != nullptr) target_->OnNetworkBytes(sent, received);
  }

 private:
  CommObserver* const& target_;
};

// All-reduce as reduce-scatter inside each host over shared memory, an all-reduce of each shard
// between hosts over Gloo (one Gloo group per local index, so every host link carries 1/L of the
// vector from each rank), and an all-gather inside each host. The other operations are not
// bandwidth-bound in training and go through one Gloo group over all ranks.
class HierarchicalCommunicator final : public Communicator {
 public:
  HierarchicalCommunicator(int rank, int size, std::unique_ptr<Communicator> local,
                           std::unique_ptr<Communicator> cross, std::unique_ptr<Communicator> all)
      : rank_(rank),
        size_(size),
        local_(std::move(local)),
        cross_(std::move(cross)),
        all_(std::move(all)) {
    cross_->set_observer(&cross_observer_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "shm+gloo"; }
  HostSplit host_split() override {
    return HostSplit{.local = local_.get(),
                     .cross = cross_.get(),
                     .host = cross_->rank(),
                     .hosts = cross_->size(),
                     .local_rank = local_->rank(),
                     .local_size = local_->size()};
  }

  absl::Status AllReduce(void* data, size_t count, DType dtype, ReduceOp op) override {
    const size_t esize = DTypeSize(dtype);
    return Timed("all_reduce", count * esize, [&]() -> absl::Status {
      if (dtype == DType::kBFloat16 || dtype == DType::kFloat16) {
        return all_->AllReduce(data, count, dtype, op);  // Gloo's error, naming the dtype
      }
      if (count == 0) return absl::OkStatus();
      const size_t local_size = static_cast<size_t>(local_->size());
      const size_t shard = (count + local_size - 1) / local_size;
      scratch_.assign(shard * local_size * esize, 0);
      shard_.resize(shard * esize);
      std::memcpy(scratch_.data(), data, count * esize);
      // Avg divides once by the whole group, not by each stage's size.
      const ReduceOp stage_op = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
      RETURN_IF_ERROR(local_->ReduceScatter(scratch_.data(), shard_.data(), shard, dtype, stage_op));
      RETURN_IF_ERROR(cross_->AllReduce(shard_.data(), shard, dtype, stage_op));
      if (op == ReduceOp::kAvg) DivideShard(dtype, shard);
      RETURN_IF_ERROR(local_->AllGather(shard_.data(), scratch_.data(), shard, dtype));
      std::memcpy(data, scratch_.data(), count * esize);
      return absl::OkStatus();
    });
  }
  absl::Status AllGather(const void* send, void* recv, size_t count, DType dtype) override {
    PassObserver();
    return all_->AllGather(send, recv, count, dtype);
  }
  absl::Status ReduceScatter(const void* send, void* recv, size_t count, DType dtype,
                             ReduceOp op) override {
    PassObserver();
    return all_->ReduceScatter(send, recv, count, dtype, op);
  }
  absl::Status Broadcast(void* data, size_t count, DType dtype, int root) override {
    PassObserver();
    return all_->Broadcast(data, count, dtype, root);
  }
  absl::Status Send(const void* data, size_t count, DType dtype, int peer) override {
    PassObserver();
    return all_->Send(data, count, dtype, peer);
  }
  absl::Status Recv(void* data, size_t count, DType dtype, int peer) override {
    PassObserver();
    return all_->Recv(data, count, dtype, peer);
  }
  absl::Status SendRecv(const void* send, size_t send_count, int send_peer, void* recv,
                        size_t recv_count, int recv_peer, DType dtype) override {
    PassObserver();
    return all_->SendRecv(send, send_count, send_peer, recv, recv_count, recv_peer, dtype);
  }
  absl::Status Barrier() override {
    PassObserver();
    return all_->Barrier();
  }
  void Abort() override {
    local_->Abort();
    cross_->Abort();
    all_->Abort();
  }

 private:
  // The delegated operations report through the Gloo group's observer: ours, whatever it is now.
  void PassObserver() { all_->set_observer(observer_); }

  template <typename Body>
  absl::Status Timed(std::string_view op, size_t bytes, Body&& body) {
    const auto start = Clock::now();
    const absl::Status status = body();
    if (observer_ != nullptr) {
      observer_->OnOperation(op, bytes,
                             std::chrono::duration<double>(Clock::now() - start).count(),
                             status.ok());
    }
    return status;
  }

  void DivideShard(DType dtype, size_t count) {
    auto divide = [&](auto* values) {
      using T = std::remove_pointer_t<decltype(values)>;
      for (size_t i = 0; i < count; ++i) values[i] = static_cast<T>(values[i] / static_cast<T>(size_));
    };
    switch (dtype) {
      case DType::kFloat32: divide(reinterpret_cast<float*>(shard_.data())); break;
      case DType::kFloat64: divide(reinterpret_cast<double*>(shard_.data())); break;
      case DType::kInt32: divide(reinterpret_cast<int32_t*>(shard_.data())); break;
      case DType::kInt64: divide(reinterpret_cast<int64_t*>(shard_.data())); break;
      case DType::kBFloat16:
      case DType::kFloat16: break;  // refused above
    }
  }

  const int rank_;
  const int size_;
  std::unique_ptr<Communicator> local_, cross_, all_;
  NetworkBytesForwarder cross_observer_{observer_};
  std::vector<char> scratch_, shard_;
};

}  // namespace

std::string_view CpuTransportName(CpuTransport transport) {
  switch (transport) {
    case CpuTransport::kShm: return "shm";
    case CpuTransport::kHierarchical: return "shm+gloo";
    case CpuTransport::kGloo: return "gloo";
  }
  return "?";
}

CpuTransport ChooseCpuTransport(const std::vector<std::string>& hosts) {
  const HostView view = ViewOf(hosts, 0);
  if (view.hosts.size() <= 1) return CpuTransport::kShm;
  const size_t per_host = view.hosts.front().size();
  if (per_host < 2) return CpuTransport::kGloo;
  for (const auto& host : view.hosts) {
    if (host.size() != per_host) return CpuTransport::kGloo;
  }
  return CpuTransport::kHierarchical;
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateCpuCommunicator(
    Store& store, int rank, int size, const CpuCommOptions& options) {
  const std::string what = "cpu bootstrap of rank " + std::to_string(rank) + " of " +
                           std::to_string(size);
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(what + ": rank must be in [0, size)");
  }
  const std::string me = options.host_id.empty() ? LocalHostIdentity() : options.host_id;
  RETURN_IF_ERROR(Annotate(store.Set("host/" + std::to_string(rank), me), what));
  std::vector<std::string> hosts(size);
  for (int r = 0; r < size; ++r) {
    auto host = store.Get("host/" + std::to_string(r), options.gloo.timeout);
    if (!host.ok()) {
      return Annotate(host.status(),
                      what + ": waiting for rank " + std::to_string(r) + " to publish its host");
    }
    hosts[r] = std::move(*host);
  }
  const CpuTransport transport = ChooseCpuTransport(hosts);
  spdlog::debug("{}: {} ranks, transport {}", what, size, CpuTransportName(transport));
  switch (transport) {
    case CpuTransport::kShm:
      return CreateShmCommunicator(store, rank, size, options.shm);
    case CpuTransport::kGloo:
      return CreateGlooCommunicator(store, rank, size, options.gloo);
    case CpuTransport::kHierarchical:
      break;
  }
  const HostView view = ViewOf(hosts, rank);
  const auto& mine = view.hosts[view.host];
  PrefixStore local_store("local/" + std::to_string(view.host), store);
  ASSIGN_OR_RETURN(auto local, CreateShmCommunicator(local_store, view.local,
                                                     static_cast<int>(mine.size()), options.shm));
  PrefixStore cross_store("cross/" + std::to_string(view.local), store);
  ASSIGN_OR_RETURN(auto cross, CreateGlooCommunicator(cross_store, view.host,
                                                      static_cast<int>(view.hosts.size()),
                                                      options.gloo));
  PrefixStore all_store("all", store);
  ASSIGN_OR_RETURN(auto all, CreateGlooCommunicator(all_store, rank, size, options.gloo));
  return std::unique_ptr<Communicator>(std::make_unique<HierarchicalCommunicator>(
      rank, size, std::move(local), std::move(cross), std::move(all)));
}

}  // namespace shardline::comm
