#include "worker/comm/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <spdlog/spdlog.h>

#include <cstring>
#include <string>
#include <thread>

#include "common/status_macros.h"

namespace shardline::comm {
namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kUniqueIdKey = "nccl_id";

std::string CudaError(cudaError_t error) {
  return std::string(cudaGetErrorName(error)) + ": " + cudaGetErrorString(error);
}

std::string NcclError(ncclResult_t result, ncclComm_t comm) {
  std::string message = ncclGetErrorString(result);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') message += std::string(" (") + last + ")";
  return message;
}

// What the caller should do about an NCCL error: fix the call, or rebuild the group.
absl::Status FromNccl(ncclResult_t result, ncclComm_t comm, const std::string& what) {
  const std::string message = what + ": " + NcclError(result, comm);
  switch (result) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(message);
    case ncclRemoteError:  // a peer failed or went away
    case ncclSystemError:  // socket/network failure
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::StatusOr<ncclDataType_t> ToNccl(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return ncclFloat32;
    case DType::kFloat64: return ncclFloat64;
    case DType::kBFloat16: return ncclBfloat16;
    case DType::kFloat16: return ncclFloat16;
    case DType::kInt32: return ncclInt32;
    case DType::kInt64: return ncclInt64;
  }
  return absl::InvalidArgumentError("nccl: unknown dtype " +
                                    std::to_string(static_cast<int>(dtype)));
}

ncclRedOp_t ToNccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  return ncclSum;
}

// Without a driver cudaGetDeviceCount fails ("insufficient driver"); that must be a Status.
absl::Status CheckDevice(int device) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    cudaGetLastError();  // clear it, so that it does not surface from an unrelated CUDA call
    return absl::FailedPreconditionError("no usable CUDA device: cudaGetDeviceCount failed: " +
                                         CudaError(error));
  }
  if (count == 0) {
    return absl::FailedPreconditionError("no usable CUDA device: cudaGetDeviceCount found none");
  }
  if (device < 0 || device >= count) {
    return absl::FailedPreconditionError("no usable CUDA device: device " +
                                         std::to_string(device) + " was asked for, " +
                                         std::to_string(count) + " visible");
  }
  return absl::OkStatus();
}

// Polls between short yields first (small collectives finish in microseconds), then sleeps.
void Backoff(Clock::time_point started) {
  if (Clock::now() - started < std::chrono::milliseconds(1)) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

}  // namespace

bool NcclBuilt() { return true; }

