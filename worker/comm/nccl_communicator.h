// The NCCL backend: GPU collectives on one CUDA device per rank. Buffers are device memory on
// that device. Built only with CUDA (SHARDLINE_WITH_NCCL); otherwise the factory functions in
// communicator.h return Unimplemented.
//
// Every operation is enqueued on the communicator's own stream and then waited for by polling
// (cudaStreamQuery + ncclCommGetAsyncError) until the timeout: a hung peer gives DeadlineExceeded
// and the communicator is aborted (ncclCommAbort), never a thread blocked forever in CUDA.
#pragma once

#include <atomic>
#include <chrono>
#include <mutex>

#include "worker/comm/communicator.h"

struct ncclComm;
struct CUstream_st;

namespace shardline::comm {

class NcclCommunicator final : public Communicator {
 public:
  // Use CreateNcclCommunicator. Takes ownership of an initialised `comm` and `stream`, and of
  // `scratch`, 4 bytes of device memory for Barrier().
  NcclCommunicator(int rank, int size, int device, ncclComm* comm, CUstream_st* stream,
                   void* scratch, std::chrono::milliseconds timeout);
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "nccl"; }
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
  absl::Status Barrier() override;
  // Aborts the NCCL communicator now if no operation runs; otherwise the running operation's
  // wait loop sees the flag within a millisecond and aborts it from the issuing thread (NCCL
  // frees the communicator in ncclCommAbort, so no other thread may be using it then).
  void Abort() override;

 private:
  // Enqueues with `enqueue` (returning an ncclResult_t as int), waits, reports to the observer.
  template <typename Enqueue>
  absl::Status Run(std::string_view op, const std::string& what, size_t bytes, Enqueue&& enqueue);
  absl::Status Wait(const std::string& what);
  void AbortLocked(const char* why);  // requires comm_mu_

  const int rank_;
  const int size_;
  const int device_;
  const std::chrono::milliseconds timeout_;
  std::mutex comm_mu_;       // held by an operation for its whole duration, and by AbortLocked
  ncclComm* comm_;           // guarded by comm_mu_; null once aborted
  CUstream_st* stream_;
  void* scratch_;
  std::atomic<bool> aborted_{false};
};

}  // namespace shardline::comm
