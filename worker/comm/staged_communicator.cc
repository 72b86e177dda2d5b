#include "worker/comm/staged_communicator.h"

#include "common/status_macros.h"

namespace shardline::comm {

absl::Status StagedCommunicator::In(std::vector<char>& buffer, const void* device, size_t bytes) {
  if (buffer.size() < bytes) buffer.resize(bytes);
  return backend_.ToHost(buffer.data(), device, bytes);
}

absl::Status StagedCommunicator::AllReduce(void* data, size_t count, DType dtype, ReduceOp op) {
  const size_t bytes = count * DTypeSize(dtype);
  RETURN_IF_ERROR(In(send_, data, bytes));
  RETURN_IF_ERROR(host_.AllReduce(send_.data(), count, dtype, op));
  return backend_.ToDevice(data, send_.data(), bytes);
}

absl::Status StagedCommunicator::AllGather(const void* send, void* recv, size_t count,
                                           DType dtype) {
  const size_t bytes = count * DTypeSize(dtype);
  RETURN_IF_ERROR(In(send_, send, bytes));
  recv_.resize(bytes * static_cast<size_t>(size()));
  RETURN_IF_ERROR(host_.AllGather(send_.data(), recv_.data(), count, dtype));
  return backend_.ToDevice(recv, recv_.data(), recv_.size());
}

absl::Status StagedCommunicator::ReduceScatter(const void* send, void* recv, size_t count,
                                               DType dtype, ReduceOp op) {
  const size_t bytes = count * DTypeSize(dtype);
  RETURN_IF_ERROR(In(send_, send, bytes * static_cast<size_t>(size())));
  recv_.resize(bytes);
  RETURN_IF_ERROR(host_.ReduceScatter(send_.data(), recv_.data(), count, dtype, op));
  return backend_.ToDevice(recv, recv_.data(), bytes);
}

absl::Status StagedCommunicator::Broadcast(void* data, size_t count, DType dtype, int root) {
  const size_t bytes = count * DTypeSize(dtype);
  RETURN_IF_ERROR(In(send_, data, bytes));
  RETURN_IF_ERROR(host_.Broadcast(send_.data(), count, dtype, root));
  return backend_.ToDevice(data, send_.data(), bytes);
}

absl::Status StagedCommunicator::Send(const void* data, size_t count, DType dtype, int peer) {
  RETURN_IF_ERROR(In(send_, data, count * DTypeSize(dtype)));
  return host_.Send(send_.data(), count, dtype, peer);
}

absl::Status StagedCommunicator::Recv(void* data, size_t count, DType dtype, int peer) {
  const size_t bytes = count * DTypeSize(dtype);
  recv_.resize(bytes);
  RETURN_IF_ERROR(host_.Recv(recv_.data(), count, dtype, peer));
  return backend_.ToDevice(data, recv_.data(), bytes);
}

absl::Status StagedCommunicator::SendRecv(const void* send, size_t send_count, int send_peer,
                                          void* recv, size_t recv_count, int recv_peer,
                                          DType dtype) {
  RETURN_IF_ERROR(In(send_, send, send_count * DTypeSize(dtype)));
  const size_t bytes = recv_count * DTypeSize(dtype);
  recv_.resize(bytes);
  RETURN_IF_ERROR(host_.SendRecv(send_.data(), send_count, send_peer, recv_.data(), recv_count,
                                 recv_peer, dtype));
  return backend_.ToDevice(recv, recv_.data(), bytes);
}

}  // namespace shardline::comm