absl::StatusOr<std::string> ExchangeNcclUniqueId(Store& store, int rank,
                                                 std::chrono::milliseconds timeout) {
  if (rank < 0) {
    return absl::InvalidArgumentError("NCCL unique-id exchange: rank " + std::to_string(rank) +
                                      " is negative");
  }
  if (rank == 0) {
    ncclUniqueId id;
    const ncclResult_t result = ncclGetUniqueId(&id);
    if (result != ncclSuccess) {
      return absl::UnavailableError(std::string("NCCL unique-id exchange: ncclGetUniqueId on "
                                                "rank 0 failed: ") +
                                    ncclGetErrorString(result));
    }
    std::string bytes(id.internal, sizeof(id.internal));
    RETURN_IF_ERROR(Annotate(store.Set(kUniqueIdKey, bytes),
                             "NCCL unique-id exchange: rank 0 publishing the id"));
    return bytes;
  }
  absl::StatusOr<std::string> bytes = store.Get(kUniqueIdKey, timeout);
  if (!bytes.ok()) {
    return Annotate(bytes.status(), "NCCL unique-id exchange: rank " + std::to_string(rank) +
                                        " waiting for rank 0's id");
  }
  if (bytes->size() != sizeof(ncclUniqueId)) {
    return absl::InvalidArgumentError(
        "NCCL unique-id exchange: rank " + std::to_string(rank) + " read " +
        std::to_string(bytes->size()) + " bytes under key '" + kUniqueIdKey + "', expected " +
        std::to_string(sizeof(ncclUniqueId)) + " (a different NCCL version, or another writer?)");
  }
  return *std::move(bytes);
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(Store& store, int rank,
                                                                     int size,
                                                                     const NcclOptions& options) {
  const std::string what = "nccl bootstrap of rank " + std::to_string(rank) + " of " +
                           std::to_string(size) + " on device " + std::to_string(options.device);
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(what + ": rank must be in [0, size) and size >= 1");
  }
  if (options.timeout.count() <= 0) {
    return absl::InvalidArgumentError(what + ": timeout must be positive");
  }
  // Before the exchange: a rank without a GPU fails at once instead of after the others' timeout.
  RETURN_IF_ERROR(Annotate(CheckDevice(options.device), what));
  if (cudaError_t error = cudaSetDevice(options.device); error != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(what + ": no usable CUDA device: cudaSetDevice: " +
                                         CudaError(error));
  }

  ASSIGN_OR_RETURN(std::string id_bytes, ExchangeNcclUniqueId(store, rank, options.timeout));
  ncclUniqueId id;
  std::memcpy(id.internal, id_bytes.data(), sizeof(id.internal));

  cudaStream_t stream = nullptr;
  if (cudaError_t error = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      error != cudaSuccess) {
    return absl::InternalError(what + ": cudaStreamCreate: " + CudaError(error));
  }
  void* scratch = nullptr;
  if (cudaError_t error = cudaMalloc(&scratch, sizeof(int32_t)); error != cudaSuccess) {
    cudaStreamDestroy(stream);
    return absl::ResourceExhaustedError(what + ": cudaMalloc of the barrier word: " +
                                        CudaError(error));
  }
  const auto release = [&](ncclComm_t comm) {
    if (comm != nullptr) ncclCommAbort(comm);
    cudaFree(scratch);
    cudaStreamDestroy(stream);
  };

  // Non-blocking init, so that a rank that never shows up costs a timeout, not a hang.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t result = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  if (result != ncclSuccess && result != ncclInProgress) {
    absl::Status status = FromNccl(result, comm, what + ": ncclCommInitRank");
    release(comm);
    return status;
  }
  const auto started = Clock::now();
  for (;;) {
    ncclResult_t state = ncclSuccess;
    result = ncclCommGetAsyncError(comm, &state);
    if (result != ncclSuccess) state = result;
    if (state == ncclSuccess) break;
    if (state != ncclInProgress) {
      absl::Status status = FromNccl(state, comm, what + ": ncclCommInitRank");
      release(comm);
      return status;
    }
    if (Clock::now() - started > options.timeout) {
      release(comm);
      return absl::DeadlineExceededError(what + ": ncclCommInitRank did not finish within " +
                                         std::to_string(options.timeout.count()) +
                                         " ms (are all ranks up?)");
    }
    Backoff(started);
  }
  spdlog::debug("nccl communicator rank {} of {} ready on device {}", rank, size, options.device);
  return std::unique_ptr<Communicator>(std::make_unique<NcclCommunicator>(
      rank, size, options.device, comm, stream, scratch, options.timeout));
}

NcclCommunicator::NcclCommunicator(int rank, int size, int device, ncclComm* comm,
                                   CUstream_st* stream, void* scratch,
                                   std::chrono::milliseconds timeout)
    : rank_(rank),
      size_(size),
      device_(device),
      timeout_(timeout),
      comm_(comm),
      stream_(stream),
      scratch_(scratch) {}

NcclCommunicator::~NcclCommunicator() {
  std::lock_guard<std::mutex> lock(comm_mu_);
  cudaSetDevice(device_);
  if (comm_ != nullptr) {
    // Finalize flushes outstanding work; on a non-blocking communicator it may take a while.
    const ncclResult_t finalize = ncclCommFinalize(comm_);
    bool clean = finalize == ncclSuccess || finalize == ncclInProgress;
    const auto started = Clock::now();
    while (clean) {
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) state = ncclInternalError;
      if (state == ncclSuccess) break;
      if (state != ncclInProgress || Clock::now() - started > timeout_) {
        clean = false;
        break;
      }
      Backoff(started);
    }
    if (clean) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
    comm_ = nullptr;
  }
  cudaFree(scratch_);
  cudaStreamDestroy(stream_);
}

