// A host communicator (shm, gloo) for buffers in a device backend's memory: each operation copies
// its input to host memory, runs the host collective, and copies the result back. It is what two
// ranks on one GPU use (NCCL refuses two ranks on one device), and a GPU host without NCCL; every
// byte crosses the host link twice per operation, so NCCL is the way wherever it runs.
//
// Threading as every communicator's: one thread issues operations (the staging buffers are this
// object's); Abort may come from any thread.
#pragma once

#include <string_view>
#include <vector>

#include "kernels/backend.h"
#include "worker/comm/communicator.h"

namespace shardline::comm {

class StagedCommunicator final : public Communicator {
 public:
  // `host` and `backend` must outlive this.
  StagedCommunicator(Communicator& host, kernels::Backend& backend)
      : host_(host), backend_(backend) {}

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  std::string_view backend() const override { return host_.backend(); }
  bool device_buffers() const override { return true; }

  absl::Status AllReduce(void* data, size_t count, DType dtype, ReduceOp op) override;
  absl::Status AllGather(const void* send, void* recv, size_t count, DType dtype) override;
  absl::Status ReduceScatter(const void* send, void* recv, size_t count, DType dtype,
                             ReduceOp op) override;
  absl::Status Broadcast(void* data, size_t count, DType dtype, int root) override;
  absl::Status Send(const void* data, size_t count, DType dtype, int peer) override;
  absl::Status Recv(void* data, size_t count, DType dtype, int peer) override;
  absl::Status SendRecv(const void* send, size_t send_count, int send_peer, void* recv,
                        size_t recv_count, int recv_peer, DType dtype) override;
  absl::Status Barrier() override { return host_.Barrier(); }
  void Abort() override { host_.Abort(); }

 private:
  // `bytes` of device memory at `device` into the host buffer `buffer` (grown as needed).
  absl::Status In(std::vector<char>& buffer, const void* device, size_t bytes);

  Communicator& host_;
  kernels::Backend& backend_;
  std::vector<char> send_, recv_;
};

}  // namespace shardline::comm