void NcclCommunicator::AbortLocked(const char* why) {
  aborted_.store(true);
  if (comm_ == nullptr) return;
  spdlog::warn("nccl communicator rank {} of {}: aborting ({})", rank_, size_, why);
  ncclCommAbort(comm_);
  comm_ = nullptr;
}

void NcclCommunicator::Abort() {
  aborted_.store(true);
  // A running operation holds comm_mu_ and polls aborted_ every ~100 us, aborts the communicator
  // itself and releases the lock; so this waits at most that long.
  std::lock_guard<std::mutex> lock(comm_mu_);
  AbortLocked("Abort() was called");
}

absl::Status NcclCommunicator::Wait(const std::string& what) {
  const auto started = Clock::now();
  for (;;) {
    ncclResult_t state = ncclSuccess;
    if (ncclResult_t result = ncclCommGetAsyncError(comm_, &state); result != ncclSuccess) {
      state = result;
    }
    if (state != ncclSuccess && state != ncclInProgress) {
      absl::Status status = FromNccl(state, comm_, what);
      AbortLocked("asynchronous NCCL error");
      return status;
    }
    if (state == ncclSuccess) {
      const cudaError_t query = cudaStreamQuery(stream_);
      if (query == cudaSuccess) return absl::OkStatus();
      if (query != cudaErrorNotReady) {
        AbortLocked("CUDA error on the stream");
        return absl::InternalError(what + ": CUDA error on the communicator's stream: " +
                                   CudaError(query));
      }
    }
    if (aborted_.load()) {
      AbortLocked("Abort() was called");
      return absl::AbortedError(what + ": communicator was aborted");
    }
    if (Clock::now() - started > timeout_) {
      AbortLocked("timeout");
      return absl::DeadlineExceededError(what + ": not finished within " +
                                         std::to_string(timeout_.count()) +
                                         " ms; the NCCL communicator was aborted");
    }
    Backoff(started);
  }
}

template <typename Enqueue>
absl::Status NcclCommunicator::Run(std::string_view op, const std::string& what, size_t bytes,
                                   Enqueue&& enqueue) {
  const auto start = Clock::now();
  absl::Status status;
  {
    std::lock_guard<std::mutex> lock(comm_mu_);
    if (aborted_.load() || comm_ == nullptr) {
      AbortLocked("operation after Abort()");
      status = absl::AbortedError(what + ": communicator was aborted");
    } else if (cudaError_t error = cudaSetDevice(device_); error != cudaSuccess) {
      status = absl::FailedPreconditionError(what + ": cudaSetDevice: " + CudaError(error));
    } else {
      const ncclResult_t result = enqueue(comm_);
      if (result != ncclSuccess && result != ncclInProgress) {
        status = FromNccl(result, comm_, what);
      } else {
        status = Wait(what);
      }
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (observer_ != nullptr) observer_->OnOperation(op, bytes, seconds, status.ok());
  return status;
}

absl::Status NcclCommunicator::AllReduce(void* data, size_t count, DType dtype, ReduceOp op) {
  const std::string what = DescribeOperation("all_reduce", count, dtype, rank_, size_);
  ASSIGN_OR_RETURN(ncclDataType_t type, ToNccl(dtype));
  return Run("all_reduce", what, count * DTypeSize(dtype), [&](ncclComm_t comm) {
    return ncclAllReduce(data, data, count, type, ToNccl(op), comm, stream_);
  });
}

absl::Status NcclCommunicator::AllGather(const void* send, void* recv, size_t count,
                                         DType dtype) {
  const std::string what = DescribeOperation("all_gather", count, dtype, rank_, size_);
  ASSIGN_OR_RETURN(ncclDataType_t type, ToNccl(dtype));
  return Run("all_gather", what, count * DTypeSize(dtype), [&](ncclComm_t comm) {
    return ncclAllGather(send, recv, count, type, comm, stream_);
  });
}

absl::Status NcclCommunicator::ReduceScatter(const void* send, void* recv, size_t count,
                                             DType dtype, ReduceOp op) {
  const std::string what = DescribeOperation("reduce_scatter", count, dtype, rank_, size_);
  ASSIGN_OR_RETURN(ncclDataType_t type, ToNccl(dtype));
  return Run("reduce_scatter", what, count * DTypeSize(dtype) * static_cast<size_t>(size_),
             [&](ncclComm_t comm) {
               return ncclReduceScatter(send, recv, count, type, ToNccl(op), comm, stream_);
             });
}

absl::Status NcclCommunicator::Broadcast(void* data, size_t count, DType dtype, int root) {
  const std::string what =
      DescribeOperation("broadcast", count, dtype, rank_, size_) + " from root " + std::to_string(root);
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(what + ": root out of range [0, " + std::to_string(size_) +
                                      ")");
  }
  ASSIGN_OR_RETURN(ncclDataType_t type, ToNccl(dtype));
  return Run("broadcast", what, count * DTypeSize(dtype), [&](ncclComm_t comm) {
    return ncclBroadcast(data, data, count, type, root, comm, stream_);
  });
}

absl::Status NcclCommunicator::Send(const void* data, size_t count, DType dtype, int peer) {
  const std::string what =
      DescribeOperation("send", count, dtype, rank_, size_) + " to rank " + std::to_string(peer);
  if (peer < 0 || peer >= size_ || peer == rank_) {
    return absl::InvalidArgumentError(what + ": peer must be another rank in [0, " +
                                      std::to_string(size_) + ")");
  }
  ASSIGN_OR_RETURN(ncclDataType_t type, ToNccl(dtype));
  return Run("send", what, count * DTypeSize(dtype), [&](ncclComm_t comm) {
    return ncclSend(data, count, type, peer, comm, stream_);
  });
}

absl::Status NcclCommunicator::Recv(void* data, size_t count, DType dtype, int peer) {
  const std::string what =
      DescribeOperation("recv", count, dtype, rank_, size_) + " from rank " + std::to_string(peer);
  if (peer < 0 || peer >= size_ || peer == rank_) {
    return absl::InvalidArgumentError(what + ": peer must be another rank in [0, " +
                                      std::to_string(size_) + ")");
  }
  ASSIGN_OR_RETURN(ncclDataType_t type, ToNccl(dtype));
  return Run("recv", what, count * DTypeSize(dtype), [&](ncclComm_t comm) {
    return ncclRecv(data, count, type, peer, comm, stream_);
  });
}

absl::Status NcclCommunicator::SendRecv(const void* send, size_t send_count, int send_peer,
                                        void* recv, size_t recv_count, int recv_peer,
                                        DType dtype) {
  const std::string what = DescribeOperation("send_recv", send_count, dtype, rank_, size_) + " to rank " +
                           std::to_string(send_peer) + " and " + std::to_string(recv_count) +
                           " from rank " + std::to_string(recv_peer);
  const auto bad_peer = [&](int peer, size_t count) {
    return count > 0 && (peer < 0 || peer >= size_ || peer == rank_);
  };
  if (bad_peer(send_peer, send_count) || bad_peer(recv_peer, recv_count)) {
    return absl::InvalidArgumentError(what + ": peers must be other ranks in [0, " +
                                      std::to_string(size_) + ")");
  }
  ASSIGN_OR_RETURN(ncclDataType_t type, ToNccl(dtype));
  return Run("send_recv", what, (send_count + recv_count) * DTypeSize(dtype),
             [&](ncclComm_t comm) {
               // One group: NCCL starts both together, so neither waits on the other.
               ncclResult_t result = ncclGroupStart();
               if (result != ncclSuccess) return result;
               if (send_count > 0) result = ncclSend(send, send_count, type, send_peer, comm, stream_);
               if (result == ncclSuccess && recv_count > 0) {
                 result = ncclRecv(recv, recv_count, type, recv_peer, comm, stream_);
               }
               const ncclResult_t end = ncclGroupEnd();
               return result != ncclSuccess ? result : end;
             });
}

// NCCL has no barrier: an all-reduce of one word completes on a rank only after every rank
// has entered it.
absl::Status NcclCommunicator::Barrier() {
  const std::string what = "barrier on rank " + std::to_string(rank_) + " of " +
                           std::to_string(size_);
  return Run("barrier", what, 0, [&](ncclComm_t comm) {
    return ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm, stream_);
  });
}

}  // namespace shardline::comm
